"""Embedding-bag collections, unsharded and sharded over ranks (table/row/column/table-row-wise, DP).

Example:
    >>> from shardwise.embedding import EmbeddingBagConfig, EmbeddingBagCollection, shard, row_wise
    >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig("t", 1000, 16, ["f"])])
    >>> sharded = shard(ebc, {"t": row_wise()},
    ...                 optimizer=functools.partial(torch.optim.Adagrad, lr=0.1))   # doctest: +SKIP
"""

from .collection import EmbeddingBagCollection
from .config import EmbeddingBagConfig, PoolingType
from .fused_optimizer import FusedOptimizer
from .optim import RowWiseAdagrad
from .plan import (
    ParameterSharding,
    ShardBox,
    ShardingType,
    column_wise,
    data_parallel,
    row_wise,
    table_row_wise,
    table_wise,
)
from .planner import EmbeddingShardingPlanner, PlanEstimate
from .rebalance import LoadStats, propose_rebalance
from .reshard import ReshardStats, current_plan, reshard
from .sharded import ShardedEmbeddingBagCollection, shard
from .sharded_tensor import ShardedTable

__all__ = [
    "EmbeddingBagConfig", "PoolingType", "EmbeddingBagCollection",
    "ShardingType", "ParameterSharding", "ShardBox",
    "data_parallel", "table_wise", "row_wise", "column_wise", "table_row_wise",
    "shard", "ShardedEmbeddingBagCollection", "EmbeddingShardingPlanner", "PlanEstimate", "ShardedTable", "FusedOptimizer", "RowWiseAdagrad",
    "reshard", "ReshardStats", "current_plan", "propose_rebalance", "LoadStats",
]
