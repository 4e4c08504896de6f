"""Table configs and the unsharded collections (plain PyTorch, the ground truth)."""

from .bag_collection import EmbeddingBagCollection, check_features, pool_bags
from .config import BaseEmbeddingConfig, DataType, EmbeddingBagConfig, EmbeddingConfig, PoolingType, check_tables
from .embedding_collection import EmbeddingCollection

__all__ = ["DataType", "BaseEmbeddingConfig", "EmbeddingBagConfig", "EmbeddingConfig", "PoolingType",
           "EmbeddingBagCollection", "EmbeddingCollection", "check_tables", "check_features", "pool_bags"]
