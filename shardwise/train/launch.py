"""Start the workers through torch's elastic launcher (the machinery behind ``torchrun``).

Example:
    >>> metrics = launch(TrainConfig(steps=20), nproc_per_node=2)     # doctest: +SKIP
"""

from __future__ import annotations

import uuid
from typing import Optional

from .config import TrainConfig
from .worker import run_worker

__all__ = ["launch"]


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
