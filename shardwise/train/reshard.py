"""The job's live reshard: the module's measured load -> ``propose_rebalance`` -> ``reshard``.

Example:
    >>> stats = sharded.load_stats(reset=True)                                     # doctest: +SKIP
    >>> result = live_reshard(sharded, stats, plan, max_bytes_moved=2**30)         # doctest: +SKIP
    >>> result.status, result.plan == current_plan(sharded)                        # doctest: +SKIP
    ('applied', True)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..embedding import propose_rebalance, reshard

__all__ = ["ReshardResult", "live_reshard"]


@dataclass
class ReshardResult:
    """``status``: ``applied``, ``no-change`` (the proposal kept the plan) or ``failed`` (the reshard
    API refused, on every rank, before changing anything). ``plan`` is the plan in force afterwards."""

    status: str
    plan: dict
    changes: dict = field(default_factory=dict)
    reason: str = ""
    stats: dict = field(default_factory=dict)


def live_reshard(sharded, load_stats, plan: dict, max_bytes_moved: int,
                 max_bytes_per_rank: Optional[int] = None) -> ReshardResult:
    """Collective: propose a rebalance from ``load_stats`` (``sharded.load_stats()``, identical on
    every rank) and apply it to ``sharded`` in place.

    ``max_bytes_moved`` bounds the weights and optimizer state that may cross the wire;
    ``max_bytes_per_rank`` is handed to :func:`~shardwise.embedding.reshard`, which refuses a layout
    over it (the result is then ``failed`` and the module is unchanged).
    """
    changes = dict(propose_rebalance(load_stats, max_bytes_moved))
    if not changes:
        return ReshardResult("no-change", plan, reason="the measured load cannot be lowered by moving tables")
    try:
        out = reshard(sharded, changes, max_bytes_per_rank=max_bytes_per_rank)
    except (ValueError, TypeError) as e:
        # reshard() raises the same error on every rank before changing anything: train on, unchanged
        return ReshardResult("failed", plan, reason=f"{type(e).__name__}: {e}")
    stats = {"tables_moved": list(out.tables_moved), "bytes_sent": list(out.bytes_sent),
             "bytes_received": list(out.bytes_received), "wall_time_s": out.wall_time_s}
    return ReshardResult("applied", {**plan, **changes}, changes, stats=stats)
