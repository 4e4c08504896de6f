"""TorchRec's ``Batch`` (``torchrec.datasets.utils``): one training batch of a recommendation model.

Example:
    >>> import torch
    >>> from shardwise.sparse import KeyedJaggedTensor
    >>> b = Batch(torch.zeros(2, 3), KeyedJaggedTensor(["f"], torch.tensor([4, 5]), lengths=torch.tensor([1, 1])),
    ...           torch.tensor([0, 1]))
    >>> b.to(torch.device("cpu")).sparse_features.keys()
    ['f']
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..sparse import KeyedJaggedTensor

__all__ = ["Batch"]


@dataclass
class Batch:
    """``dense_features`` (B x num_dense), ``sparse_features`` (a KeyedJaggedTensor of B bags per key)
    and ``labels`` (B), with TorchRec's ``to``, ``pin_memory`` and ``record_stream``.

    (shardwise's own raw click-log rows are :class:`shardwise.train.data.ClickLogBatch`: numpy
    columns before they become model inputs.)

    Example:
        >>> from shardwise.datasets import RandomRecDataset
        >>> b = next(iter(RandomRecDataset(["f"], batch_size=4, num_dense=2, manual_seed=1)))
        >>> b.dense_features.shape, b.sparse_features.stride(), b.labels.shape
        (torch.Size([4, 2]), 4, torch.Size([4]))
    """

    dense_features: torch.Tensor
    sparse_features: KeyedJaggedTensor
    labels: torch.Tensor

    def to(self, device: torch.device, non_blocking: bool = False) -> "Batch":
        return Batch(self.dense_features.to(device=device, non_blocking=non_blocking),
                     self.sparse_features.to(device=device, non_blocking=non_blocking),
                     self.labels.to(device=device, non_blocking=non_blocking))

    def pin_memory(self) -> "Batch":
        """A copy in page-locked host memory (needs an accelerator build of torch)."""
        return Batch(self.dense_features.pin_memory(), self.sparse_features.pin_memory(), self.labels.pin_memory())

    def record_stream(self, stream) -> None:
        """Mark every tensor as used on ``stream`` (a CUDA stream); nothing to do for host tensors,
        which have no stream."""
        kjt = self.sparse_features
        tensors = [self.dense_features, self.labels, kjt.values(), kjt.lengths(), kjt.weights_or_none()]
        for t in tensors:
            if t is not None and t.is_cuda:
                t.record_stream(stream)
