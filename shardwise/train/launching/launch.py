"""Start the workers through torch's elastic launcher (the machinery behind ``torchrun``).

Example:
    >>> metrics = launch(TrainConfig(steps=20), nproc_per_node=2)     # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from pathlib import Path
from typing import Optional

from ..config import TrainConfig
from ..worker import run_worker

__all__ = ["launch", "describe_failure", "quiet_launcher_errors"]

# the launcher's own error log repeats every failed worker's whole traceback, prefixed per line, and
# spawn logs each sibling it stops; the job's failure summary (describe_failure) says who failed and
# why in a few lines instead
_LAUNCHER_LOGGER = "torch.distributed.elastic.multiprocessing.api"
_SPAWN_LOGGER = "torch.multiprocessing.spawn"


@contextlib.contextmanager
def quiet_launcher_errors():
    """While open: the elastic launcher's per-worker traceback log is off (its logger's level raised),
    restored on exit, so a caller's logging is left as it was.

    Example:
        >>> log = logging.getLogger(_LAUNCHER_LOGGER); before = log.level
        >>> with quiet_launcher_errors():
        ...     log.isEnabledFor(logging.ERROR)
        False
        >>> log.level == before
        True
    """
    logs = [logging.getLogger(name) for name in (_LAUNCHER_LOGGER, _SPAWN_LOGGER)]
    before = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for log, level in zip(logs, before):
            log.setLevel(level)


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
    with quiet_launcher_errors():
        results = elastic_launch(lc, run_worker)(cfg.to_json())
    return results.get(0) if results else None


def _message(failure) -> str:
    msg = failure.message
    return str(msg["message"]).strip() if isinstance(msg, dict) and msg.get("message") else ""


def _cause(failure) -> str:
    """What ended one worker, from the launcher's record of it."""
    if failure.exitcode < 0:
        return f"was killed by {failure.signal_name()} (signal {-failure.exitcode})"
    msg = _message(failure)
    if msg:
        # a worker that raised left an error file: {"message": "ValueError: ...", "extraInfo": {...}}
        return f"raised {msg.splitlines()[0]} (exit code {failure.exitcode})"
    return f"exited with code {failure.exitcode} without a Python error (killed, out of memory, or os._exit)"


def _save_tracebacks(err, cfg: TrainConfig) -> Optional[str]:
    """Each failed rank's traceback into ``OUT/failure.txt`` (the console shows one line per rank)."""
    parts = []
    for rank, f in sorted(err.failures.items()):
        msg = f.message if isinstance(f.message, dict) else {}
        stack = (msg.get("extraInfo") or {}).get("py_callstack") or _message(f)
        if stack:
            parts.append(f"== rank {rank} (pid {f.pid}) ==\n{stack}\n")
    if not parts:
        return None
    try:
        path = Path(cfg.out) / "failure.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(parts))
        return str(path)
    except OSError:
        return None


def _way_on(err, cfg: TrainConfig) -> str:
    """How to go on. An input error comes back on --resume (the same line, the same setting): say
    what to change instead."""
    from ..checkpoint import latest

    msgs = [_message(f) for f in err.failures.values()]
    if any("--skip-bad-lines" in m for m in msgs):
        return ("The input holds a malformed line (above): fix or drop it, or rerun with --skip-bad-lines to skip "
                "and count such lines. --resume alone would read the same line again.")
    last = latest(cfg.checkpoint_path)
    if last is not None:
        return (f"To continue from the last committed checkpoint ({last.name} in {cfg.checkpoint_path}), run the "
                f"same command with --resume (the number of processes may change); --max-restarts N lets "
                f"the launcher restart by itself.")
    if cfg.checkpoint_every:
        return (f"No checkpoint was committed before the failure (every {cfg.checkpoint_every} steps): rerun "
                f"the command to start over; --max-restarts N lets the launcher restart by itself.")
    return ("No checkpoints were written (--checkpoint-every 0): rerun the command to start over, with "
            "--checkpoint-every K to be able to --resume next time.")


def describe_failure(err, cfg: TrainConfig, max_restarts: int = 0) -> str:
    """The console's account of a failed job: each failed rank with its exit cause (one line; the
    tracebacks go to ``OUT/failure.txt``), then how to go on.

    ``err`` is the launcher's ``ChildFailedError`` (``failures``: global rank -> ProcessFailure).

    Example:
        >>> from types import SimpleNamespace as NS      # the fields of the launcher's record
        >>> err = NS(failures={1: NS(local_rank=1, pid=4242, exitcode=17, message={})})
        >>> print(describe_failure(err, TrainConfig(out="no-such-run", checkpoint_every=0)))
        shardwise train: the job failed:
          rank 1 (local rank 1, pid 4242) exited with code 17 without a Python error (killed, out of memory, or os._exit)
        No checkpoints were written (--checkpoint-every 0): ...
    """
    tried = f" after {max_restarts} restart{'s' if max_restarts != 1 else ''}" if max_restarts else ""
    lines = [f"shardwise train: the job failed{tried}:"]
    causes = {}
    for rank, f in sorted(err.failures.items()):
        causes.setdefault(_cause(f), []).append((rank, f))
    for cause, group in causes.items():
        who = ", ".join(f"rank {r} (local rank {f.local_rank}, pid {f.pid})" for r, f in group)
        lines.append(f"  {who} {cause}")
    saved = _save_tracebacks(err, cfg)
    if saved:
        lines.append(f"  (every failed rank's traceback: {saved})")
    lines.append(_way_on(err, cfg))
    return "\n".join(lines)
