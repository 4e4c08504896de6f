"""A sharding planner: place tables to balance per-rank lookup cost under per-rank memory limits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from ..collection.config import EmbeddingBagConfig, EmbeddingConfig, check_tables
from .values import (
    LayoutTopology, ParameterSharding, ShardBox, ShardingType, column_wise, data_parallel, row_wise, table_row_wise, table_wise,
)

__all__ = ["EmbeddingShardingPlanner", "PlanEstimate"]

def _table_list(tables) -> list:
    """The configs of a collection (anything with ``.tables``: an EmbeddingBagCollection, an
    EmbeddingCollection, a sharded one) or a list of configs, validated."""
    return check_tables(tables.tables if hasattr(tables, "tables") and not isinstance(tables, (list, tuple))
                        else tables, (EmbeddingBagConfig, EmbeddingConfig))


_ID_COST = 2.0   # an id routed to a shard costs as much as moving two values (id, length) in the exchange

# optimizer state per weight element ("elem") or per row ("row"), by optimizer name
_STATE = {"sgd": (0, 0), "adagrad": (1, 0), "adam": (2, 0), "rowwiseadagrad": (0, 1)}


@dataclass
class PlanEstimate:
    """Per-rank storage (bytes) and lookup cost (ids x dim per batch) of a plan."""

    memory: list = field(default_factory=list)
    cost: list = field(default_factory=list)
    shards: dict = field(default_factory=dict)   # table -> [(ShardBox, bytes, cost)]


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


class EmbeddingShardingPlanner:
    """Greedy planner: biggest tables first, each to the candidate layout (table-wise on a rank,
    row-wise over all ranks, table-row-wise within one host, column-wise in blocks at least
    ``min_column_width`` wide, data-parallel) that keeps the maximum per-rank cost lowest and fits
    memory. Planning runs no collectives: it is a pure function of its arguments, so every rank
    plans alike and 128 ranks plan in about a second.

    Storage = weights + optimizer state; lookup cost = ids routed to a shard per step x its columns,
    with ids assumed uniform over rows (a row block gets its share) and ``ids_per_bag`` per feature,
    plus the ids it receives (``_ID_COST`` each), plus the pooled output it returns (table-row-wise:
    summed inside the host at ``intra_host_cost`` per value, then one sum per host crosses), plus
    ``message_cost`` per shard (its kernel launch and its part
    of every exchange: what keeps the planner from cutting a table into one sliver per rank).
    ``ranks_per_host`` groups ranks into hosts (default: one host): table-row-wise splits a table's
    rows over one host's ranks, whose partial sums meet inside the host first.

    Example:
        >>> planner = EmbeddingShardingPlanner(world_size=2, memory_per_rank_bytes=2**30)
        >>> plan = planner.plan(tables)          # {table name: ParameterSharding}
        >>> print(planner.format_plan(plan, tables))
    """

    def __init__(self, world_size: int, memory_per_rank_bytes, batch_size_per_rank: int = 512,
                 ids_per_bag: float = 20.0, optimizer: str = "adagrad", bytes_per_element: int = 4,
                 data_parallel_max_rows: int = 1024, sharding_types: Optional[Sequence[ShardingType]] = None,
                 ranks_per_host: Optional[int] = None, min_column_width: int = 32, message_cost: float = 16384.0,
                 intra_host_cost: float = 0.25, memory_flag: str = "memory_per_rank_bytes"):
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size={world_size!r} must be a positive int")
        mem = [memory_per_rank_bytes] * world_size if isinstance(memory_per_rank_bytes, (int, float)) \
            else list(memory_per_rank_bytes)
        if len(mem) != world_size or any(m <= 0 for m in mem):
            raise ValueError(f"memory_per_rank_bytes must be a positive number or one per rank ({world_size}), "
                             f"got {memory_per_rank_bytes!r}")
        if optimizer.lower() not in _STATE:
            raise ValueError(f"optimizer={optimizer!r} unknown to the planner; use one of {sorted(_STATE)}")
        self.world, self.memory = world_size, mem
        self.batch, self.ids_per_bag, self.elem_bytes = batch_size_per_rank, float(ids_per_bag), bytes_per_element
        self.state_elem, self.state_row = _STATE[optimizer.lower()]
        self.dp_max_rows = data_parallel_max_rows
        per_host = world_size if ranks_per_host is None else ranks_per_host
        if not isinstance(per_host, int) or per_host < 1 or world_size % per_host:
            raise ValueError(f"ranks_per_host={ranks_per_host!r} must be a positive int dividing world_size "
                             f"{world_size} (hosts of equal size)")
        self.topo = LayoutTopology(world_size, tuple(tuple(range(h, h + per_host))
                                                     for h in range(0, world_size, per_host)))
        self.min_column_width, self.message_cost = int(min_column_width), float(message_cost)
        self.intra_host_cost = float(intra_host_cost)
        self.memory_flag = memory_flag       # how the caller's users set the memory (named in errors)
        default = (ShardingType.TABLE_WISE, ShardingType.ROW_WISE, ShardingType.COLUMN_WISE,
                   ShardingType.DATA_PARALLEL) + ((ShardingType.TABLE_ROW_WISE,) if len(self.topo.hosts) > 1 else ())
        self.types = tuple(sharding_types or default)

    # ---- cost model ---------------------------------------------------------------------------
    def shard_bytes(self, box: ShardBox) -> int:
        return self.elem_bytes * (box.row_size * box.col_size * (1 + self.state_elem) + box.row_size * self.state_row)

    def _boxes(self, t: EmbeddingBagConfig, ps: ParameterSharding) -> list[ShardBox]:
        for r in ps.ranks or ():
            if isinstance(r, int) and r >= self.world:
                raise ValueError(f"table {t.name!r}: rank {r} is outside world_size {self.world}")
        from ..sharding import SHARDERS   # the sharding classes import this package's values

        return SHARDERS[ps.sharding_type].layout(t, ps, self.topo)

    def _shard_cost(self, t: EmbeddingBagConfig, ps: ParameterSharding, box: ShardBox) -> float:
        ids = self.batch * self.ids_per_bag * len(t.feature_names)
        if ps.sharding_type == ShardingType.DATA_PARALLEL:
            # local lookups plus the dense all-reduce of the table's gradient in backward
            return ids * box.col_size + box.row_size * box.col_size
        routed = ids * self.world * (box.row_size / t.num_embeddings)
        if isinstance(t, EmbeddingConfig):   # unpooled (EmbeddingCollection): one row back per routed id
            return routed * (2 * box.col_size + _ID_COST) + self.message_cost
        pooled = self.batch * self.world * len(t.feature_names) * box.col_size
        if ps.sharding_type == ShardingType.TABLE_ROW_WISE:
            # partial sums meet inside the host first (fast links), then one sum per sample crosses
            # hosts, shared by the host's shards
            per_host = len(self.topo.hosts[0])
            pooled = pooled * self.intra_host_cost + pooled / per_host
        return routed * (box.col_size + _ID_COST) + pooled + self.message_cost

    def estimate(self, plan: dict, tables: Sequence[EmbeddingBagConfig]) -> PlanEstimate:
        """Per-rank memory and cost of ``plan``; checks every table is placed exactly once."""
        tables = _table_list(tables)
        names = [t.name for t in tables]
        missing, extra = [n for n in names if n not in plan], sorted(set(plan) - set(names))
        if missing or extra:
            raise ValueError(f"plan must place every table exactly once: missing {missing}, unknown {extra}")
        est = PlanEstimate([0] * self.world, [0.0] * self.world, {})
        for t in tables:
            ps = plan[t.name]
            if not isinstance(ps, ParameterSharding):
                raise TypeError(f"plan[{t.name!r}] must be a ParameterSharding, got {ps!r}")
            rows = []
            for box in self._boxes(t, ps):
                if box.rank >= self.world:
                    raise ValueError(f"table {t.name!r}: rank {box.rank} is outside world_size {self.world}")
                b, c = self.shard_bytes(box), self._shard_cost(t, ps, box)
                est.memory[box.rank] += b
                est.cost[box.rank] += c
                rows.append((box, b, c))
            est.shards[t.name] = rows
        return est

    # ---- search -------------------------------------------------------------------------------
    def _candidates(self, t: EmbeddingBagConfig, load: list[float]) -> list[ParameterSharding]:
        by_load = sorted(range(self.world), key=lambda r: (load[r], r))
        out = []
        if ShardingType.TABLE_WISE in self.types:
            out += [table_wise(r) for r in by_load]
        if ShardingType.ROW_WISE in self.types and self.world > 1:
            out.append(row_wise())
        if ShardingType.COLUMN_WISE in self.types:
            for k in range(2, min(self.world, t.embedding_dim // max(1, self.min_column_width)) + 1):
                out.append(column_wise(sorted(by_load[:k])))
        if ShardingType.TABLE_ROW_WISE in self.types and len(self.topo.hosts) > 1:
            host_load = [sum(load[r] for r in h) for h in self.topo.hosts]
            out += [table_row_wise(h) for h in sorted(range(len(self.topo.hosts)), key=lambda h: (host_load[h], h))]
        if ShardingType.DATA_PARALLEL in self.types and t.num_embeddings <= self.dp_max_rows:
            out.append(data_parallel())
        return out

    def plan(self, tables: Sequence[EmbeddingBagConfig]) -> dict:
        """``{table name: ParameterSharding}`` balancing the max per-rank cost within memory.
        ``tables``: a list of configs or a collection (``planner.plan(ebc)``, as TorchRec's takes a module)."""
        tables = _table_list(tables)
        order = sorted(range(len(tables)), key=lambda i: (-self._table_weight(tables[i]), i))
        memory, cost = [0] * self.world, [0.0] * self.world
        plan: dict = {}
        for i in order:
            t = tables[i]
            best, best_key, best_state, shortfall = None, None, None, None
            for ps in self._candidates(t, cost):
                mem_after, cost_after = list(memory), list(cost)
                for box in self._boxes(t, ps):
                    mem_after[box.rank] += self.shard_bytes(box)
                    cost_after[box.rank] += self._shard_cost(t, ps, box)
                over = max(m - cap for m, cap in zip(mem_after, self.memory))
                if over > 0:
                    shortfall = over if shortfall is None else min(shortfall, over)
                    continue
                key = (max(cost_after), sum(cost_after), max(mem_after))
                if best_key is None or key < best_key:
                    best, best_key, best_state = ps, key, (mem_after, cost_after)
            if best is None:
                raise ValueError(
                    f"table {t.name!r} ({t.num_embeddings} x {t.embedding_dim}) does not fit: every layout "
                    f"exceeds some rank's memory by at least {shortfall} bytes ({shortfall / 2**20:.1f} MiB) "
                    f"with the tables placed so far; raise {self.memory_flag}, add ranks or shrink the table")
            plan[t.name] = best
            memory, cost = best_state
        return {t.name: plan[t.name] for t in tables}

    def _table_weight(self, t: EmbeddingBagConfig) -> float:
        return t.num_embeddings * t.embedding_dim + self.batch * self.ids_per_bag * len(t.feature_names) * t.embedding_dim

    # ---- display ------------------------------------------------------------------------------
    def format_plan(self, plan: dict, tables: Sequence[EmbeddingBagConfig]) -> str:
        """The plan as a text table: one line per table, then per-rank memory and cost."""
        est = self.estimate(plan, tables)
        lines = [f"{'table':<16}{'sharding':<16}{'ranks':<14}{'rows x dim':<16}{'MiB/shard':>10}"]
        for t in _table_list(tables):
            ps = plan[t.name]
            ranks = rank_ranges(b.rank for b, _, _ in est.shards[t.name])
            mib = max(b for _, b, _ in est.shards[t.name]) / 2**20
            lines.append(f"{t.name:<16}{ps.sharding_type.value:<16}{ranks:<14}"
                         f"{f'{t.num_embeddings}x{t.embedding_dim}':<16}{mib:>10.2f}")
        lines.append(f"{'rank':<8}{'memory MiB':>12}{'limit MiB':>12}{'cost (M ids*dim)':>18}")
        for r in range(self.world):
            lines.append(f"{r:<8}{est.memory[r] / 2**20:>12.2f}{self.memory[r] / 2**20:>12.2f}"
                         f"{est.cost[r] / 1e6:>18.2f}")
        return "\n".join(lines)

    def plan_record(self, plan: dict, tables: Sequence[EmbeddingBagConfig]) -> dict:
        """The plan and its estimate as JSON-ready data (``shardwise plan --json``); rank lists as
        ranges (``"0-127"``), the cost figures labelled as the planner's estimate."""
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
            "estimated_cost_per_rank": [round(c, 1) for c in est.cost],
        }

    def print_plan(self, plan: dict, tables: Sequence[EmbeddingBagConfig]) -> None:
        print(self.format_plan(plan, tables))
