"""Plans: how each table is laid out over ranks (values), and a planner that chooses one
(:class:`GreedyShardingPlanner`; TorchRec's interface to it: :class:`EmbeddingShardingPlanner`,
:class:`Topology`, :class:`ParameterConstraints`, :class:`ShardingPlan`).

Example:
    >>> from shardwise.embedding.plan import row_wise, table_wise
    >>> plan = {"users": row_wise(), "country": table_wise(0)}   # {table name: ParameterSharding}
    >>> plan["country"]
    ParameterSharding(sharding_type=<ShardingType.TABLE_WISE: 'table_wise'>, ranks=(0,), host_index=None)
"""

from .values import (
    ParameterSharding, ShardBox, ShardingType, chunk_sizes, column_wise, data_parallel, row_wise, table_row_wise,
    table_wise,
)
from .planner import GreedyShardingPlanner, PlanEstimate, rank_ranges  # noqa: E402  (after the values it uses)
from .calibration import Calibration, calibrate  # noqa: E402
from .tables_file import load_table_configs  # noqa: E402
from .sharding_plan import EmbeddingModuleShardingPlan, ShardingPlan  # noqa: E402
from .torchrec_planner import EmbeddingShardingPlanner, ParameterConstraints, Topology  # noqa: E402

__all__ = ["ParameterSharding", "ShardBox", "ShardingType", "chunk_sizes", "column_wise", "data_parallel",
           "row_wise", "table_row_wise", "table_wise", "GreedyShardingPlanner", "PlanEstimate", "rank_ranges",
           "Calibration", "calibrate", "load_table_configs", "ShardingPlan", "EmbeddingModuleShardingPlan",
           "EmbeddingShardingPlanner", "ParameterConstraints", "Topology"]
