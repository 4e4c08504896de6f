"""Adapter to the live-resharding API (``shardwise.embedding.reshard`` / ``propose_rebalance``).

That API is built separately; when this install lacks it, :func:`live_reshard` says so and changes
nothing (a reshard is never pretended).

Example:
    >>> result = live_reshard(sharded, plan, load_stats, max_bytes=2**30)   # doctest: +SKIP
    >>> result.status                                                       # doctest: +SKIP
    'applied'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["ReshardResult", "live_reshard", "unavailable_reason"]


@dataclass
class ReshardResult:
    """``status``: ``applied``, ``no-change`` (the proposal kept the plan) or ``unavailable``."""

    status: str
    module: Any
    plan: dict
    changes: dict = field(default_factory=dict)
    reason: str = ""


def unavailable_reason() -> Optional[str]:
    """None when the reshard API is importable, else why not."""
    try:
        from ..embedding import propose_rebalance, reshard   # noqa: F401
    except ImportError as e:
        return (f"live resharding is unavailable in this install: shardwise.embedding has no "
                f"reshard/propose_rebalance ({e})")
    return None


def live_reshard(sharded, plan: dict, load_stats, max_bytes: int) -> ReshardResult:
    """Collective: propose a rebalance from measured load and apply it. Every input must be the same
    on all ranks (the load stats are all-reduced before this is called)."""
    reason = unavailable_reason()
    if reason is not None:
        return ReshardResult("unavailable", sharded, plan, reason=reason)
    from ..embedding import propose_rebalance, reshard

    # the module's own counters, when it keeps them, are the authoritative measurement
    stats = sharded.load_stats() if hasattr(sharded, "load_stats") else load_stats
    changes = propose_rebalance(stats, max_bytes)
    changes = dict(getattr(changes, "changes", changes) or {})
    if not changes:
        return ReshardResult("no-change", sharded, plan)
    out = reshard(sharded, changes)
    module = out if out is not None and hasattr(out, "boxes") else sharded
    return ReshardResult("applied", module, {**plan, **changes}, changes)
