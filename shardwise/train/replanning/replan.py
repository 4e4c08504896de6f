"""The plan a resumed run starts from: the saved (live) plan, kept wherever it still fits.

A checkpoint holds the plan in force when it was saved -- after any live reshard. On resume, each
table whose ranks all still exist stays exactly where it was; the tables that lived on a rank that is
gone are placed greedily around them with the planner's cost model. Only when the kept layout
cannot fit the memory budget is the whole plan made afresh. Every decision is a pure function of the
checkpoint and the world size, so every rank makes the same one.

Example:
    >>> from shardwise.embedding import EmbeddingBagConfig, GreedyShardingPlanner
    >>> tables = [EmbeddingBagConfig(5000, 4, f"t{i}", feature_names=[f"f{i}"]) for i in range(3)]
    >>> saved = {"t0": table_wise(0), "t1": table_wise(1), "t2": table_wise(2)}     # saved on 3 ranks
    >>> planner = GreedyShardingPlanner(2, 2**30)
    >>> plan, moves = keep_plan(saved, saved_world=3, world=2, tables=tables, planner=planner)
    >>> describe(plan["t0"]), describe(plan["t1"])                                  # kept in place
    ('table_wise[0]', 'table_wise[1]')
    >>> moves["t2"]
    {'from': 'table_wise[2]', 'to': 'row_wise', 'why': 'rank 2 is gone (3 -> 2 ranks)'}
"""

from __future__ import annotations

from ...embedding import ParameterSharding, ShardingType, data_parallel, row_wise, table_wise

__all__ = ["keep_plan", "describe", "placements", "plan_to_json", "plan_from_json"]


def plan_to_json(plan: dict) -> dict:
    """``{table: {"type", "ranks", "host"}}``: a plan as JSON (checkpoint meta, the report)."""
    return {t: {"type": ps.sharding_type.value, "ranks": None if ps.ranks is None else list(ps.ranks),
                "host": ps.host_index} for t, ps in plan.items()}


def plan_from_json(raw: dict) -> dict:
    """The plan :func:`plan_to_json` wrote."""
    return {t: ParameterSharding(ShardingType(v["type"]), None if v["ranks"] is None else tuple(v["ranks"]),
                                 v["host"]) for t, v in raw.items()}


def describe(ps: ParameterSharding) -> str:
    """Short text of one placement: ``table_wise[1]``, ``row_wise[0, 1]``, ``data_parallel``."""
    ranks = "" if ps.ranks is None else str(list(ps.ranks))
    return f"{ps.sharding_type.value}{ranks}"


def _pinned(ps: ParameterSharding, saved_world: int) -> ParameterSharding:
    """The same layout with its ranks spelled out: row-wise over "every rank" of the saved run means
    its ranks 0..saved_world-1, and stays on those when the world grows."""
    if ps.sharding_type in (ShardingType.ROW_WISE, ShardingType.COLUMN_WISE) and ps.ranks is None:
        return ParameterSharding(ps.sharding_type, tuple(range(saved_world)), ps.host_index)
    return ps


def placements(plan: dict, world: int) -> dict:
    """``{table: text}`` of where each table lives on ``world`` ranks; equal for two plans that keep every
    table in place (replicated tables count as in place on any number of ranks)."""
    return {t: describe(_pinned(ps, world)) for t, ps in plan.items()}


def _missing_ranks(ps: ParameterSharding, world: int) -> list:
    if ps.sharding_type == ShardingType.DATA_PARALLEL:
        return []   # replicated on whatever ranks there are
    if ps.sharding_type == ShardingType.TABLE_ROW_WISE:
        return [-1]   # follows the host layout of the saved run: placed again
    return [r for r in ps.ranks if r >= world]


def _place_rest(todo: list, kept: dict, kept_tables: list, world: int, planner) -> dict:
    """Greedy, biggest table first: each to the candidate with the lowest maximum per-rank estimated
    cost that keeps every rank within the planner's memory."""
    if kept:
        est = planner.estimate(kept, kept_tables)
        memory, cost = list(est.memory), list(est.cost)
    else:   # no table kept its ranks (e.g. every saved rank is gone): place all from empty ranks
        memory, cost = [0] * world, [0.0] * world
    out = {}
    for t in sorted(todo, key=lambda t: (-t.num_embeddings * t.embedding_dim, t.name)):
        cands = [table_wise(r) for r in sorted(range(world), key=lambda r: (cost[r], r))]
        cands += [row_wise()] if world > 1 and ShardingType.ROW_WISE in planner.types else []
        cands += [data_parallel()] if t.num_embeddings <= planner.dp_max_rows and \
            ShardingType.DATA_PARALLEL in planner.types else []
        best = None
        for ps in cands:
            e = planner.estimate({t.name: ps}, [t])
            mem = [a + b for a, b in zip(memory, e.memory)]
            load = [a + b for a, b in zip(cost, e.cost)]
            fits = all(m <= cap for m, cap in zip(mem, planner.memory))
            key = (not fits, max(load), sum(x * x for x in load))
            if best is None or key < best[0]:
                best = (key, ps, mem, load)
        _, out[t.name], memory, cost = best
    return out


def keep_plan(saved: dict, saved_world: int, world: int, tables, planner) -> tuple[dict, dict]:
    """``(plan, moves)`` for a run resumed on ``world`` ranks from a plan saved on ``saved_world``.

    ``moves`` maps each table that does not stay where it was to ``{"from", "to", "why"}`` (strings).
    ``planner`` is an :class:`~shardwise.embedding.GreedyShardingPlanner` for ``world`` ranks.
    """
    pinned = {t.name: _pinned(saved[t.name], saved_world) for t in tables}
    kept = {n: ps for n, ps in pinned.items() if not _missing_ranks(ps, world)}
    todo = [t for t in tables if t.name not in kept]
    plan = {**kept, **_place_rest(todo, kept, [t for t in tables if t.name in kept], world, planner)}
    est = planner.estimate(plan, tables)
    over = [r for r, (m, cap) in enumerate(zip(est.memory, planner.memory)) if m > cap]
    if over:
        fresh = planner.plan(tables)
        why = (f"keeping the saved layout needs {est.memory[over[0]] / 2**20:.1f} MiB on rank {over[0]}, over "
               f"its {planner.memory[over[0]] / 2**20:.1f} MiB: planned afresh")
        return fresh, {n: {"from": describe(saved[n]), "to": describe(fresh[n]), "why": why}
                       for n in fresh if describe(fresh[n]) != describe(pinned[n])}
    moves = {}
    for t in todo:
        gone = [r for r in _missing_ranks(pinned[t.name], world) if r >= 0]
        why = (f"rank {', '.join(map(str, gone))} {'is' if len(gone) == 1 else 'are'} gone "
               f"({saved_world} -> {world} ranks)") if gone else "table-row-wise follows the saved host layout"
        moves[t.name] = {"from": describe(saved[t.name]), "to": describe(plan[t.name]), "why": why}
    return {t.name: plan[t.name] for t in tables}, moves
