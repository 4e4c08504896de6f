"""Variable batch per feature (VBE) for the bag collections, as TorchRec's EmbeddingBagCollection
takes it: feature ``f`` holds ``stride_per_key()[f]`` bags, and ``inverse_indices = (keys, [keys, B])``
maps each of the batch's ``B`` samples to one of them (deduplicated bags). The output is ``[B, dims]``:
row ``b`` of feature ``f`` is the pooled bag ``inverse_indices[f][b]``, and the backward sums the
gradients of the samples that share a bag.

The collections pool the bags of a VBE batch padded to a common count (empty bags after each
feature's own, so only the deduplicated ids are looked up and, sharded, sent), then expand each
feature's rows through its inverse indices.

Example:
    >>> import torch
    >>> from shardwise.sparse import KeyedJaggedTensor
    >>> kjt = KeyedJaggedTensor(["a", "b"], torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 1, 1]),
    ...                         stride_per_key_per_rank=[[1], [2]],
    ...                         inverse_indices=(["a", "b"], torch.tensor([[0, 0, 0], [1, 0, 1]])))
    >>> padded, vbe = split_variable_batch(kjt)
    >>> padded.stride(), padded.lengths().tolist(), vbe.batch
    (2, [1, 0, 1, 1], 3)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ...sparse import KeyedJaggedTensor

__all__ = ["VariableBatch", "split_variable_batch"]


@dataclass
class VariableBatch:
    """Each feature's inverse indices (sample -> bag) and the batch size ``B`` they give."""

    inverse: dict
    batch: int

    def expand(self, feature: str, pooled: torch.Tensor) -> torch.Tensor:
        """``[B, dim]`` rows of one feature from its pooled bags (zeros for a feature not in the batch)."""
        idx = self.inverse.get(feature)
        if idx is None:
            # still a function of ``pooled``: a sharded module's backward must reach every group's
            # collectives on every rank, whichever features this rank's batch holds
            return pooled.new_zeros(self.batch, pooled.shape[1]) + pooled.sum() * 0
        return pooled.index_select(0, idx.to(pooled.device))


def split_variable_batch(kjt: KeyedJaggedTensor) -> tuple[KeyedJaggedTensor, Optional[VariableBatch]]:
    """``(kjt, None)`` for a plain batch; for a VBE batch, the same bags padded to the largest per-key
    count as a plain KeyedJaggedTensor and the :class:`VariableBatch` that expands the output.
    Raises ValueError when a VBE batch has no usable ``inverse_indices``."""
    if not isinstance(kjt, KeyedJaggedTensor) or not kjt.variable_stride_per_key():
        return kjt, None
    keys, strides = kjt.keys(), kjt.stride_per_key()
    inv = kjt.inverse_indices_or_none()
    if inv is None:
        raise ValueError("a KeyedJaggedTensor with a variable batch per feature (VBE: stride_per_key_per_rank) "
                         "needs inverse_indices=(keys, tensor[keys, batch]) mapping each sample to one of its "
                         "feature's bags, as TorchRec's EmbeddingBagCollection does; pass them, or give every "
                         "feature the same batch size")
    inv_keys, table = inv
    missing = [k for k in keys if k not in inv_keys]
    if table.dim() != 2 or missing:
        raise ValueError(f"VBE inverse_indices must be (keys, tensor[len(keys), batch]) naming every feature of the "
                         f"batch; got keys {list(inv_keys)} and a tensor of shape {tuple(table.shape)} for features "
                         f"{keys}" + (f" (missing {missing})" if missing else ""))
    # the KeyedJaggedTensor checked already that each index points at one of its key's bags
    inverse = {k: table[i] for i, k in enumerate(inv_keys) if k in keys}
    width = max(strides, default=0)
    parts = torch.split(kjt.lengths(), strides)
    lengths = torch.cat([torch.cat([p, p.new_zeros(width - p.numel())]) for p in parts]) if parts \
        else kjt.lengths()
    padded = KeyedJaggedTensor(keys, kjt.values(), weights=kjt.weights_or_none(), lengths=lengths, stride=width)
    return padded, VariableBatch(inverse, int(table.shape[1]))
