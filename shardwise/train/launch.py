"""Start the workers through torch's elastic launcher (the machinery behind ``torchrun``).

Example:
    >>> metrics = launch(TrainConfig(steps=20), nproc_per_node=2)     # doctest: +SKIP
"""

from __future__ import annotations

import uuid
from typing import Optional

from .config import TrainConfig
from .worker import run_worker

__all__ = ["launch", "describe_failure"]


def launch(cfg: TrainConfig, nproc_per_node: int = 2, nnodes: str = "1", rdzv_endpoint: Optional[str] = None,
           rdzv_id: Optional[str] = None, max_restarts: int = 0, node_rank: Optional[int] = None) -> Optional[dict]:
    """Run :func:`~shardwise.train.worker.run_worker` on ``nproc_per_node`` local processes.

    ``nnodes`` is ``"N"`` or ``"MIN:MAX"``; with more than one node every machine runs the same command
    with the same ``rdzv_endpoint`` (host:port of one of them) and ``rdzv_id``. Returns rank 0's
    metrics when rank 0 ran here.
    """
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if not isinstance(nproc_per_node, int) or nproc_per_node < 1:
        raise ValueError(f"--nproc-per-node={nproc_per_node!r} must be a positive int")
    if max_restarts < 0:
        raise ValueError(f"--max-restarts={max_restarts} must be >= 0")
    lo, _, hi = str(nnodes).partition(":")
    try:
        min_nodes, max_nodes = int(lo), int(hi or lo)
    except ValueError:
        raise ValueError(f"--nnodes={nnodes!r} must be N or MIN:MAX (e.g. 2 or 1:4)") from None
    if not 1 <= min_nodes <= max_nodes:
        raise ValueError(f"--nnodes={nnodes!r}: need 1 <= MIN <= MAX")
    if max_nodes > 1 and not rdzv_endpoint:
        raise ValueError(f"--nnodes={nnodes} needs --rdzv-endpoint HOST:PORT (the same on every machine)")
    if node_rank is not None and not 0 <= node_rank < max_nodes:
        # rendezvous would wait for a machine rank that can never complete the group
        raise ValueError(f"--node-rank={node_rank} must be in [0, {max_nodes}) for --nnodes={nnodes}; "
                         f"give each machine its own rank or leave --node-rank out")
    single = max_nodes == 1 and not rdzv_endpoint
    lc = LaunchConfig(
        min_nodes=min_nodes, max_nodes=max_nodes, nproc_per_node=nproc_per_node,
        run_id=rdzv_id or (uuid.uuid4().hex if single else "shardwise"),
        rdzv_backend="c10d", rdzv_endpoint=rdzv_endpoint or "localhost:0",
        rdzv_configs={"rank": node_rank} if node_rank is not None else {},
        max_restarts=max_restarts, monitor_interval=0.5, start_method="spawn")
    results = elastic_launch(lc, run_worker)(cfg.to_json())
    return results.get(0) if results else None


def _cause(failure) -> str:
    """What ended one worker, from the launcher's record of it."""
    if failure.exitcode < 0:
        return f"was killed by {failure.signal_name()} (signal {-failure.exitcode})"
    msg = failure.message
    if isinstance(msg, dict) and msg.get("message"):
        # a worker that raised left an error file: {"message": "ValueError: ...", "extraInfo": {...}}
        return f"raised {str(msg['message']).strip().splitlines()[0]} (exit code {failure.exitcode})"
    return f"exited with code {failure.exitcode} without a Python error (killed, out of memory, or os._exit)"


def describe_failure(err, cfg: TrainConfig, max_restarts: int = 0) -> str:
    """The console's account of a failed job: each failed rank with its exit cause, then how to go on.

    ``err`` is the launcher's ``ChildFailedError`` (``failures``: global rank -> ProcessFailure).

    Example:
        >>> from types import SimpleNamespace as NS      # the fields of the launcher's record
        >>> err = NS(failures={1: NS(local_rank=1, pid=4242, exitcode=17, message={})})
        >>> print(describe_failure(err, TrainConfig(out="no-such-run", checkpoint_every=0)))
        shardwise train: the job failed:
          rank 1 (local rank 1, pid 4242) exited with code 17 without a Python error (killed, out of memory, or os._exit)
          (each rank's own traceback, if it had one, is printed above)
        No checkpoints were written (--checkpoint-every 0): ...
    """
    from .checkpoint import latest

    tried = f" after {max_restarts} restart{'s' if max_restarts != 1 else ''}" if max_restarts else ""
    lines = [f"shardwise train: the job failed{tried}:"]
    for rank, f in sorted(err.failures.items()):
        lines.append(f"  rank {rank} (local rank {f.local_rank}, pid {f.pid}) {_cause(f)}")
    lines.append("  (each rank's own traceback, if it had one, is printed above)")
    last = latest(cfg.checkpoint_path)
    if last is not None:
        lines.append(f"To continue from the last committed checkpoint ({last.name} in {cfg.checkpoint_path}), run the "
                     f"same command with --resume (the number of processes may change); --max-restarts N lets "
                     f"the launcher restart by itself.")
    elif cfg.checkpoint_every:
        lines.append(f"No checkpoint was committed before the failure (every {cfg.checkpoint_every} steps): rerun "
                     f"the command to start over; --max-restarts N lets the launcher restart by itself.")
    else:
        lines.append("No checkpoints were written (--checkpoint-every 0): rerun the command to start over, with "
                     "--checkpoint-every K to be able to --resume next time.")
    return "\n".join(lines)
