"""TorchRec's top-level namespace for ported code: ``import shardwise.torchrec_compat as torchrec`` in
place of ``import torchrec``, so ``torchrec.EmbeddingBagCollection(...)``,
``torchrec.KeyedJaggedTensor``, ``torchrec.PoolingType.SUM`` and ``torchrec.distributed.<name>``
resolve to shardwise's. ``distributed`` is :mod:`shardwise.embedding` (the sharded collections,
``DistributedModelParallel`` and the plan types). The module paths below the top level are mapped one
by one in docs/embedding.md ("Coming from TorchRec").

Example:
    >>> import torch, shardwise.torchrec_compat as torchrec
    >>> ebc = torchrec.EmbeddingBagCollection(device="cpu", tables=[torchrec.EmbeddingBagConfig(
    ...     name="t", embedding_dim=4, num_embeddings=10, feature_names=["f"], pooling=torchrec.PoolingType.SUM)])
    >>> kjt = torchrec.KeyedJaggedTensor.from_jt_dict({"f": torchrec.JaggedTensor(values=torch.tensor([1, 2]),
    ...                                                                        lengths=torch.tensor([2]))})
    >>> ebc(kjt).values().shape, torchrec.distributed.DistributedModelParallel.__name__
    (torch.Size([1, 4]), 'DistributedModelParallel')
"""

from . import embedding as distributed
from .embedding import (
    DataType, EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection, EmbeddingConfig, PoolingType,
)
from .sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor

__all__ = ["distributed", "EmbeddingBagCollection", "EmbeddingBagConfig", "EmbeddingCollection", "EmbeddingConfig",
           "PoolingType", "DataType", "JaggedTensor", "KeyedJaggedTensor", "KeyedTensor"]
