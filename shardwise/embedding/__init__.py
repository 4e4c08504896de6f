"""Embedding-bag and embedding collections, unsharded and sharded over ranks (table/row/column/table-row-wise, DP).

Example:
    >>> import functools, torch
    >>> from shardwise.embedding import EmbeddingBagConfig, EmbeddingBagCollection, shard, row_wise
    >>> from shardwise.sparse import KeyedJaggedTensor
    >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig(1000, 16, "t", feature_names=["f"])])
    >>> sharded = shard(ebc, {"t": row_wise()},      # over every rank of the default group
    ...                 optimizer=functools.partial(torch.optim.Adagrad, lr=0.1))
    >>> kjt = KeyedJaggedTensor(["f"], torch.tensor([7, 999, 7]), lengths=torch.tensor([2, 1]))
    >>> torch.equal(sharded(kjt).values(), ebc(kjt).values())
    True
"""

from .collection import (
    BaseEmbeddingConfig, DataType, EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection, EmbeddingConfig,
    PoolingType,
)
from .optim import EmbOptimType, FusedOptimizer, RowWiseAdagrad
from .plan import (
    Calibration,
    GreedyShardingPlanner,
    EmbeddingShardingPlanner,
    EmbeddingModuleShardingPlan,
    ParameterConstraints,
    ShardingPlan,
    Topology,
    ParameterSharding,
    PlanEstimate,
    ShardBox,
    ShardingType,
    column_wise,
    data_parallel,
    rank_ranges,
    row_wise,
    table_row_wise,
    calibrate,
    load_table_configs,
    table_wise,
)
from .reshard import LoadStats, ReshardStats, current_plan, propose_rebalance, reshard
from .model_parallel import DistributedModelParallel
from .torchrec_api.sharders import EmbeddingBagCollectionSharder, EmbeddingCollectionSharder, ModuleSharder
from .torchrec_api.sharding_env import ShardingEnv
from .sharded_collection import ShardedEmbeddingBagCollection, shard
from .sharded_sequence import ShardedEmbeddingCollection
from .sharded_table import ShardedTable
# TorchRec's names (issue 26): quantized comms, awaitables, the fused unsharded collection, compute kernels
from .awaitable import Awaitable, LazyAwaitable
from .torchrec_api.compute_kernel import EmbeddingComputeKernel
from .torchrec_api.fused_collection import FusedEmbeddingBagCollection
from .qcomm import CommType, QCommsConfig, get_qcomm_codecs_registry

__all__ = [
    "EmbeddingBagConfig", "PoolingType", "DataType", "EmbeddingBagCollection",
    "BaseEmbeddingConfig", "EmbeddingConfig", "EmbeddingCollection", "ShardedEmbeddingCollection",
    "ShardingType", "ParameterSharding", "ShardBox",
    "data_parallel", "table_wise", "row_wise", "column_wise", "table_row_wise",
    "shard", "ShardedEmbeddingBagCollection", "GreedyShardingPlanner", "PlanEstimate", "rank_ranges", "ShardedTable", "FusedOptimizer", "RowWiseAdagrad",
    "reshard", "ReshardStats", "current_plan", "propose_rebalance", "LoadStats", "DistributedModelParallel",
    "Calibration", "calibrate", "load_table_configs",
    "EmbOptimType", "ShardingEnv", "ModuleSharder", "EmbeddingBagCollectionSharder", "EmbeddingCollectionSharder",
    "EmbeddingShardingPlanner", "EmbeddingModuleShardingPlan", "ParameterConstraints", "ShardingPlan", "Topology",
    "Awaitable", "LazyAwaitable", "EmbeddingComputeKernel", "FusedEmbeddingBagCollection",
    "CommType", "QCommsConfig", "get_qcomm_codecs_registry",
]
