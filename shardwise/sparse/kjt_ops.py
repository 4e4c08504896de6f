"""KeyedJaggedTensor operations that slice or join whole keys: split, permute, concat, per-key views.

Each works for a common batch and for a variable batch per key (VBE) alike: a key's lengths are the
``lengths_offset_per_key()`` slice, its values the ``offset_per_key()`` slice.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from .jagged import JaggedTensor

__all__ = ["key_jagged", "split", "permute", "concat_kjts", "from_jt_dict", "empty_like"]


def _new(kjt, keys, values, weights, lengths, per_rank: Optional[torch.Tensor], inverse=None):
    return type(kjt)(keys, values, weights, lengths, stride=kjt.stride(),
                     stride_per_key_per_rank=per_rank, inverse_indices=inverse)


def key_jagged(kjt, key: str) -> JaggedTensor:
    """``kjt[key]``: that key's bags as a JaggedTensor (views of the KJT's tensors)."""
    i = kjt.index_per_key().get(key) if isinstance(key, str) else None
    if i is None:
        raise KeyError(f"feature {key!r} is not in this KeyedJaggedTensor (keys: {kjt.keys()})")
    v0, v1 = kjt.offset_per_key()[i:i + 2]
    l0, l1 = kjt.lengths_offset_per_key()[i:i + 2]
    w = kjt.weights_or_none()
    return JaggedTensor(kjt.values()[v0:v1], None if w is None else w[v0:v1], kjt.lengths()[l0:l1])


def split(kjt, segments: Sequence[int]) -> list:
    """Consecutive groups of keys of the given sizes (sizes must sum to the number of keys)."""
    segments = list(segments)
    keys = kjt.keys()
    if any((not isinstance(s, int)) or s < 0 for s in segments) or sum(segments) != len(keys):
        raise ValueError(f"split segments {segments} must be non-negative ints summing to the number of "
                         f"keys ({len(keys)})")
    per_key, per_len = kjt.offset_per_key(), kjt.lengths_offset_per_key()
    per_rank = kjt._strides.per_key_per_rank
    w = kjt.weights_or_none()
    out, k = [], 0
    for seg in segments:
        v0, v1 = per_key[k], per_key[k + seg]
        out.append(_new(kjt, keys[k:k + seg], kjt.values()[v0:v1], None if w is None else w[v0:v1],
                        kjt.lengths()[per_len[k]:per_len[k + seg]],
                        None if per_rank is None else per_rank[k:k + seg]))
        k += seg
    return out


def permute(kjt, indices: Sequence[int]):
    """Reorder (or select) keys: the result's key j is ``kjt``'s key ``indices[j]``."""
    indices = list(indices)
    keys = kjt.keys()
    n = len(keys)
    for i in indices:
        if not isinstance(i, int) or not 0 <= i < n:
            raise ValueError(f"permute index {i!r} is out of range for {n} keys; use 0..{n - 1}")
    per_key, per_len = kjt.offset_per_key(), kjt.lengths_offset_per_key()
    values, lengths, w = kjt.values(), kjt.lengths(), kjt.weights_or_none()

    def gather(t: torch.Tensor, bounds: list) -> torch.Tensor:
        return torch.cat([t[bounds[i]:bounds[i + 1]] for i in indices]) if indices else t[:0]

    per_rank = kjt._strides.per_key_per_rank
    return _new(kjt, [keys[i] for i in indices], gather(values, per_key),
                None if w is None else gather(w, per_key), gather(lengths, per_len),
                None if per_rank is None else per_rank[indices])


def _concat_check(kjt_list) -> None:
    if not isinstance(kjt_list, (list, tuple)) or not kjt_list:
        raise ValueError(f"concat needs a non-empty list of KeyedJaggedTensors, got {kjt_list!r}")
    weighted = [k.weights_or_none() is not None for k in kjt_list]
    if any(weighted) and not all(weighted):
        raise ValueError(f"concat: weighted and unweighted KeyedJaggedTensors mixed (weighted: {weighted}); "
                         f"weight all or none")
    vbe = [k.variable_stride_per_key() for k in kjt_list]
    if any(vbe) and not all(vbe):
        raise ValueError(f"concat: variable-batch (VBE) and fixed-batch KeyedJaggedTensors mixed ({vbe}); "
                         f"convert all to one kind")
    strides = [k.stride() for k in kjt_list]
    if not any(vbe) and len(set(strides)) > 1:
        raise ValueError(f"concat: batch sizes differ {strides}; every KeyedJaggedTensor needs the same stride()")
    inv = [k.inverse_indices_or_none() is not None for k in kjt_list]
    if any(inv) and not all(inv):
        raise ValueError("concat: some KeyedJaggedTensors have inverse_indices and others not; give all or none")


def concat_kjts(kjt_list):
    """The keys of all of ``kjt_list`` side by side, in order."""
    _concat_check(kjt_list)
    first = kjt_list[0]
    vbe = first.variable_stride_per_key()
    w = None
    if first.weights_or_none() is not None:
        w = torch.cat([k.weights() for k in kjt_list])
    inverse = None
    if first.inverse_indices_or_none() is not None:
        inverse = ([key for k in kjt_list for key in k.inverse_indices()[0]],
                   torch.cat([k.inverse_indices()[1] for k in kjt_list]))
    per_rank = None
    if vbe:
        rows = [k._strides.per_key_per_rank for k in kjt_list]
        if len({r.shape[1] for r in rows}) > 1:
            raise ValueError(f"concat: stride_per_key_per_rank have different numbers of ranks "
                             f"{[r.shape[1] for r in rows]}; build them over the same ranks")
        per_rank = torch.cat(rows)
    # cached per-key sizes stay cached (TorchRec code reads them after concat); checked on construction
    known = [k.length_per_key_or_none() for k in kjt_list]
    length_per_key = None if any(n is None for n in known) else [n for per in known for n in per]
    return type(first)([key for k in kjt_list for key in k.keys()], torch.cat([k.values() for k in kjt_list]), w,
                       torch.cat([k.lengths() for k in kjt_list]),
                       stride=None if vbe else first.stride(), stride_per_key_per_rank=per_rank,
                       length_per_key=length_per_key, inverse_indices=inverse)


def from_jt_dict(jts: dict):
    """``{key: JaggedTensor}`` -> KeyedJaggedTensor (every JaggedTensor holds the same batch size)."""
    from .keyed_jagged import KeyedJaggedTensor   # that module imports this one
    if not isinstance(jts, dict) or not jts:
        raise ValueError("from_jt_dict needs at least one key; use KeyedJaggedTensor([], ..., stride=B)")
    sizes = {k: len(jt) for k, jt in jts.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"from_jt_dict: batch sizes differ per key {sizes}; give every key the same batch, or "
                         f"build a variable-batch KeyedJaggedTensor with stride_per_key_per_rank")
    weighted = [jt.weights_or_none() is not None for jt in jts.values()]
    if any(weighted) and not all(weighted):
        raise ValueError("from_jt_dict: some JaggedTensors have weights and others not; weight all or none")
    values = torch.cat([jt.values() for jt in jts.values()])
    lengths = torch.cat([jt.lengths() for jt in jts.values()])
    weights = torch.cat([jt.weights() for jt in jts.values()]) if all(weighted) else None
    return KeyedJaggedTensor(list(jts), values, weights, lengths).sync()


def empty_like(kjt, device=None):
    """See ``KeyedJaggedTensor.empty_like``."""
    w = kjt.weights_or_none()
    per_rank = kjt._strides.per_key_per_rank
    if device is None:
        # no keys: a VBE KJT keeps only its stride (a per-rank table needs one row per key)
        return type(kjt)([], kjt.values().new_empty(0), None if w is None else w.new_empty(0),
                         kjt.lengths().new_empty(0), stride=kjt.stride())
    inv = kjt.inverse_indices_or_none()
    if inv is not None:
        inv = (inv[0], torch.empty_like(inv[1], device=device))
    return type(kjt)(kjt.keys(), torch.empty_like(kjt.values(), device=device),
                     None if w is None else torch.empty_like(w, device=device), kjt.lengths().to(device),
                     stride=kjt.stride(), stride_per_key_per_rank=per_rank, inverse_indices=inv)
