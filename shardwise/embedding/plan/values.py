"""Sharding plans: how each table is laid out over ranks, as explicit shard boxes."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

__all__ = [
    "ShardingType", "ParameterSharding", "ShardBox", "LayoutTopology",
    "data_parallel", "table_wise", "row_wise", "column_wise", "table_row_wise",
]


class ShardingType(str, enum.Enum):
    """The five layouts (TorchRec's names); a plan's values say which one each table uses.

    Example:
        >>> ShardingType("row_wise") is ShardingType.ROW_WISE, row_wise().sharding_type.value
        (True, 'row_wise')
    """

    DATA_PARALLEL = "data_parallel"
    TABLE_WISE = "table_wise"
    ROW_WISE = "row_wise"
    COLUMN_WISE = "column_wise"
    TABLE_ROW_WISE = "table_row_wise"


@dataclass(frozen=True)
class ParameterSharding:
    """How one table is sharded. Build it with the helpers (``table_wise(1)``, ``row_wise()``, ...).

    ``ranks``: the ranks holding shards (table-wise: one; row-wise: all when None; column-wise: one
    rank per column block). ``host_index``: the host whose ranks split the rows (table-row-wise).

    Example:
        >>> column_wise([0, 1])
        ParameterSharding(sharding_type=<ShardingType.COLUMN_WISE: 'column_wise'>, ranks=(0, 1), host_index=None)
    """

    sharding_type: ShardingType
    ranks: Optional[tuple] = None
    host_index: Optional[int] = None

    @property
    def compute_kernel(self) -> str:
        """TorchRec's kernel name: ``"fused"`` (the table's optimizer runs in the backward) for every
        layout. TorchRec's data-parallel tables are ``"dense"`` (a dense optimizer updates them);
        shardwise's data-parallel tables all-reduce the touched rows and update in the backward too."""
        return "fused"


@dataclass(frozen=True)
class ShardBox:
    """One shard of one table: the rows [row_offset, row_offset+row_size) x columns
    [col_offset, col_offset+col_size) held by ``rank``. Routing is rebuilt from these boxes only.

    Example:
        >>> from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig, shard
        >>> shard(EmbeddingBagCollection([EmbeddingBagConfig(10, 4, "t0", feature_names=["f"])]), {"t0": row_wise()}).boxes()
        [ShardBox(table='t0', rank=0, row_offset=0, row_size=10, col_offset=0, col_size=4)]
    """

    table: str
    rank: int
    row_offset: int
    row_size: int
    col_offset: int
    col_size: int


@dataclass(frozen=True)
class LayoutTopology:
    """The part of a topology that layouts read (no process group): enough to plan, estimate or
    propose without processes. ``hosts``: the ranks of each host."""

    world_size: int
    hosts: tuple

    @staticmethod
    def flat(world_size: int) -> "LayoutTopology":
        return LayoutTopology(world_size, (tuple(range(world_size)),))


def _check_ranks(ranks, what: str) -> tuple:
    if isinstance(ranks, int):
        ranks = (ranks,)
    ranks = tuple(ranks)
    for r in ranks:
        if not isinstance(r, int) or isinstance(r, bool) or r < 0:
            raise ValueError(f"{what}: rank {r!r} must be a non-negative int")
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"{what}: ranks {list(ranks)} repeat a rank; give each shard its own rank")
    if not ranks:
        raise ValueError(f"{what}: needs at least one rank")
    return ranks


def data_parallel() -> ParameterSharding:
    """Replicate the table on every rank; gradients are summed over ranks before the update.

    Example:
        >>> plan = {"small_table": data_parallel()}
    """
    return ParameterSharding(ShardingType.DATA_PARALLEL)


def table_wise(rank: int) -> ParameterSharding:
    """Whole table on one rank.

    Example:
        >>> plan = {"t0": table_wise(0), "t1": table_wise(1)}
    """
    return ParameterSharding(ShardingType.TABLE_WISE, _check_ranks(rank, "table_wise"))


def row_wise(ranks=None) -> ParameterSharding:
    """Rows split in torch.chunk blocks over ``ranks`` (all ranks when None, in rank order).

    Example:
        >>> plan = {"big_table": row_wise()}
    """
    return ParameterSharding(ShardingType.ROW_WISE, None if ranks is None else _check_ranks(ranks, "row_wise"))


def column_wise(ranks) -> ParameterSharding:
    """Columns split in torch.chunk blocks, block i on ``ranks[i]``.

    Example:
        >>> plan = {"wide_table": column_wise([0, 1])}
    """
    return ParameterSharding(ShardingType.COLUMN_WISE, _check_ranks(ranks, "column_wise"))


def table_row_wise(host_index: int) -> ParameterSharding:
    """Rows split in torch.chunk blocks over the ranks of one host (a row of a 2-D mesh).

    Example:
        >>> plan = {"t": table_row_wise(0)}   # with mesh = init_device_mesh("cpu", (2, 2))
    """
    if not isinstance(host_index, int) or isinstance(host_index, bool) or host_index < 0:
        raise ValueError(f"table_row_wise: host_index {host_index!r} must be a non-negative int")
    return ParameterSharding(ShardingType.TABLE_ROW_WISE, host_index=host_index)


def chunk_sizes(total: int, parts: int) -> list[tuple[int, int]]:
    """(offset, size) of each torch.chunk block: block = ceil(total/parts), trailing parts short or empty.

    Example:
        >>> chunk_sizes(10, 3), chunk_sizes(2, 3)      # 10 rows on 3 ranks; 2 rows on 3 ranks
        ([(0, 4), (4, 4), (8, 2)], [(0, 1), (1, 1), (2, 0)])
    """
    block = -(-total // parts)
    out = []
    for i in range(parts):
        start = min(i * block, total)
        out.append((start, min(block, total - start)))
    return out
