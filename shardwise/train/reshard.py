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

import torch
import torch.distributed as dist

__all__ = ["ReshardResult", "live_reshard", "unavailable_reason", "counter_snapshot", "counter_restore"]


@dataclass
class ReshardResult:
    """``status``: ``applied``, ``no-change`` (the proposal kept the plan), ``failed`` (the API refused,
    nothing changed) or ``unavailable``."""

    status: str
    module: Any
    plan: dict
    changes: dict = field(default_factory=dict)
    reason: str = ""
    stats: dict = field(default_factory=dict)


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

    try:
        changes = propose_rebalance(_module_stats(sharded, load_stats), max_bytes)
        changes = dict(getattr(changes, "changes", changes) or {})
        if not changes:
            return ReshardResult("no-change", sharded, plan)
        out = reshard(sharded, changes)
    except (ValueError, TypeError) as e:
        # the API raises the same error on every rank before changing anything: train on, unchanged
        return ReshardResult("failed", sharded, plan, reason=f"{type(e).__name__}: {e}")
    # reshard() works in place and returns its statistics; a module back means it built a new one
    module = out if out is not None and hasattr(out, "boxes") else sharded
    stats = {k: getattr(out, k) for k in ("tables_moved", "bytes_sent", "bytes_received", "wall_time_s")
             if hasattr(out, k)}
    return ReshardResult("applied", module, {**plan, **changes}, changes, stats=stats)


def _module_stats(sharded, measured):
    """The module's own lookup counters when it keeps them (the authoritative measurement), else ours."""
    if hasattr(sharded, "load_stats"):
        return sharded.load_stats()
    if hasattr(sharded, "_lookup_counter"):
        from ..embedding.reshard import load_stats

        return load_stats(sharded)
    return measured


def counter_snapshot(sharded) -> Optional[dict]:
    """Collective: every rank's lookup counts so far (the module's own counter, when it keeps one), so a
    resumed run proposes the same rebalance as an uninterrupted one. None without a counter."""
    counter = getattr(sharded, "_lookup_counter", None)
    if counter is None or not dist.is_initialized():
        return None
    local = torch.cat(list(counter.hist)) if counter.hist else torch.zeros(0, dtype=torch.int64, device=counter.device)
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local.contiguous())
    return {"hist": [g.cpu().tolist() for g in gathered], "steps": int(counter.steps),
            "buckets": list(counter.buckets)}


def counter_restore(sharded, snap: Optional[dict]) -> bool:
    """Put this rank's saved counts back (same tables and world size only); False when not possible."""
    counter = getattr(sharded, "_lookup_counter", None)
    if counter is None or not snap or snap["buckets"] != list(counter.buckets) \
            or len(snap["hist"]) != dist.get_world_size():
        return False
    mine = torch.tensor(snap["hist"][dist.get_rank()], dtype=torch.int64, device=counter.device)
    counter.hist = [h.clone() for h in mine.split(list(counter.buckets))]
    counter.steps = snap["steps"]
    return True
