"""The DLRM-style model: bottom MLP on dense features, embedding bags on sparse ones, pairwise dot
interaction, top MLP -- built from the model zoo's parts (:mod:`shardwise.models.dlrm`, TorchRec's
DLRM), so the job and a TorchRec-style ``DLRM`` share one model code path.

The sparse part (a sharded EmbeddingBagCollection with its fused optimizer) and the dense part
(:class:`DLRMDense`, data parallel) are separate modules: the worker runs the dense step on the
pooled embeddings as an input and feeds the gradient of that input back into the sparse backward.

Example:
    >>> arch = DLRMDense(num_sparse=26, dim=16)
    >>> arch(torch.zeros(4, 13), torch.zeros(4, 26 * 16)).shape
    torch.Size([4])
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np
import torch
from torch import nn

from ..embedding import EmbeddingBagCollection, EmbeddingBagConfig
from ..models.arches import DenseArch, InteractionArch, OverArch
from .data import NUM_DENSE, SPARSE_NAMES

__all__ = ["DLRMDense", "pre_zoo_names", "make_tables", "make_ebc", "auc"]


class DLRMDense(nn.Module):
    """The dense half of TorchRec's ``DLRM``: ``dense_arch`` (13 -> ``bottom`` -> dim, ReLU after each
    layer), ``inter_arch`` (the dense vector and the dot product of every pair among it and the
    ``num_sparse`` pooled embeddings), ``over_arch`` (``top``, then one logit per example). Its
    parameter names are those of ``DLRM`` without the ``sparse_arch``; the pooled embeddings come in
    as one B x (num_sparse * dim) tensor in feature order.

    A state dict from before the zoo (``bottom.N`` / ``top.N`` keys) loads into it (keys mapped; the
    job's checkpoints of that time likewise, see :func:`pre_zoo_names`).

    Example:
        >>> DLRMDense(num_sparse=2, dim=4, bottom=(8,), top=(8,))(torch.ones(3, 13), torch.ones(3, 8)).shape
        torch.Size([3])
    """

    def __init__(self, num_sparse: int, dim: int, bottom: Sequence[int] = (64,), top: Sequence[int] = (64, 32)):
        super().__init__()
        if not top:
            raise ValueError("DLRMDense: top=() leaves the over arch without a hidden layer; give at least one "
                             "size, e.g. top=(64,)")
        self.num_sparse, self.dim = num_sparse, dim
        self.dense_arch = DenseArch(NUM_DENSE, [*bottom, dim])
        self.inter_arch = InteractionArch(num_sparse_features=num_sparse)
        n = num_sparse + 1
        self.over_arch = OverArch(dim + n * (n - 1) // 2, [*top, 1])
        self._legacy = {old: new for new, old in pre_zoo_names(n for n, _ in self.named_parameters()).items()}
        self._register_load_state_dict_pre_hook(self._map_legacy_keys)

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        x = self.dense_arch(dense)
        inter = self.inter_arch(x, pooled.reshape(dense.shape[0], self.num_sparse, self.dim))
        return self.over_arch(inter).squeeze(1)

    def _map_legacy_keys(self, state_dict, prefix, *args) -> None:
        for key in [k for k in state_dict if k.startswith(prefix)]:
            new = self._legacy.get(key[len(prefix):])
            if new is not None:
                state_dict[prefix + new] = state_dict.pop(key)


_ZOO_MLP = re.compile(r"^(dense_arch\.model|over_arch\.model\.0)\._mlp\.(\d+)\._linear\.(weight|bias)$")
_ZOO_LAST = re.compile(r"^over_arch\.model\.1\.(weight|bias)$")


def pre_zoo_names(names) -> dict:
    """``{name: name before the zoo}`` for :class:`DLRMDense` parameter names: the layers were
    ``nn.Sequential`` Linear/ReLU pairs, ``bottom.{2i}`` and ``top.{2i}`` (checkpoints of that time).

    Example:
        >>> pre_zoo_names([n for n, _ in DLRMDense(2, 4, bottom=(8,), top=(8,)).named_parameters()])["over_arch.model.1.bias"]
        'top.2.bias'
    """
    names = list(names)
    top_layers = sum(1 for n in names if _ZOO_MLP.match(n) and n.startswith("over_arch") and n.endswith("weight"))
    out = {}
    for n in names:
        m, last = _ZOO_MLP.match(n), _ZOO_LAST.match(n)
        if m:
            out[n] = f"{'bottom' if m[1].startswith('dense') else 'top'}.{2 * int(m[2])}.{m[3]}"
        elif last:
            out[n] = f"top.{2 * top_layers}.{last[1]}"
    return out


def make_tables(cardinalities: Sequence[int], dim: int) -> list[EmbeddingBagConfig]:
    """One table per categorical feature: ``t_C1`` looked up by ``C1`` and so on.

    Example:
        >>> t = make_tables([10] * 26, 8)[0]
        >>> t.name, t.num_embeddings, t.embedding_dim, t.feature_names
        ('t_C1', 10, 8, ('C1',))
    """
    return [EmbeddingBagConfig(name=f"t_{f}", num_embeddings=int(c), embedding_dim=dim, feature_names=[f]) for f, c in zip(SPARSE_NAMES, cardinalities)]


def make_ebc(cardinalities: Sequence[int], dim: int, seed: int) -> EmbeddingBagCollection:
    """The collection on the meta device: no rank ever builds a whole table; ``shard()`` draws each
    rank's own shards from ``seed`` (the same values under any plan or world size)."""
    return EmbeddingBagCollection(make_tables(cardinalities, dim), device="meta", init_seed=seed)


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve by ranks (Mann-Whitney U), ties counted half; nan if one class is absent.

    Example:
        >>> auc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0., 0., 1., 1.]))
        0.75
    """
    s = scores.detach().double().flatten().cpu().numpy()
    y = labels.detach().flatten().cpu().numpy() > 0.5
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    # numpy's sort (vectorised on x86) is ~4x torch's on the log steps' few thousand scores
    order = np.argsort(s)
    s, y = s[order], y[order]
    starts = np.flatnonzero(np.concatenate(([True], s[1:] != s[:-1])))   # each run of tied scores
    ends = np.append(starts[1:], s.size)
    pos_before = np.concatenate(([0], np.cumsum(y, dtype=np.int64)))
    pos = pos_before[ends] - pos_before[starts]
    neg = (ends - starts) - pos
    # 2U in integers: each positive counts the negatives below its run, and half of those tied with it;
    # one correctly rounded division, as the rank-sum form gives
    twice_u = int(np.dot(pos, 2 * (starts - pos_before[starts]) + neg))
    return twice_u / (2 * n_pos * n_neg)
