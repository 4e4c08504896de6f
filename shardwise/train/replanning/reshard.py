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

from ...embedding import ShardingType, propose_rebalance, reshard

__all__ = ["ReshardResult", "live_reshard", "fit_memory", "measured_ids_per_bag", "predicted_load", "predicted_after",
           "propose_changes"]


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
    ``planner`` (and the collection's ``tables``) the proposal uses only the planner's sharding
    types, is cut down to what fits the planner's memory per rank, and is applied only if the
    planner's estimated step time (slowest rank) improves (:func:`fit_memory`); give the planner
    the measured ids per bag (:func:`measured_ids_per_bag`) so its estimate sees the load the
    decision is about. ``max_bytes_per_rank`` is handed to :func:`~shardwise.embedding.reshard`,
    which refuses a layout over it (the result is then ``failed`` and the module is unchanged).
    Every input is the same on every rank, so every rank decides alike; nothing measured in time
    (step times) enters the decision.
    """
    changes, note = propose_changes(load_stats, plan, max_bytes_moved, planner, tables)
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


def propose_changes(load_stats, plan: dict, max_bytes_moved: int, planner=None, tables=None) -> tuple[dict, str]:
    """Pure: ``(changes, note)``, the decision :func:`live_reshard` applies; ``({}, why)`` when it keeps
    the plan. Only the planner's sharding types (all of :func:`~shardwise.embedding.propose_rebalance`'s
    without a planner); within the planner's memory per rank; only if the planner's estimate improves.

    Example (one rank: nothing to move):
        >>> from shardwise.embedding.reshard import LoadStats
        >>> propose_changes(LoadStats(1, 1, ()), {}, 1 << 20)
        ({}, 'the measured load cannot be lowered by moving tables')
    """
    if planner is None:
        changes = dict(propose_rebalance(load_stats, max_bytes_moved))
        return (changes, "") if changes else ({}, "the measured load cannot be lowered by moving tables")
    # as the planner does: every allowed type, then table-wise alone and with each other type; a family
    # that cannot lower the estimate (e.g. replicating a big table costs an all-reduce of its gradients
    # every step) does not hide a smaller one that can
    best, notes = None, []
    for types in _families(planner.types):
        changes = dict(propose_rebalance(load_stats, max_bytes_moved, sharding_types=types))
        if not changes:
            continue
        kept, note = fit_memory(changes, plan, load_stats, planner, tables)
        if not kept:
            notes.append(note)
            continue
        new = {**plan, **kept}
        est = planner.estimate(new, tables)
        key = (max(predicted_load(load_stats, new, est)), max(est.cost))
        if best is None or key < best[0]:
            best = (key, kept, note)
    if best is not None:
        return best[1], best[2]
    allowed = ", ".join(t.value for t in planner.types)
    return {}, notes[0] if notes else f"the measured load cannot be lowered by moving tables within the allowed " \
                                      f"sharding types ({allowed})"


def _families(types) -> list:
    """Every allowed type; table-wise alone; table-wise with one other type (deduplicated, in order)."""
    fams = [tuple(types)]
    tw = ShardingType.TABLE_WISE
    if tw in types:
        fams += [(tw,)] + [(tw, x) for x in types if x != tw]
    out = []
    for f in fams:
        if set(f) not in [set(g) for g in out]:
            out.append(f)
    return out


def measured_ids_per_bag(stats, tables, bags_per_step: int) -> dict:
    """``{table: ids per bag}`` from the measured load (ids per step over every rank / the bags a
    step looks up: ``bags_per_step`` examples x the table's features); a planner made with it
    estimates the load the run really has, not the one assumed at start-up. Pure.

    Example:
        >>> from types import SimpleNamespace as NS
        >>> stats = NS(tables=[NS(name="t0", per_rank=(600.0, 400.0))])
        >>> measured_ids_per_bag(stats, [NS(name="t0", feature_names=["f0"])], bags_per_step=250)
        {'t0': 4.0}
    """
    feats = {t.name: max(1, len(t.feature_names)) for t in tables}
    # a table never looked up still gets a positive figure: the planner refuses zero ids per bag
    return {t.name: max(sum(t.per_rank) / (bags_per_step * feats[t.name]), 1e-3) for t in stats.tables}


def predicted_load(stats, plan: dict, est) -> list:
    """Pure: per-rank measured load ``stats`` would give under ``plan`` (its boxes from the planner's estimate)."""
    out = [0.0] * stats.world_size
    for t in stats.tables:
        boxes = [b for b, _, _ in est.shards[t.name]]
        for r, x in enumerate(t.rank_load(boxes, plan[t.name].sharding_type, stats.world_size)):
            out[r] += x
    return out


def predicted_after(stats, plan: dict, planner, tables) -> list:
    """Per-rank measured load of the last window had ``plan`` been in force (the load model's figure)."""
    return predicted_load(stats, plan, planner.estimate(plan, tables))


def fit_memory(changes: dict, plan: dict, stats, planner, tables) -> tuple[dict, str]:
    """The part of a proposal that keeps every rank within ``planner.memory`` (weights + optimizer
    state per rank), lowers the planner's estimated step time (slowest rank) and lowers the predicted
    maximum measured load the most; ``({}, reason)`` when nothing does. The proposal's moves are
    greedy and ordered, so every prefix is a candidate, and so are the proposal without the moves
    that break the budget and the proposal without the moves that also raise the estimate. Pure:
    the same on every rank."""
    order = list(changes)
    now, est_now = max(stats.per_rank()), max(planner.estimate(plan, tables).cost)
    subsets, skipping, cheaper, est_kept = [order[:k] for k in range(len(order), 0, -1)], [], [], est_now
    for n in order:   # the moves in order, each kept only if the layout so far still fits ...
        est = planner.estimate({**plan, **{m: changes[m] for m in skipping + [n]}}, tables)
        if _fits(est, planner):
            skipping.append(n)
        # ... and, in a second candidate, only if the planner's estimate does not get worse either
        est = planner.estimate({**plan, **{m: changes[m] for m in cheaper + [n]}}, tables)
        if _fits(est, planner) and max(est.cost) <= est_kept:
            cheaper.append(n)
            est_kept = max(est.cost)
    subsets += [skipping, cheaper]
    best, over, est_best = None, None, None
    for names in subsets:
        if not names:
            continue
        cand = {**plan, **{n: changes[n] for n in names}}
        est = planner.estimate(cand, tables)
        if not _fits(est, planner):
            over = over or _overflow(est, planner)
            continue
        est_best = min(est_best, max(est.cost)) if est_best is not None else max(est.cost)
        if max(est.cost) >= est_now * (1 - 1e-9):
            continue
        peak = max(predicted_load(stats, cand, est))
        if peak < now * (1 - 1e-9) and (best is None or peak < best[0]):
            best = (peak, names)
    if best is None:
        return {}, _why_none(over, est_best, est_now, planner)
    kept = {n: changes[n] for n in best[1]}
    left = [n for n in order if n not in kept]
    return kept, (f"{len(left)} of {len(order)} proposed moves left out to stay within the memory budget "
                  f"({over}) or to improve the planner's estimate: {', '.join(left)}" if left else "")


def _why_none(over, est_best, est_now, planner) -> str:
    if est_best is None:
        return f"every proposed move would exceed the memory budget ({over}; {planner.memory_flag})" if over \
            else "no move within the memory budget lowers the measured load"
    if est_best >= est_now * (1 - 1e-9):
        return (f"the planner's estimate would not improve ({est_now * 1e3:.3f} ms per step now, "
                f"{est_best * 1e3:.3f} ms at best with the proposed moves)")
    return "no move within the memory budget lowers both the measured load and the planner's estimate"


def _fits(est, planner) -> bool:
    return all(m <= cap for m, cap in zip(est.memory, planner.memory))


def _overflow(est, planner) -> str:
    r = max(range(len(est.memory)), key=lambda i: est.memory[i] - planner.memory[i])
    return f"rank {r} would hold {_size(est.memory[r])} of {_size(planner.memory[r])}"


def _size(n: float) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{int(n):,} bytes"
