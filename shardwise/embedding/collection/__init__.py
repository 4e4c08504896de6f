"""Table configs and the unsharded collections (plain PyTorch, the ground truth).

Example:
    >>> import torch; from shardwise.sparse import KeyedJaggedTensor
    >>> from shardwise.embedding.collection import EmbeddingBagCollection, EmbeddingBagConfig
    >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig(10, 4, "t", feature_names=["f"])])
    >>> ebc(KeyedJaggedTensor(["f"], torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 1]))).values().shape
    torch.Size([2, 4])
"""

from .bag_collection import EmbeddingBagCollection, check_features, pool_bags
from .config import BaseEmbeddingConfig, DataType, EmbeddingBagConfig, EmbeddingConfig, PoolingType, check_tables
from .embedding_collection import EmbeddingCollection

__all__ = ["DataType", "BaseEmbeddingConfig", "EmbeddingBagConfig", "EmbeddingConfig", "PoolingType",
           "EmbeddingBagCollection", "EmbeddingCollection", "check_tables", "check_features", "pool_bags"]
