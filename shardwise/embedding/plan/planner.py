"""A sharding planner: place tables to balance per-rank lookup cost under per-rank memory limits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from ..collection.config import EmbeddingBagConfig, EmbeddingConfig, check_tables
from ..optim.rules import STATE_DTYPE
from .calibration import Calibration
from .cost import CostModel, FixedCosts
from .values import (
    LayoutTopology, ParameterSharding, ShardBox, ShardingType, column_wise, data_parallel, row_wise, table_row_wise, table_wise,
)

__all__ = ["GreedyShardingPlanner", "PlanEstimate", "rank_ranges"]

def _table_list(tables) -> list:
    """The configs of a collection (anything with ``.tables``: an EmbeddingBagCollection, an
    EmbeddingCollection, a sharded one) or a list of configs, validated."""
    return check_tables(tables.tables if hasattr(tables, "tables") and not isinstance(tables, (list, tuple))
                        else tables, (EmbeddingBagConfig, EmbeddingConfig))


_FEW = 8   # places priced per layout kind: the least-loaded ranks (hosts) and the emptiest ones

# optimizer state per weight element ("elem") or per row ("row"), by optimizer name
_STATE = {"sgd": (0, 0), "adagrad": (1, 0), "adam": (2, 0), "rowwiseadagrad": (0, 1)}


@dataclass
class PlanEstimate:
    """Per-rank storage (bytes) and estimated seconds per step of a plan (``cost``: the shards' own
    work plus ``fixed``, what the plan's sharding type groups cost every rank once).

    Example:
        >>> from shardwise.embedding import EmbeddingBagConfig, row_wise
        >>> tables = [EmbeddingBagConfig(5000, 8, "t0", feature_names=["f"])]
        >>> GreedyShardingPlanner(2, 2**30).estimate({"t0": row_wise()}, tables).memory   # weights + Adagrad
        [160000, 160000]
    """

    memory: list = field(default_factory=list)
    cost: list = field(default_factory=list)
    shards: dict = field(default_factory=dict)   # table -> [(ShardBox, bytes, seconds)]
    fixed: list = field(default_factory=list)


def rank_ranges(ranks) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2,5,7-8"``: readable rank lists at any world size.

    >>> rank_ranges(range(128))
    '0-127'
    """
    out, run = [], []
    for r in sorted(set(ranks)):
        if run and r == run[-1] + 1:
            run.append(r)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [r]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


class GreedyShardingPlanner:
    """Greedy planner for speed: biggest tables first, each to the candidate layout (table-wise on a
    rank, row-wise over all ranks, table-row-wise within one host, column-wise in blocks at least
    ``min_column_width`` wide inside one host, data-parallel up to ``data_parallel_max_rows`` rows)
    that keeps the estimated step time of the slowest rank lowest and fits memory. The greedy runs
    once with every allowed type and once per smaller family (table-wise alone, table-wise plus one
    other type); the plan with the lowest estimate wins, so it is never estimated slower than the
    all-table-wise one. Planning runs no collectives: a pure function of its arguments, so every
    rank plans alike (given one calibration) and 128 ranks plan in seconds.

    Cost model (``cost.py``): estimated seconds per step from ``calibration`` (measured per-type
    costs, :func:`~shardwise.embedding.plan.calibration.calibrate`; default
    ``Calibration.nominal()``): lookup per call, id and byte; all-to-all and all-reduce per byte and
    per message; ids spread uniformly over rows, ``ids_per_bag`` per feature (a number, or
    ``{table name: number}``). Storage = weights in each table's ``data_type`` (or
    ``bytes_per_element`` bytes each, if given) + optimizer state in fp32. ``ranks_per_host`` groups ranks
    into hosts (default: one host): bytes between hosts cost ``calibration.cross_host_factor`` more,
    and table-row-wise sums a table's partial rows inside one host before they cross.
    ``table_sharding_types`` (``{table name: [types]}``) narrows the types of single tables; a table
    left one type gets it even where the defaults would not offer it (data-parallel above
    ``data_parallel_max_rows``, a one-block column-wise, row-wise on one rank).

    Example:
        >>> from shardwise.embedding import EmbeddingBagConfig
        >>> tables = [EmbeddingBagConfig(10, 4, "small", feature_names=["f0"]),
        ...           EmbeddingBagConfig(5000, 8, "big", feature_names=["f1"])]
        >>> planner = GreedyShardingPlanner(world_size=2, memory_per_rank_bytes=2**30)
        >>> plan = planner.plan(tables)          # {table name: ParameterSharding}
        >>> print(planner.format_plan(plan, tables))
        table           sharding        ranks         rows x dim       MiB/shard
        small           table_wise      1             10x4                  0.00
        big             table_wise      0             5000x8                0.31
        ...
    """

    def __init__(self, world_size: int, memory_per_rank_bytes, batch_size_per_rank: int = 512,
                 ids_per_bag=20.0, optimizer: str = "adagrad", bytes_per_element: Optional[int] = None,
                 data_parallel_max_rows: int = 1024, sharding_types: Optional[Sequence[ShardingType]] = None,
                 ranks_per_host: Optional[int] = None, min_column_width: int = 32,
                 calibration: Optional[Calibration] = None, memory_flag: str = "memory_per_rank_bytes",
                 table_sharding_types: Optional[dict] = None):
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size={world_size!r} must be a positive int")
        mem = [memory_per_rank_bytes] * world_size if isinstance(memory_per_rank_bytes, (int, float)) \
            else list(memory_per_rank_bytes)
        if len(mem) != world_size or any(m <= 0 for m in mem):
            raise ValueError(f"memory_per_rank_bytes must be a positive number or one per rank ({world_size}), "
                             f"got {memory_per_rank_bytes!r}")
        if bytes_per_element is not None and (not isinstance(bytes_per_element, int) or bytes_per_element < 1):
            raise ValueError(f"bytes_per_element={bytes_per_element!r} must be None (each table's data_type) or a "
                             f"positive int (bytes of one weight element, e.g. 2 for fp16)")
        if optimizer.lower() not in _STATE:
            raise ValueError(f"optimizer={optimizer!r} unknown to the planner; use one of {sorted(_STATE)}")
        if calibration is not None and not isinstance(calibration, Calibration):
            raise TypeError(f"calibration={calibration!r} must be a Calibration (calibrate(), "
                            f"Calibration.from_json(...) or Calibration.nominal())")
        self.world, self.memory = world_size, mem
        self.batch, self.elem_bytes = batch_size_per_rank, bytes_per_element
        self.ids_per_bag = _check_ids_per_bag(ids_per_bag)
        self.state_elem, self.state_row = _STATE[optimizer.lower()]
        self.dp_max_rows = data_parallel_max_rows
        per_host = world_size if ranks_per_host is None else ranks_per_host
        if not isinstance(per_host, int) or per_host < 1 or world_size % per_host:
            raise ValueError(f"ranks_per_host={ranks_per_host!r} must be a positive int dividing world_size "
                             f"{world_size} (hosts of equal size)")
        self.topo = LayoutTopology(world_size, tuple(tuple(range(h, h + per_host))
                                                     for h in range(0, world_size, per_host)))
        self.min_column_width = int(min_column_width)
        self.calibration = calibration or Calibration.nominal()
        self.model = CostModel(self.calibration, self.topo, batch_size_per_rank, self._ids, self.weight_bytes)
        self.memory_flag = memory_flag       # how the caller's users set the memory (named in errors)
        default = (ShardingType.TABLE_WISE, ShardingType.ROW_WISE, ShardingType.COLUMN_WISE,
                   ShardingType.DATA_PARALLEL) + ((ShardingType.TABLE_ROW_WISE,) if len(self.topo.hosts) > 1 else ())
        self.types = tuple(sharding_types or default)
        self.table_types = _check_table_types(table_sharding_types or {}, self.types)

    # ---- cost model ---------------------------------------------------------------------------
    def _ids(self, t: EmbeddingBagConfig) -> float:
        return self.ids_per_bag.get(t.name, self.ids_per_bag[None])

    def weight_bytes(self, t) -> int:
        """Bytes of one weight element of table ``t``: its ``data_type`` unless ``bytes_per_element`` was given."""
        return self.elem_bytes or t.data_type.torch_dtype.itemsize

    def shard_bytes(self, t, box: ShardBox) -> int:
        """Bytes a shard holds: its weights, and the optimizer state in fp32 whatever the weights' dtype."""
        elems = box.row_size * box.col_size
        state = elems * self.state_elem + box.row_size * self.state_row
        return self.weight_bytes(t) * elems + STATE_DTYPE.itemsize * state

    def _boxes(self, t: EmbeddingBagConfig, ps: ParameterSharding) -> list[ShardBox]:
        for r in ps.ranks or ():
            if isinstance(r, int) and r >= self.world:
                raise ValueError(f"table {t.name!r}: rank {r} is outside world_size {self.world}")
        from ..sharding import SHARDERS   # the sharding classes import this package's values

        return SHARDERS[ps.sharding_type].layout(t, ps, self.topo)

    def estimate(self, plan: dict, tables: Sequence[EmbeddingBagConfig]) -> PlanEstimate:
        """Per-rank memory and estimated seconds per step of ``plan``; checks every table is placed
        exactly once."""
        tables = _table_list(tables)
        names = [t.name for t in tables]
        missing, extra = [n for n in names if n not in plan], sorted(set(plan) - set(names))
        if missing or extra:
            raise ValueError(f"plan must place every table exactly once: missing {missing}, unknown {extra}")
        est = PlanEstimate([0] * self.world, [0.0] * self.world, {}, [0.0] * self.world)
        fixed = FixedCosts(self.model)
        for t in tables:
            ps = plan[t.name]
            if not isinstance(ps, ParameterSharding):
                raise TypeError(f"plan[{t.name!r}] must be a ParameterSharding, got {ps!r}")
            rows, boxes = [], self._boxes(t, ps)
            for box in boxes:
                if box.rank >= self.world:
                    raise ValueError(f"table {t.name!r}: rank {box.rank} is outside world_size {self.world}")
                b, c = self.shard_bytes(t, box), self.model.shard(t, ps.sharding_type, box)
                est.memory[box.rank] += b
                est.cost[box.rank] += c
                rows.append((box, b, c))
            everyone, per_rank = fixed.delta(ps.sharding_type, boxes)
            fixed.add(ps.sharding_type, boxes)
            for r in range(self.world):
                est.fixed[r] += everyone + per_rank.get(r, 0.0)
            est.shards[t.name] = rows
        est.cost = [c + f for c, f in zip(est.cost, est.fixed)]
        return est

    # ---- search -------------------------------------------------------------------------------
    def _candidates(self, t: EmbeddingBagConfig, load: list[float], memory: list, types) -> list:
        """Layouts worth pricing for ``t``: where a layout's cost is the same on any rank (table-wise,
        column-wise in a host) only the least-loaded places and those with the most free memory."""
        allowed = self.table_types.get(t.name)
        if allowed is not None:
            types = [x for x in types if x in allowed]
        by_load = sorted(range(self.world), key=lambda r: (load[r], r))
        by_free = sorted(range(self.world), key=lambda r: (memory[r] - self.memory[r], r))
        out = []
        if ShardingType.TABLE_WISE in types:
            out += [table_wise(r) for r in dict.fromkeys(by_load[:_FEW] + by_free[:_FEW])]
        if ShardingType.ROW_WISE in types and (self.world > 1 or ShardingType.TABLE_WISE not in types):
            out.append(row_wise())
        if ShardingType.COLUMN_WISE in types:
            # column blocks stay inside one host: each block serves every id, so spreading them
            # over hosts only adds cross-host traffic
            widest = t.embedding_dim // max(1, self.min_column_width)
            hosts = sorted(self.topo.hosts, key=lambda h: (min(load[r] for r in h), h))
            for host in hosts[:_FEW]:
                mine = sorted(host, key=lambda r: (load[r], r))
                # one block (the whole table on one rank) only where table-wise is not allowed
                first = 1 if ShardingType.TABLE_WISE not in types else 2
                out += [column_wise(sorted(mine[:k])) for k in range(first, min(len(host), max(widest, 1)) + 1)]
        if ShardingType.TABLE_ROW_WISE in types and len(self.topo.hosts) > 1:
            host_load = [sum(load[r] for r in h) for h in self.topo.hosts]
            order = sorted(range(len(self.topo.hosts)), key=lambda h: (host_load[h], h))
            out += [table_row_wise(h) for h in order[:_FEW]]
        if ShardingType.DATA_PARALLEL in types and (t.num_embeddings <= self.dp_max_rows or len(types) == 1):
            out.append(data_parallel())
        return out

    def _type_families(self) -> list[tuple]:
        """Every allowed type; table-wise alone; table-wise with one other type (deduplicated)."""
        fams = [self.types]
        if ShardingType.TABLE_WISE in self.types:
            tw = ShardingType.TABLE_WISE
            fams += [(tw,)] + [(tw, x) for x in self.types if x != tw]
        out = []
        for f in fams:
            if set(f) not in [set(g) for g in out]:
                out.append(f)
        return out

    def plan(self, tables: Sequence[EmbeddingBagConfig]) -> dict:
        """``{table name: ParameterSharding}`` with the lowest estimated step time (slowest rank) that
        fits memory. ``tables``: a list of configs or a collection (``planner.plan(ebc)``, as
        TorchRec's takes a module)."""
        tables = _table_list(tables)
        best, best_time, first_error = None, None, None
        for types in self._type_families():
            try:
                plan = self._greedy(tables, types)
            except ValueError as e:         # this family does not fit memory; another may
                first_error = first_error or e
                continue
            seconds = max(self.estimate(plan, tables).cost)
            if best_time is None or seconds < best_time:
                best, best_time = plan, seconds
        if best is None:
            raise first_error
        return best

    def _greedy(self, tables: list, types) -> dict:
        order = sorted(range(len(tables)), key=lambda i: (-self._table_weight(tables[i]), i))
        memory, cost = [0] * self.world, [0.0] * self.world
        fixed, plan = FixedCosts(self.model), {}
        for i in order:
            t = tables[i]
            best, best_key, best_state, shortfall = None, None, None, None
            for ps in self._candidates(t, cost, memory, types):
                boxes = self._boxes(t, ps)
                mem_after, cost_after = list(memory), list(cost)
                everyone, per_rank = fixed.delta(ps.sharding_type, boxes)
                for box in boxes:
                    mem_after[box.rank] += self.shard_bytes(t, box)
                    cost_after[box.rank] += self.model.shard(t, ps.sharding_type, box)
                over = max(m - cap for m, cap in zip(mem_after, self.memory))
                if over > 0:
                    shortfall = over if shortfall is None else min(shortfall, over)
                    continue
                cost_after = [c + everyone + per_rank.get(r, 0.0) for r, c in enumerate(cost_after)]
                key = (max(cost_after), sum(cost_after), max(mem_after))
                if best_key is None or key < best_key:
                    best, best_key, best_state = (ps, boxes), key, (mem_after, cost_after)
            if best is None and shortfall is None:
                raise ValueError(f"table {t.name!r}: no layout among the types allowed for it in this search "
                                 f"({[x.value for x in types]}, table_sharding_types {self.table_types.get(t.name)})")
            if best is None:
                raise ValueError(
                    f"table {t.name!r} ({t.num_embeddings} x {t.embedding_dim}) does not fit: every layout "
                    f"exceeds some rank's memory by at least {shortfall} bytes ({shortfall / 2**20:.1f} MiB) "
                    f"with the tables placed so far; raise {self.memory_flag}, add ranks or shrink the table")
            plan[t.name] = best[0]
            fixed.add(best[0].sharding_type, best[1])
            memory, cost = best_state
        return {t.name: plan[t.name] for t in tables}

    def _table_weight(self, t: EmbeddingBagConfig) -> float:
        ids = self.batch * self._ids(t) * len(t.feature_names)
        return t.num_embeddings * t.embedding_dim + ids * t.embedding_dim

    # ---- display ------------------------------------------------------------------------------
    def format_plan(self, plan: dict, tables: Sequence[EmbeddingBagConfig]) -> str:
        """The plan as a text table: one line per table, then per-rank memory and estimated step time."""
        est = self.estimate(plan, tables)
        lines = [f"{'table':<16}{'sharding':<16}{'ranks':<14}{'rows x dim':<16}{'MiB/shard':>10}"]
        for t in _table_list(tables):
            ps = plan[t.name]
            ranks = rank_ranges(b.rank for b, _, _ in est.shards[t.name])
            mib = max(b for _, b, _ in est.shards[t.name]) / 2**20
            lines.append(f"{t.name:<16}{ps.sharding_type.value:<16}{ranks:<14}"
                         f"{f'{t.num_embeddings}x{t.embedding_dim}':<16}{mib:>10.2f}")
        lines.append(f"{'rank':<8}{'memory MiB':>12}{'limit MiB':>12}{'est. ms/step':>14}")
        for r in range(self.world):
            lines.append(f"{r:<8}{est.memory[r] / 2**20:>12.2f}{self.memory[r] / 2**20:>12.2f}"
                         f"{est.cost[r] * 1e3:>14.3f}")
        lines.append(f"estimated embedding time per step: {max(est.cost) * 1e3:.3f} ms (an estimate, not a "
                     f"measurement; calibration: {self.calibration.source})")
        return "\n".join(lines)

    def plan_record(self, plan: dict, tables: Sequence[EmbeddingBagConfig]) -> dict:
        """The plan and its estimate as JSON-ready data (``shardwise plan --json``); rank lists as
        ranges (``"0-127"``), the time figures labelled as the planner's estimate."""
        est = self.estimate(plan, tables)
        return {
            "world_size": self.world, "hosts": [rank_ranges(h) for h in self.topo.hosts],
            "tables": [{"name": t.name, "rows": t.num_embeddings, "dim": t.embedding_dim,
                        "sharding": plan[t.name].sharding_type.value,
                        "ranks": rank_ranges(b.rank for b, _, _ in est.shards[t.name]),
                        "shards": len(est.shards[t.name]),
                        "bytes_per_shard_max": max(b for _, b, _ in est.shards[t.name])}
                       for t in _table_list(tables)],
            "memory_bytes_per_rank": list(est.memory), "memory_limit_per_rank": list(self.memory),
            **self.estimate_record(est), "calibration": self.calibration.to_json(),
        }

    @staticmethod
    def estimate_record(est: PlanEstimate) -> dict:
        """The estimate's time figures, named as an estimate (metrics.json, ``--json``)."""
        return {"estimated_step_ms": round(max(est.cost) * 1e3, 6),
                "estimated_step_ms_per_rank": [round(c * 1e3, 6) for c in est.cost],
                "estimate_note": "the planner's estimate of the embedding part of a step (lookups and their "
                                 "collectives) from the calibration; not a measurement"}

    def print_plan(self, plan: dict, tables: Sequence[EmbeddingBagConfig]) -> None:
        print(self.format_plan(plan, tables))


def _check_table_types(value: dict, types: tuple) -> dict:
    """``{table: frozenset(ShardingType)}``: each table's allowed types, every one also allowed overall."""
    out = {}
    for name, allowed in dict(value).items():
        try:
            kinds = frozenset(ShardingType(x) for x in allowed)
        except ValueError as e:
            raise ValueError(f"table_sharding_types[{name!r}]: {e}; use {[x.value for x in ShardingType]}") from None
        if not kinds & set(types):
            raise ValueError(f"table_sharding_types[{name!r}]={sorted(k.value for k in kinds)} leaves the table no "
                             f"layout: the planner allows only {[x.value for x in types]}")
        out[name] = kinds
    return out


def _check_ids_per_bag(value) -> dict:
    """``{None: default, table: value}`` from a number or a per-table dict; each must be > 0."""
    items = dict(value) if isinstance(value, dict) else {None: value}
    items.setdefault(None, 1.0)
    for k, v in items.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or v == float("inf"):
            where = "ids_per_bag" if k is None else f"ids_per_bag[{k!r}]"
            raise ValueError(f"{where}={v!r} must be a finite number > 0 (ids looked up per bag of a feature); "
                             f"e.g. 1 for one id per example")
    return {k: float(v) for k, v in items.items()}
