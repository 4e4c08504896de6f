"""TorchRec's DLRM family (``torchrec.models.dlrm``) on shardwise's collections: ``DLRM``,
``DLRM_DCN``, ``DLRM_Projection`` and ``DLRMTrain``, with their parts (re-exported from
:mod:`shardwise.models.arches`). Constructor arguments, attribute and parameter names,
initialisation order and outputs are TorchRec's, so a TorchRec script runs with its imports changed
and a TorchRec state dict loads.

Example:
    >>> import torch
    >>> from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig
    >>> from shardwise.sparse import KeyedJaggedTensor
    >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig(100, 8, "t1", feature_names=["f1"]),
    ...                               EmbeddingBagConfig(100, 8, "t2", feature_names=["f2"])])
    >>> model = DLRM(embedding_bag_collection=ebc, dense_in_features=100, dense_arch_layer_sizes=[20, 8],
    ...              over_arch_layer_sizes=[5, 1])
    >>> kjt = KeyedJaggedTensor.from_offsets_sync(["f1", "f2"], torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]),
    ...                                           torch.tensor([0, 2, 4, 6, 8]))
    >>> model(dense_features=torch.rand(2, 100), sparse_features=kjt).shape
    torch.Size([2, 1])
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn

from ..modules import LowRankCrossNet
from .arches import (
    DenseArch, InteractionArch, InteractionDCNArch, InteractionProjectionArch, OverArch, SparseArch, bag_configs,
    choose,
)

__all__ = ["DLRM", "DLRM_DCN", "DLRM_Projection", "DLRMTrain", "SparseArch", "DenseArch", "InteractionArch",
           "InteractionDCNArch", "InteractionProjectionArch", "OverArch", "choose"]


def _embedding_dim(ebc) -> int:
    configs = bag_configs(ebc)
    if not configs:
        raise ValueError("DLRM: the embedding bag collection has no tables; it needs at least one")
    dims = {c.name: c.embedding_dim for c in configs}
    if len(set(dims.values())) > 1:
        raise ValueError(f"DLRM: every table needs the same embedding_dim (the interaction takes dot products), "
                         f"got {dims}")
    return configs[0].embedding_dim


class DLRM(nn.Module):
    """Bottom MLP on the dense features (:class:`DenseArch`, last size = the embedding dim D), pooled
    lookups (:class:`SparseArch`), pairwise dot products (:class:`InteractionArch`), top MLP
    (:class:`OverArch`). ``forward(dense_features, sparse_features)`` returns B x
    ``over_arch_layer_sizes[-1]`` logits.

    Example:
        >>> from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig
        >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig(10, 4, "t", feature_names=["f"])], device="meta")
        >>> DLRM(ebc, 13, [8, 4], [8, 1]).over_arch.model[1]       # in: D + F + F choose 2 = 4 + 1 + 0
        Linear(in_features=8, out_features=1, bias=True)
    """

    def __init__(self, embedding_bag_collection: nn.Module, dense_in_features: int,
                 dense_arch_layer_sizes: Sequence[int], over_arch_layer_sizes: Sequence[int],
                 dense_device: Optional[torch.device] = None):
        super().__init__()
        dim = _embedding_dim(embedding_bag_collection)
        if list(dense_arch_layer_sizes)[-1:] != [dim]:
            raise ValueError(f"DLRM: the last dense_arch_layer_sizes entry ({list(dense_arch_layer_sizes)}) must "
                             f"equal the tables' embedding_dim {dim}: the dense vector is dotted with the embeddings")
        self.sparse_arch = SparseArch(embedding_bag_collection)
        f = len(self.sparse_arch.sparse_feature_names)
        self.dense_arch = DenseArch(dense_in_features, dense_arch_layer_sizes, device=dense_device)
        self.inter_arch: nn.Module = InteractionArch(num_sparse_features=f)
        self.over_arch = OverArch(dim + choose(f, 2) + f, over_arch_layer_sizes, device=dense_device)

    def forward(self, dense_features: torch.Tensor, sparse_features) -> torch.Tensor:
        embedded_dense = self.dense_arch(dense_features)
        embedded_sparse = self.sparse_arch(sparse_features)
        return self.over_arch(self.inter_arch(dense_features=embedded_dense, sparse_features=embedded_sparse))


class DLRM_Projection(DLRM):
    """DLRM whose interaction is :class:`InteractionProjectionArch`: two MLP branches (their last
    sizes multiples of D) whose outputs are multiplied.

    Example:
        >>> from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig
        >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig(10, 4, "t", feature_names=["f"])], device="meta")
        >>> m = DLRM_Projection(ebc, 13, [8, 4], [8, 1], interaction_branch1_layer_sizes=[8, 8],
        ...                     interaction_branch2_layer_sizes=[8, 12])
        >>> m.over_arch.model[0]._mlp[0]._linear.in_features      # D + (8 / D) * (12 / D)
        10
    """

    def __init__(self, embedding_bag_collection: nn.Module, dense_in_features: int,
                 dense_arch_layer_sizes: Sequence[int], over_arch_layer_sizes: Sequence[int],
                 interaction_branch1_layer_sizes: Sequence[int], interaction_branch2_layer_sizes: Sequence[int],
                 dense_device: Optional[torch.device] = None):
        # built as TorchRec builds it (the plain DLRM first, then the replaced parts), so one seed
        # draws TorchRec's initial values
        super().__init__(embedding_bag_collection, dense_in_features, dense_arch_layer_sizes, over_arch_layer_sizes,
                         dense_device)
        dim = self.sparse_arch.D
        f = len(self.sparse_arch.sparse_feature_names)
        branches = []
        for name, sizes in (("interaction_branch1_layer_sizes", interaction_branch1_layer_sizes),
                            ("interaction_branch2_layer_sizes", interaction_branch2_layer_sizes)):
            if list(sizes)[-1] % dim:
                raise ValueError(f"DLRM_Projection: the last {name} entry ({list(sizes)[-1]}) must be a multiple "
                                 f"of the embedding_dim {dim}")
            branches.append(DenseArch(f * dim + list(dense_arch_layer_sizes)[-1], sizes, device=dense_device))
        self.inter_arch = InteractionProjectionArch(f, branches[0], branches[1])
        f1, f2 = list(interaction_branch1_layer_sizes)[-1] // dim, list(interaction_branch2_layer_sizes)[-1] // dim
        self.over_arch = OverArch(dim + f1 * f2, over_arch_layer_sizes, device=dense_device)


class DLRM_DCN(DLRM):
    """DLRM whose interaction is a low-rank Deep & Cross Network (:class:`InteractionDCNArch` over a
    :class:`~shardwise.modules.LowRankCrossNet` of ``dcn_num_layers`` layers, rank ``dcn_low_rank_dim``).

    Example:
        >>> from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig
        >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig(10, 4, "t", feature_names=["f", "g"])], device="meta")
        >>> m = DLRM_DCN(ebc, 13, [8, 4], [8, 1], dcn_num_layers=2, dcn_low_rank_dim=3)
        >>> m.inter_arch.crossnet.W_kernels[0].shape               # (F + 1) * D x rank
        torch.Size([12, 3])
    """

    def __init__(self, embedding_bag_collection: nn.Module, dense_in_features: int,
                 dense_arch_layer_sizes: Sequence[int], over_arch_layer_sizes: Sequence[int],
                 dcn_num_layers: int, dcn_low_rank_dim: int, dense_device: Optional[torch.device] = None):
        super().__init__(embedding_bag_collection, dense_in_features, dense_arch_layer_sizes, over_arch_layer_sizes,
                         dense_device)
        width = (len(self.sparse_arch.sparse_feature_names) + 1) * self.sparse_arch.D
        crossnet = LowRankCrossNet(in_features=width, num_layers=dcn_num_layers, low_rank=dcn_low_rank_dim)
        self.inter_arch = InteractionDCNArch(len(self.sparse_arch.sparse_feature_names), crossnet)
        self.over_arch = OverArch(width, over_arch_layer_sizes, device=dense_device)


class DLRMTrain(nn.Module):
    """A DLRM-family model (``model``) with its loss for a train pipeline: ``forward(batch)`` (a
    :class:`shardwise.datasets.Batch`) returns ``(loss, (loss.detach(), logits, labels))``, logits
    squeezed to B and detached, loss ``nn.BCEWithLogitsLoss`` (``loss_fn``) against ``labels.float()``.

    Example:
        >>> from shardwise.datasets import RandomRecDataset
        >>> from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig
        >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig(100, 4, "t", feature_names=["f"])])
        >>> train = DLRMTrain(DLRM(ebc, 5, [8, 4], [4, 1]))
        >>> batch = next(iter(RandomRecDataset(["f"], batch_size=3, num_dense=5, manual_seed=0)))
        >>> loss, (detached, logits, labels) = train(batch)
        >>> logits.shape, bool(loss == detached)
        (torch.Size([3]), True)
    """

    def __init__(self, dlrm_module: nn.Module):
        super().__init__()
        self.model = dlrm_module
        self.loss_fn = nn.BCEWithLogitsLoss()

    def forward(self, batch):
        logits = self.model(batch.dense_features, batch.sparse_features).squeeze(-1)
        loss = self.loss_fn(logits, batch.labels.float())
        return loss, (loss.detach(), logits.detach(), batch.labels.detach())
