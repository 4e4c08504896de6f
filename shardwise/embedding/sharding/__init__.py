"""The sharded collections' machinery: the sharding types (`kinds/`), their stages, routing, stores.

Example:
    >>> from shardwise.embedding import ShardingType
    >>> from shardwise.embedding.sharding import SHARDERS
    >>> SHARDERS[ShardingType.DATA_PARALLEL].replicated, SHARDERS[ShardingType.ROW_WISE].replicated
    (True, False)
"""

from ..plan.values import ShardingType
from .kinds import column_wise, data_parallel, row_wise, table_row_wise, table_wise
from .kinds.base import LayoutTopology, ShardingKind, Stages

SHARDERS: dict = {
    ShardingType.DATA_PARALLEL: data_parallel.SHARDER,
    ShardingType.TABLE_WISE: table_wise.SHARDER,
    ShardingType.ROW_WISE: row_wise.SHARDER,
    ShardingType.COLUMN_WISE: column_wise.SHARDER,
    ShardingType.TABLE_ROW_WISE: table_row_wise.SHARDER,
}

__all__ = ["SHARDERS", "ShardingKind", "Stages", "LayoutTopology"]
