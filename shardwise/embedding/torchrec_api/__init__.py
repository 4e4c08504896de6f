"""TorchRec-shaped API over the sharded collections: sharders, ``ShardingEnv``, the staged (awaitable)
methods mixed into the sharded collections, ``FusedEmbeddingBagCollection`` and ``EmbeddingComputeKernel``.

The names are also exported by :mod:`shardwise.embedding`, the path to import them from.

Example:
    >>> from shardwise.embedding.torchrec_api import EmbeddingBagCollectionSharder, EmbeddingComputeKernel
    >>> EmbeddingBagCollectionSharder().sharding_types()[:2], EmbeddingComputeKernel.FUSED.value
    (['data_parallel', 'table_wise'], 'fused')
"""

from .compute_kernel import EmbeddingComputeKernel
from .fused_collection import FusedEmbeddingBagCollection
from .sharded_api import TorchRecShardedAPI
from .sharders import EmbeddingBagCollectionSharder, EmbeddingCollectionSharder, ModuleSharder
from .sharding_env import ShardingEnv

__all__ = ["EmbeddingBagCollectionSharder", "EmbeddingCollectionSharder", "ModuleSharder", "ShardingEnv",
           "TorchRecShardedAPI", "FusedEmbeddingBagCollection", "EmbeddingComputeKernel"]
