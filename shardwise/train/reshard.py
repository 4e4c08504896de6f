"""The job's live reshard: the module's measured load -> ``propose_rebalance`` -> ``reshard``.

Example:
    >>> import torch; from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig, current_plan, shard, row_wise
    >>> from shardwise.sparse import KeyedJaggedTensor
    >>> sharded = shard(EmbeddingBagCollection([EmbeddingBagConfig(100, 4, "t0", feature_names=["f"])]), {"t0": row_wise()})
    >>> _ = sharded(KeyedJaggedTensor(["f"], torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 1])))
    >>> stats = sharded.load_stats(reset=True)
    >>> result = live_reshard(sharded, stats, current_plan(sharded), max_bytes_moved=2**30)
    >>> result.status, result.plan == current_plan(sharded)      # ('applied', True) when ranks are unevenly loaded
    ('no-change', True)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..embedding import propose_rebalance, reshard

__all__ = ["ReshardResult", "live_reshard", "fit_memory"]


@dataclass
class ReshardResult:
    """``status``: ``applied``, ``no-change`` (the proposal kept the plan) or ``failed`` (the reshard
    API refused, on every rank, before changing anything). ``plan`` is the plan in force afterwards."""

    status: str
    plan: dict
    changes: dict = field(default_factory=dict)
    reason: str = ""
    stats: dict = field(default_factory=dict)


def live_reshard(sharded, load_stats, plan: dict, max_bytes_moved: int, max_bytes_per_rank: Optional[int] = None,
                 planner=None, tables=None) -> ReshardResult:
    """Collective: propose a rebalance from ``load_stats`` (``sharded.load_stats()``, identical on
    every rank) and apply it to ``sharded`` in place.

    ``max_bytes_moved`` bounds the weights and optimizer state that may cross the wire. With a
    ``planner`` (and the collection's ``tables``) the proposal is first cut down to what fits the
    planner's memory per rank (:func:`fit_memory`). ``max_bytes_per_rank`` is handed to
    :func:`~shardwise.embedding.reshard`, which refuses a layout over it (the result is then
    ``failed`` and the module is unchanged).
    """
    changes = dict(propose_rebalance(load_stats, max_bytes_moved))
    if not changes:
        return ReshardResult("no-change", plan, reason="the measured load cannot be lowered by moving tables")
    note = ""
    if planner is not None:
        changes, note = fit_memory(changes, plan, load_stats, planner, tables)
        if not changes:
            return ReshardResult("no-change", plan, reason=note)
    try:
        out = reshard(sharded, changes, max_bytes_per_rank=max_bytes_per_rank)
    except (ValueError, TypeError) as e:
        # reshard() raises the same error on every rank before changing anything: train on, unchanged
        return ReshardResult("failed", plan, reason=f"{type(e).__name__}: {e}")
    stats = {"tables_moved": list(out.tables_moved), "bytes_sent": list(out.bytes_sent),
             "bytes_received": list(out.bytes_received), "wall_time_s": out.wall_time_s}
    return ReshardResult("applied", {**plan, **changes}, changes, reason=note, stats=stats)


def _predicted_load(stats, plan: dict, est) -> list:
    """Per-rank measured load ``stats`` would give under ``plan`` (its boxes from the planner's estimate)."""
    out = [0.0] * stats.world_size
    for t in stats.tables:
        boxes = [b for b, _, _ in est.shards[t.name]]
        for r, x in enumerate(t.rank_load(boxes, plan[t.name].sharding_type, stats.world_size)):
            out[r] += x
    return out


def fit_memory(changes: dict, plan: dict, stats, planner, tables) -> tuple[dict, str]:
    """The part of a proposal that keeps every rank within ``planner.memory`` (weights + optimizer
    state per rank) and lowers the predicted maximum measured load the most; ``({}, reason)`` when
    nothing does. The proposal's moves are greedy and ordered, so every prefix is a candidate, and so
    is the proposal without the moves that break the budget. Pure: the same on every rank."""
    order = list(changes)
    subsets, skipping = [order[:k] for k in range(len(order), 0, -1)], []
    for n in order:   # the moves in order, each kept only if the layout so far still fits
        if _fits(planner.estimate({**plan, **{m: changes[m] for m in skipping + [n]}}, tables), planner):
            skipping.append(n)
    subsets.append(skipping)
    now = max(stats.per_rank())
    best, over = None, None
    for names in subsets:
        cand = {**plan, **{n: changes[n] for n in names}}
        est = planner.estimate(cand, tables)
        if not _fits(est, planner):
            over = over or _overflow(est, planner)
            continue
        if not names:
            continue
        peak = max(_predicted_load(stats, cand, est))
        if peak < now * (1 - 1e-9) and (best is None or peak < best[0]):
            best = (peak, names)
    if best is None:
        return {}, f"every proposed move would exceed the memory budget ({over}; --memory-per-rank-mb)" if over \
            else "no move within the memory budget lowers the measured load"
    kept = {n: changes[n] for n in best[1]}
    left = [n for n in order if n not in kept]
    return kept, (f"{len(left)} of {len(order)} proposed moves left out to stay within the memory budget "
                  f"({over}): {', '.join(left)}" if left else "")


def _fits(est, planner) -> bool:
    return all(m <= cap for m, cap in zip(est.memory, planner.memory))


def _overflow(est, planner) -> str:
    r = max(range(len(est.memory)), key=lambda i: est.memory[i] - planner.memory[i])
    return f"rank {r} would hold {_size(est.memory[r])} of {_size(planner.memory[r])}"


def _size(n: float) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{int(n):,} bytes"
