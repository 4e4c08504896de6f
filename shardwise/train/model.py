"""The DLRM-style model: bottom MLP on dense features, embedding bags on sparse ones, pairwise dot
interaction, top MLP.

The sparse part (a sharded EmbeddingBagCollection with its fused optimizer) and the dense part
(:class:`DenseArch`, data parallel) are separate modules: the worker runs the dense step on the
pooled embeddings as an input and feeds the gradient of that input back into the sparse backward.

Example:
    >>> arch = DenseArch(num_sparse=26, dim=16)
    >>> arch(torch.zeros(4, 13), torch.zeros(4, 26 * 16)).shape
    torch.Size([4])
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from ..embedding import EmbeddingBagCollection, EmbeddingBagConfig
from .data import NUM_DENSE, SPARSE_NAMES

__all__ = ["DenseArch", "make_tables", "make_ebc", "auc"]


def _mlp(sizes: Sequence[int], last_relu: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if last_relu or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DenseArch(nn.Module):
    """Bottom MLP (13 -> ... -> dim), dot products of every pair among the dense vector and the
    ``num_sparse`` pooled embeddings, then the top MLP down to one logit per example.

    Example:
        >>> DenseArch(num_sparse=2, dim=4, bottom=(8,), top=(8,))(torch.ones(3, 13), torch.ones(3, 8)).shape
        torch.Size([3])
    """

    def __init__(self, num_sparse: int, dim: int, bottom: Sequence[int] = (64,), top: Sequence[int] = (64, 32)):
        super().__init__()
        self.num_sparse, self.dim = num_sparse, dim
        self.bottom = _mlp([NUM_DENSE, *bottom, dim], last_relu=True)
        n = num_sparse + 1
        self.num_pairs = n * (n - 1) // 2
        self.top = _mlp([dim + self.num_pairs, *top, 1], last_relu=False)
        # Pair indices as a buffer (not recomputed per step) so traced graphs see a constant-shape input.
        iu = torch.triu_indices(n, n, offset=1)
        self.register_buffer("pair_index", iu[0] * n + iu[1], persistent=False)

    def forward(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        b = dense.shape[0]
        x = self.bottom(dense)
        feats = torch.cat([x.unsqueeze(1), pooled.reshape(b, self.num_sparse, self.dim)], dim=1)
        dots = torch.bmm(feats, feats.transpose(1, 2)).reshape(b, -1)
        inter = torch.index_select(dots, 1, self.pair_index)
        return self.top(torch.cat([x, inter], dim=1)).squeeze(1)


def make_tables(cardinalities: Sequence[int], dim: int) -> list[EmbeddingBagConfig]:
    """One table per categorical feature: ``t_C1`` looked up by ``C1`` and so on.

    Example:
        >>> t = make_tables([10] * 26, 8)[0]
        >>> t.name, t.num_embeddings, t.embedding_dim, t.feature_names
        ('t_C1', 10, 8, ('C1',))
    """
    return [EmbeddingBagConfig(name=f"t_{f}", num_embeddings=int(c), embedding_dim=dim, feature_names=[f]) for f, c in zip(SPARSE_NAMES, cardinalities)]


def make_ebc(cardinalities: Sequence[int], dim: int, seed: int) -> EmbeddingBagCollection:
    """The unsharded collection, initialised from ``seed`` (identically on every rank)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return EmbeddingBagCollection(make_tables(cardinalities, dim))


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve by ranks (Mann-Whitney U), ties counted half; nan if one class is absent.

    Example:
        >>> auc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0., 0., 1., 1.]))
        0.75
    """
    scores, labels = scores.detach().double().flatten(), labels.detach().flatten() > 0.5
    n_pos = int(labels.sum())
    n_neg = labels.numel() - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = torch.argsort(scores)
    s = scores[order]
    # average rank (1-based) over each run of tied scores
    new = torch.ones_like(s, dtype=torch.bool)
    new[1:] = s[1:] != s[:-1]
    group = torch.cumsum(new.long(), 0) - 1
    counts = torch.bincount(group).double()
    ends = torch.cumsum(counts, 0)
    avg = ends - (counts - 1) / 2
    ranks = torch.empty_like(s)
    ranks[order] = avg[group]
    u = ranks[labels].sum().item() - n_pos * (n_pos + 1) / 2
    return u / (n_pos * n_neg)
