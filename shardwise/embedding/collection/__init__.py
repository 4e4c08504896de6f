"""Table configs and the unsharded embedding-bag collection (plain PyTorch, the ground truth)."""

from .bag_collection import EmbeddingBagCollection, check_features, pool_bags
from .config import DataType, EmbeddingBagConfig, PoolingType, check_tables

__all__ = ["DataType", "EmbeddingBagConfig", "PoolingType", "EmbeddingBagCollection", "check_tables", "check_features",
           "pool_bags"]
