"""The parts of TorchRec's DLRM family (``torchrec.models.dlrm``), written for shardwise: the same
constructor arguments, attribute and parameter names, initialisation order and outputs.

Shapes: B examples, F sparse features, D the embedding dimension (every table alike).

Example:
    >>> import torch
    >>> dense = DenseArch(in_features=13, layer_sizes=[16, 8])(torch.randn(4, 13))    # B x D
    >>> inter = InteractionArch(num_sparse_features=3)(dense, torch.randn(4, 3, 8))
    >>> inter.shape                                   # B x (D + F + F choose 2)
    torch.Size([4, 14])
    >>> OverArch(14, [6, 1])(inter).shape
    torch.Size([4, 1])
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn

from ..modules import MLP

__all__ = ["choose", "bag_configs", "SparseArch", "DenseArch", "InteractionArch", "InteractionDCNArch",
           "InteractionProjectionArch", "OverArch"]


def choose(n: int, k: int) -> int:
    """``n`` choose ``k`` (0 outside ``0 <= k <= n``), as TorchRec's ``choose``.

    >>> choose(26, 2), choose(2, 3)
    (325, 0)
    """
    if not 0 <= k <= n:
        return 0
    out = 1
    for i in range(min(k, n - k)):
        out = out * (n - i) // (i + 1)
    return out


def bag_configs(collection) -> list:
    """The table configs of an embedding-bag collection (unsharded or sharded, shardwise's or one
    exposing TorchRec's ``embedding_bag_configs()``)."""
    if hasattr(collection, "embedding_bag_configs"):
        return list(collection.embedding_bag_configs())
    if hasattr(collection, "tables"):
        return list(collection.tables)
    raise TypeError(f"{type(collection).__name__} is not an embedding-bag collection (it has neither "
                    f"embedding_bag_configs() nor tables); pass an EmbeddingBagCollection")


class SparseArch(nn.Module):
    """Pooled lookups of every feature of ``embedding_bag_collection``, as one B x F x D tensor in the
    order of the tables' feature names (a sharded collection's output is put back in that order).

    Example:
        >>> from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig
        >>> from shardwise.sparse import KeyedJaggedTensor
        >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig(10, 3, "t1", feature_names=["f1"]),
        ...                               EmbeddingBagConfig(10, 3, "t2", feature_names=["f2"])])
        >>> kjt = KeyedJaggedTensor.from_offsets_sync(["f1", "f2"], torch.tensor([0, 1, 2, 3, 4, 5, 6, 7]),
        ...                                           torch.tensor([0, 2, 2, 3, 4, 5, 8]))
        >>> SparseArch(ebc)(kjt).shape
        torch.Size([3, 2, 3])
    """

    def __init__(self, embedding_bag_collection: nn.Module):
        super().__init__()
        self.embedding_bag_collection = embedding_bag_collection
        configs = bag_configs(embedding_bag_collection)
        if not configs:
            raise ValueError("SparseArch: the embedding bag collection has no tables; it needs at least one")
        self.D = configs[0].embedding_dim
        self._sparse_feature_names = [f for c in configs for f in c.feature_names]
        self.F = len(self._sparse_feature_names)

    @property
    def sparse_feature_names(self) -> list:
        return self._sparse_feature_names

    def forward(self, features) -> torch.Tensor:
        pooled = self.embedding_bag_collection(features).to_dict()
        return torch.cat([pooled[f] for f in self._sparse_feature_names], dim=1).reshape(-1, self.F, self.D)


class DenseArch(nn.Module):
    """The bottom MLP: ``in_features`` dense inputs -> ``layer_sizes`` (ReLU after every layer).

    Example:
        >>> DenseArch(10, layer_sizes=[15, 3])(torch.rand(20, 10)).shape
        torch.Size([20, 3])
    """

    def __init__(self, in_features: int, layer_sizes: Sequence[int], device: Optional[torch.device] = None):
        super().__init__()
        self.model = MLP(in_features, list(layer_sizes), bias=True, activation="relu", device=device)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.model(features)


class InteractionArch(nn.Module):
    """The dense vector (B x D) concatenated with the dot product of every pair among it and the F
    sparse vectors (B x F x D): B x (D + F + F choose 2), pairs in row-major upper-triangle order.

    Example:
        >>> InteractionArch(2)(torch.ones(1, 3), torch.ones(1, 2, 3))
        tensor([[1., 1., 1., 3., 3., 3.]])
    """

    def __init__(self, num_sparse_features: int):
        super().__init__()
        self.F = num_sparse_features
        n = num_sparse_features + 1
        self.register_buffer("triu_indices", torch.triu_indices(n, n, offset=1), persistent=False)
        # the same pairs as positions in the flattened n x n products: index_select on a constant
        # buffer (a shape every traced graph sees alike) instead of advanced indexing
        self.register_buffer("_pair_index", self.triu_indices[0] * n + self.triu_indices[1], persistent=False)

    def forward(self, dense_features: torch.Tensor, sparse_features: torch.Tensor) -> torch.Tensor:
        if self.F <= 0:
            return dense_features
        b = dense_features.shape[0]
        combined = torch.cat([dense_features.unsqueeze(1), sparse_features], dim=1)
        dots = torch.bmm(combined, combined.transpose(1, 2)).reshape(b, -1)
        return torch.cat([dense_features, torch.index_select(dots, 1, self._pair_index)], dim=1)


class InteractionDCNArch(nn.Module):
    """The dense and sparse vectors flattened together (B x (F + 1) * D) through ``crossnet`` (a
    :class:`~shardwise.modules.LowRankCrossNet` in DLRM_DCN); same size out.

    Example:
        >>> from shardwise.modules import LowRankCrossNet
        >>> arch = InteractionDCNArch(2, LowRankCrossNet(in_features=9, num_layers=2, low_rank=4))
        >>> arch(torch.rand(10, 3), torch.rand(10, 2, 3)).shape
        torch.Size([10, 9])
    """

    def __init__(self, num_sparse_features: int, crossnet: nn.Module):
        super().__init__()
        self.F, self.crossnet = num_sparse_features, crossnet

    def forward(self, dense_features: torch.Tensor, sparse_features: torch.Tensor) -> torch.Tensor:
        if self.F <= 0:
            return dense_features
        combined = torch.cat([dense_features.unsqueeze(1), sparse_features], dim=1)
        return self.crossnet(combined.reshape(dense_features.shape[0], -1))


class InteractionProjectionArch(nn.Module):
    """Two MLP branches over the flattened dense and sparse vectors, read as B x F1 x D and
    B x D x F2 and multiplied; the dense vector concatenated with the flattened F1 x F2 product.

    Example:
        >>> arch = InteractionProjectionArch(2, DenseArch(9, [6]), DenseArch(9, [12]))
        >>> arch(torch.rand(5, 3), torch.rand(5, 2, 3)).shape      # D + F1 * F2 = 3 + 2 * 4
        torch.Size([5, 11])
    """

    def __init__(self, num_sparse_features: int, interaction_branch1: nn.Module, interaction_branch2: nn.Module):
        super().__init__()
        self.F = num_sparse_features
        self.interaction_branch1, self.interaction_branch2 = interaction_branch1, interaction_branch2

    def forward(self, dense_features: torch.Tensor, sparse_features: torch.Tensor) -> torch.Tensor:
        if self.F <= 0:
            return dense_features
        b, d = dense_features.shape
        flat = torch.cat([dense_features.unsqueeze(1), sparse_features], dim=1).reshape(b, -1)
        y = self.interaction_branch1(flat).reshape(b, -1, d)
        z = self.interaction_branch2(flat).reshape(b, d, -1)
        return torch.cat([dense_features, torch.bmm(y, z).reshape(b, -1)], dim=1)


class OverArch(nn.Module):
    """The top MLP: ReLU layers ``layer_sizes[:-1]``, then a linear layer to ``layer_sizes[-1]``
    (at least two sizes).

    Example:
        >>> OverArch(10, [5, 1])(torch.rand(20, 10)).shape
        torch.Size([20, 1])
    """

    def __init__(self, in_features: int, layer_sizes: Sequence[int], device: Optional[torch.device] = None):
        super().__init__()
        layer_sizes = list(layer_sizes)
        if len(layer_sizes) <= 1:
            raise ValueError(f"OverArch: layer_sizes={layer_sizes!r} needs at least two sizes (hidden layers, "
                             f"then the output size), e.g. [64, 1]")
        self.model = nn.Sequential(MLP(in_features, layer_sizes[:-1], bias=True, activation="relu", device=device),
                                   nn.Linear(layer_sizes[-2], layer_sizes[-1], bias=True, device=device))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.model(features)
