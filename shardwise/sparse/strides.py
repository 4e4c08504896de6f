"""Batch-size bookkeeping of a KeyedJaggedTensor: one batch for all keys, or one per key (VBE).

Variable batch per feature ("VBE", TorchRec's name) means key ``k`` has ``stride_per_key[k]`` bags
instead of a common B; ``stride_per_key_per_rank[k][r]`` says how many of them came from rank ``r``
(so ``stride_per_key[k]`` is the row sum). ``inverse_indices = (keys, t)`` with ``t`` of shape
``[len(keys), B]`` maps each of the B samples to one of its key's (deduplicated) bags.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

__all__ = ["Strides", "resolve_strides", "check_inverse_indices", "check_inverse_range"]


@dataclass
class Strides:
    """The resolved batch sizes: ``per_key`` always; ``per_key_per_rank`` only for VBE."""

    stride: int
    per_key: list
    per_key_per_rank: Optional[torch.Tensor]   # int32 [F, R] on CPU, or None

    @property
    def variable(self) -> bool:
        return self.per_key_per_rank is not None


def _per_rank_tensor(spkpr, n_keys: int) -> torch.Tensor:
    if isinstance(spkpr, torch.Tensor):
        t = spkpr.detach().to("cpu")
    else:
        try:
            t = torch.tensor([list(row) for row in spkpr], dtype=torch.int32)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"KeyedJaggedTensor: stride_per_key_per_rank must be a list of lists of ints "
                            f"(one list per key), got {spkpr!r}") from exc
    if t.numel() == 0 and t.dim() < 2:
        t = t.reshape(n_keys, 0)
    if t.dim() != 2 or t.shape[0] != n_keys or t.dtype.is_floating_point:
        raise ValueError(f"KeyedJaggedTensor: stride_per_key_per_rank must hold one row of int batch sizes "
                         f"per key ({n_keys} rows), got {t.tolist()}; e.g. [[2], [4]] for two keys")
    if t.numel() and bool((t < 0).any()):
        raise ValueError(f"KeyedJaggedTensor: stride_per_key_per_rank must be >= 0, got {t.tolist()}")
    return t.to(torch.int32)


def _check_stride_int(stride) -> None:
    if not isinstance(stride, int) or isinstance(stride, bool) or stride < 0:
        raise ValueError(f"KeyedJaggedTensor: stride must be a non-negative int, got {stride!r}")


def resolve_strides(keys: list, n_lengths: int, stride, stride_per_key, spkpr, inverse_indices) -> Strides:
    """Check the batch-size arguments against the number of lengths; return the resolved strides."""
    nk = len(keys)
    if spkpr is None and stride_per_key is not None and len(set(stride_per_key)) > 1:
        spkpr = [[int(s)] for s in stride_per_key]   # uneven per-key strides are VBE on one rank
    if spkpr is not None:
        t = _per_rank_tensor(spkpr, nk)
        per_key = t.sum(dim=1).tolist() if nk else []
        if stride_per_key is not None and list(stride_per_key) != per_key:
            raise ValueError(f"KeyedJaggedTensor: stride_per_key {list(stride_per_key)} differs from the row sums "
                             f"of stride_per_key_per_rank {per_key}; pass only one of them")
        if sum(per_key) != n_lengths:
            raise ValueError(f"KeyedJaggedTensor: stride_per_key_per_rank gives {per_key} bags per key "
                             f"({sum(per_key)} in all) but there are {n_lengths} lengths; give one length per bag")
        if stride is None:
            if inverse_indices is not None and inverse_indices[1].numel():
                stride = int(inverse_indices[1].shape[-1])
            else:
                stride = max(per_key, default=0)
        _check_stride_int(stride)
        return Strides(stride, per_key, t)
    if nk:
        if n_lengths % nk:
            raise ValueError(f"KeyedJaggedTensor: {n_lengths} lengths cannot be split evenly over {nk} keys "
                             f"{keys}; pass len(keys) * batch_size lengths (key-major)")
        inferred = n_lengths // nk
        if stride is not None and stride != inferred:
            raise ValueError(f"KeyedJaggedTensor: stride={stride} but {n_lengths} lengths over {nk} keys "
                             f"give batch size {inferred}; drop stride or fix lengths")
        stride = inferred
    else:
        if n_lengths:
            raise ValueError(f"KeyedJaggedTensor: no keys but {n_lengths} lengths; pass the keys of the lengths")
        if stride is None:
            stride = 0   # TorchRec: a KJT without keys holds no bags (batch size 0 unless told)
    _check_stride_int(stride)
    if stride_per_key is not None and list(stride_per_key) != [stride] * nk:
        raise ValueError(f"KeyedJaggedTensor: stride_per_key {list(stride_per_key)} does not match batch size "
                         f"{stride} for {nk} keys; drop it or fix lengths")
    return Strides(stride, [stride] * nk, None)


def check_inverse_indices(inverse_indices, device) -> Optional[tuple]:
    """``(keys, t)``: ``keys`` a list of str, ``t`` an integer tensor ``[len(keys), B]``."""
    if inverse_indices is None:
        return None
    ok = isinstance(inverse_indices, (tuple, list)) and len(inverse_indices) == 2
    keys, t = inverse_indices if ok else (None, None)
    keys_ok = isinstance(keys, (list, tuple)) and all(isinstance(k, str) for k in keys)
    if not ok or not isinstance(t, torch.Tensor) or not keys_ok:
        raise TypeError(f"KeyedJaggedTensor: inverse_indices must be (list of keys, integer tensor [keys, B]), "
                        f"got {type(inverse_indices).__name__}")
    if t.dtype.is_floating_point or (t.dim() == 2 and t.shape[0] != len(keys)) or t.dim() not in (1, 2):
        raise ValueError(f"KeyedJaggedTensor: inverse_indices tensor must be integer [len(keys)={len(keys)}, B], "
                         f"got {t.dtype} {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"KeyedJaggedTensor: inverse_indices are on {t.device} but values on {device}; move them "
                         f"with .to(values.device)")
    return list(keys), t


def check_inverse_range(inverse_indices: Optional[tuple], keys: list, per_key: list) -> None:
    """Each key's inverse indices must point at one of its bags: in ``[0, stride_per_key[k])``."""
    if inverse_indices is None or inverse_indices[1].dim() != 2 or inverse_indices[1].numel() == 0:
        return
    if inverse_indices[1].device.type == "meta":
        return
    inv_keys, t = inverse_indices
    for row, key in zip(t, inv_keys):
        if key not in keys:
            raise ValueError(f"KeyedJaggedTensor: inverse_indices name key {key!r}, which is not in keys {keys}")
        lo, hi = int(row.min()), int(row.max())
        bags = per_key[keys.index(key)]
        if lo < 0 or hi >= bags:
            raise ValueError(f"KeyedJaggedTensor: inverse_indices of {key!r} range over [{lo}, {hi}] but the key has "
                             f"{bags} bags; every index must be in [0, {bags})")
