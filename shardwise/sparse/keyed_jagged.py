"""KeyedJaggedTensor: many features' bags for one batch, key-major in one flat values tensor.

Constructor order and methods follow TorchRec's ``KeyedJaggedTensor`` so code written for it runs
unchanged; unlike TorchRec every argument is validated on construction (lengths against values,
strides against lengths, caches against what they cache) and lengths/offsets are kept as int64.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from . import kjt_ops
from .fx import SparseMeta
from .jagged import JaggedTensor, _JaggedAccessors, check_jagged
from .strides import Strides, check_inverse_indices, check_inverse_range, resolve_strides
from .text import kjt_string

__all__ = ["KeyedJaggedTensor"]

# recorded as one call each when a module using them is traced (their arguments are lists or
# dicts of sparse values, or they build a KJT from a traced one's parts)
concat_kjts = kjt_ops.concat_kjts
kjt_empty_like = kjt_ops.empty_like
kjt_from_jt_dict = kjt_ops.from_jt_dict
torch.fx.wrap("concat_kjts")
torch.fx.wrap("kjt_empty_like")
torch.fx.wrap("kjt_from_jt_dict")


def _check_keys(keys) -> list[str]:
    if isinstance(keys, str) or not isinstance(keys, Sequence):
        raise TypeError(f"keys must be a list of feature names, got {keys!r}; pass e.g. ['f1', 'f2']")
    keys = list(keys)
    for k in keys:
        if not isinstance(k, str):
            raise TypeError(f"keys must be strings, got {k!r} ({type(k).__name__}); name features with str")
    if len(set(keys)) != len(keys):
        dup = sorted({k for k in keys if keys.count(k) > 1})
        raise ValueError(f"keys must be unique, {dup} appear more than once; merge their bags into one key")
    return keys


def _check_cache(name: str, given, computed) -> None:
    if given is not None and list(given) != list(computed):
        raise ValueError(f"KeyedJaggedTensor: {name}={list(given)} but the lengths give {list(computed)}; "
                         f"drop {name} (it is computed) or fix it")


def _meta_length_per_key(total: int, n_keys: int) -> list[int]:
    # a meta KJT has no lengths to read: the values split as evenly as they go, the remainder to the
    # first key (TorchRec's stand-in), so shape-only code (model init, tracing) can run on it
    out = [total // n_keys] * n_keys
    out[0] += total % n_keys
    return out


class KeyedJaggedTensor(_JaggedAccessors, metaclass=SparseMeta):
    """Bags of ids for several features over one batch.

    Values are laid out key-major: all bags of ``keys[0]`` (sample 0..B-1), then ``keys[1]``...
    ``lengths`` has ``len(keys) * B`` entries, B being the batch size (``stride()``); with a
    variable batch per feature (``stride_per_key_per_rank``) key ``k`` has ``stride_per_key()[k]``.
    Positional order is TorchRec's: ``(keys, values, weights, lengths, offsets, stride, ...)``.

    Example:
        >>> kjt = KeyedJaggedTensor(["f1", "f2"], torch.tensor([1, 2, 3, 4]),
        ...                         lengths=torch.tensor([2, 0, 1, 1]))   # batch of 2
        >>> kjt["f1"].to_dense()
        [tensor([1, 2]), tensor([], dtype=torch.int64)]
        >>> vbe = KeyedJaggedTensor(["f1", "f2"], torch.tensor([1, 2, 3]), None, torch.tensor([2, 0, 1]),
        ...                         stride_per_key_per_rank=[[1], [2]])   # f1: 1 bag, f2: 2 bags
        >>> vbe.stride_per_key(), vbe.variable_stride_per_key()
        ([1, 2], True)
    """

    def __init__(self, keys, values, weights=None, lengths=None, offsets=None, stride=None,
                 stride_per_key_per_rank=None, stride_per_key=None, length_per_key=None,
                 lengths_offset_per_key=None, offset_per_key=None, index_per_key=None, jt_dict=None,
                 inverse_indices=None):
        keys = _check_keys(keys)
        # values of any dtype, as TorchRec's: a KJT is a container (float ids appear in TorchRec's own
        # tests and pipelines); the embedding collections refuse non-integer ids at their forward
        lengths_in, offsets_in = lengths, offsets
        lengths, offsets = check_jagged(values, lengths, offsets, weights, "KeyedJaggedTensor",
                                        values_1d=False)   # TorchRec's take [N, D] values; lookups need 1-D
        inverse_indices = check_inverse_indices(inverse_indices, values.device)
        strides = resolve_strides(keys, lengths.numel(), stride, stride_per_key, stride_per_key_per_rank,
                                  inverse_indices)
        check_inverse_range(inverse_indices, keys, strides.per_key)
        self._keys = keys
        self._values = values
        self._lengths = lengths
        self._offsets = offsets
        self._weights = weights
        self._lengths_given, self._offsets_given = lengths_in is not None, offsets_in is not None
        self._strides = strides
        self._inverse_indices = inverse_indices
        self._length_per_key: Optional[list[int]] = None
        self._offset_per_key: Optional[list[int]] = None
        if length_per_key is not None or offset_per_key is not None:
            _check_cache("length_per_key", length_per_key, self.length_per_key())
            _check_cache("offset_per_key", offset_per_key, self.offset_per_key())
        if lengths_offset_per_key is not None:
            _check_cache("lengths_offset_per_key", lengths_offset_per_key, self.lengths_offset_per_key())
        if index_per_key is not None and dict(index_per_key) != self.index_per_key():
            raise ValueError(f"KeyedJaggedTensor: index_per_key={dict(index_per_key)} does not match keys {keys}; "
                             f"drop it (it is computed from keys)")
        if jt_dict is not None and list(jt_dict) != keys:
            raise ValueError(f"KeyedJaggedTensor: jt_dict keys {list(jt_dict)} differ from keys {keys}; drop jt_dict")

    # ---- constructors -------------------------------------------------------------------------
    @classmethod
    def from_lengths_sync(cls, keys, values, lengths, weights=None, stride=None,
                          stride_per_key_per_rank=None, inverse_indices=None) -> "KeyedJaggedTensor":
        """Build from per-bag lengths (key-major) and compute the per-key sizes now."""
        return cls(keys, values, weights=weights, lengths=lengths, stride=stride,
                   stride_per_key_per_rank=stride_per_key_per_rank, inverse_indices=inverse_indices).sync()

    @classmethod
    def from_offsets_sync(cls, keys, values, offsets, weights=None, stride=None,
                          stride_per_key_per_rank=None, inverse_indices=None) -> "KeyedJaggedTensor":
        """Build from offsets (``len(lengths) + 1`` entries, starting at 0) and compute the per-key sizes."""
        return cls(keys, values, weights=weights, offsets=offsets, stride=stride,
                   stride_per_key_per_rank=stride_per_key_per_rank, inverse_indices=inverse_indices).sync()

    @classmethod
    def from_lengths(cls, keys, values, lengths, weights=None, stride=None) -> "KeyedJaggedTensor":
        """``from_lengths_sync`` without computing the per-key sizes yet (no device sync here)."""
        return cls(keys, values, weights=weights, lengths=lengths, stride=stride)

    @classmethod
    def from_offsets(cls, keys, values, offsets, weights=None, stride=None) -> "KeyedJaggedTensor":
        """``from_offsets_sync`` without computing the per-key sizes yet."""
        return cls(keys, values, weights=weights, offsets=offsets, stride=stride)

    @classmethod
    def _from_consistent_parts(cls, keys: list, values: torch.Tensor, lengths: torch.Tensor, offsets: torch.Tensor,
                               length_per_key: list, offset_per_key: list) -> "KeyedJaggedTensor":
        """Internal: the KJT ``cls(keys, values, lengths=lengths).sync()`` builds, without its checks, for a
        producer whose parts are consistent by construction: unique str ``keys``; 1-D int64 ``lengths``
        >= 0, ``len(keys) * B`` of them, key-major; ``offsets`` their exclusive prefix sum (ending at
        ``len(values)``); the per-key value counts and their prefix sums. The job builds every synthetic
        batch this way (train/data.py): the checks cost it more than the rest of the KJT, and a
        per-step price the library step on a pre-built batch never pays. tests/sparse pins the result
        to the checked constructor's."""
        kjt = object.__new__(cls)
        kjt._keys, kjt._values, kjt._lengths, kjt._offsets, kjt._weights = keys, values, lengths, offsets, None
        kjt._lengths_given, kjt._offsets_given = True, False
        stride = lengths.numel() // len(keys) if keys else 0
        kjt._strides = Strides(stride, [stride] * len(keys), None)
        kjt._inverse_indices = None
        kjt._length_per_key, kjt._offset_per_key = length_per_key, offset_per_key
        return kjt

    @classmethod
    def from_jt_dict(cls, jt_dict: dict) -> "KeyedJaggedTensor":
        """Build from ``{key: JaggedTensor}``; every JaggedTensor must hold the same batch size."""
        return kjt_from_jt_dict(jt_dict)

    @staticmethod
    def concat(kjt_list: Sequence["KeyedJaggedTensor"]) -> "KeyedJaggedTensor":
        """Keys of all inputs side by side (same batch size, all weighted or none).

        Example:
            >>> a = KeyedJaggedTensor(["f1"], torch.tensor([1, 2]), lengths=torch.tensor([2, 0]))
            >>> b = KeyedJaggedTensor(["f2"], torch.tensor([3]), lengths=torch.tensor([0, 1]))
            >>> KeyedJaggedTensor.concat([a, b]).keys()
            ['f1', 'f2']
        """
        return concat_kjts(kjt_list)

    @staticmethod
    def empty(is_weighted: bool = False, device=None, values_dtype=None, weights_dtype=None,
              lengths_dtype: torch.dtype = torch.int32) -> "KeyedJaggedTensor":
        """No keys, batch size 0. ``values_dtype=None`` means int64 (TorchRec's default float is not an id)."""
        w = torch.empty(0, dtype=weights_dtype, device=device) if is_weighted else None
        return KeyedJaggedTensor([], torch.empty(0, dtype=values_dtype or torch.int64, device=device), w,
                                 torch.empty(0, dtype=lengths_dtype, device=device), stride=0)

    @staticmethod
    def empty_like(kjt: "KeyedJaggedTensor", device=None) -> "KeyedJaggedTensor":
        """``device=None``: no keys, same batch size and dtypes. Else: same keys and sizes on ``device``.

        The device copy keeps the lengths (uninitialised ones would not pass validation) and leaves
        values and weights uninitialised, like ``torch.empty_like``.
        """
        return kjt_empty_like(kjt, device)

    # ---- accessors ----------------------------------------------------------------------------
    def keys(self) -> list[str]:
        return list(self._keys)

    def stride(self) -> int:
        """Batch size B (bags per key; with VBE the largest per-key count unless given)."""
        return self._strides.stride

    def stride_per_key(self) -> list[int]:
        """Bags of each key (all ``stride()`` unless the batch varies per key)."""
        return list(self._strides.per_key)

    def stride_per_key_per_rank(self) -> list[list[int]]:
        """VBE only: bags of each key from each rank; ``[]`` without VBE (as TorchRec)."""
        t = self._strides.per_key_per_rank
        return [] if t is None else t.tolist()

    def variable_stride_per_key(self) -> bool:
        """True when the batch size varies per key (VBE)."""
        return self._strides.variable

    def inverse_indices(self) -> tuple[list[str], torch.Tensor]:
        if self._inverse_indices is None:
            raise ValueError("this KeyedJaggedTensor has no inverse_indices; use inverse_indices_or_none()")
        return self._inverse_indices

    def inverse_indices_or_none(self) -> Optional[tuple[list[str], torch.Tensor]]:
        return self._inverse_indices

    def length_per_key(self) -> list[int]:
        """Number of values of each key, in key order."""
        if self._length_per_key is None:
            per_key = self._strides.per_key
            if not self._keys:
                self._length_per_key = []
            elif self._lengths.is_meta:
                self._length_per_key = _meta_length_per_key(self._values.numel(), len(self._keys))
            elif self._strides.variable:
                self._length_per_key = [int(t.sum()) for t in torch.split(self._lengths, per_key)]
            else:
                self._length_per_key = self._lengths.view(len(self._keys), self.stride()).sum(dim=1).tolist()
        return list(self._length_per_key)

    def length_per_key_or_none(self) -> Optional[list[int]]:
        return None if self._length_per_key is None else list(self._length_per_key)

    def offset_per_key(self) -> list[int]:
        """Start of each key's values, plus the end: ``[0, n0, n0 + n1, ...]``."""
        if self._offset_per_key is None:
            out = [0]
            for n in self.length_per_key():
                out.append(out[-1] + n)
            self._offset_per_key = out
        return list(self._offset_per_key)

    def offset_per_key_or_none(self) -> Optional[list[int]]:
        return None if self._offset_per_key is None else list(self._offset_per_key)

    def lengths_offset_per_key(self) -> list[int]:
        """Start of each key's lengths, plus the end: ``[0, s0, s0 + s1, ...]`` (s = stride_per_key)."""
        out = [0]
        for s in self._strides.per_key:
            out.append(out[-1] + s)
        return out

    def index_per_key(self) -> dict[str, int]:
        return {k: i for i, k in enumerate(self._keys)}

    def sync(self) -> "KeyedJaggedTensor":
        """Compute (and cache) length_per_key and offset_per_key now; returns self."""
        self.length_per_key()
        self.offset_per_key()
        return self

    def unsync(self) -> "KeyedJaggedTensor":
        """Drop the cached per-key sizes (recomputed on demand); returns self."""
        self._length_per_key = None
        self._offset_per_key = None
        return self

    def _tensors(self) -> list[torch.Tensor]:
        inv = [] if self._inverse_indices is None else [self._inverse_indices[1]]
        return super()._tensors() + inv

    # ---- per-key views and transforms (kjt_ops) -----------------------------------------------
    def __getitem__(self, key: str) -> JaggedTensor:
        return kjt_ops.key_jagged(self, key)

    def to_dict(self, compute_offsets: bool = True) -> dict[str, JaggedTensor]:
        """``{key: JaggedTensor}`` in key order."""
        return {k: self[k] for k in self._keys}

    def split(self, segments: Sequence[int]) -> list["KeyedJaggedTensor"]:
        """Split the keys into consecutive groups of the given sizes (they must sum to len(keys)).

        Example:
            >>> kjt = KeyedJaggedTensor(["f1", "f2"], torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 0, 1, 0]))
            >>> a, b = kjt.split([1, 1])
            >>> a.keys(), b.values()
            (['f1'], tensor([3]))
        """
        return kjt_ops.split(self, segments)

    def permute(self, indices: Sequence[int], indices_tensor: Optional[torch.Tensor] = None) -> "KeyedJaggedTensor":
        """Reorder (or select) keys: the result's key j is this tensor's key ``indices[j]``.

        Example:
            >>> kjt = KeyedJaggedTensor(["f1", "f2"], torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 0, 1, 0]))
            >>> p = kjt.permute([1, 0])
            >>> p.keys(), p.values()
            (['f2', 'f1'], tensor([3, 1, 2]))
        """
        return kjt_ops.permute(self, indices)

    def flatten_lengths(self) -> "KeyedJaggedTensor":
        """A KJT with 1-D lengths (they always are here: returns an equal copy, as TorchRec's does)."""
        return self._rebuild(self._values, self._weights, self._lengths.view(-1))

    def _rebuild(self, values, weights, lengths, inverse=None) -> "KeyedJaggedTensor":
        """Same keys and strides around new tensors (after a move)."""
        s = self._strides
        return KeyedJaggedTensor(self._keys, values, weights, lengths, stride=s.stride,
                                 stride_per_key_per_rank=s.per_key_per_rank, inverse_indices=inverse)

    # ---- movement -----------------------------------------------------------------------------
    def to(self, device, non_blocking: bool = False, dtype: Optional[torch.dtype] = None) -> "KeyedJaggedTensor":
        """Copy to ``device``; ``dtype`` (optional) converts the weights, as TorchRec's does."""
        w = self._weights
        if w is not None:
            w = w.to(device=device, dtype=dtype or w.dtype, non_blocking=non_blocking)
        inv = self._inverse_indices
        if inv is not None:
            inv = (inv[0], inv[1].to(device, non_blocking=non_blocking))
        return self._rebuild(self._values.to(device, non_blocking=non_blocking), w,
                             self._lengths.to(device, non_blocking=non_blocking), inv)

    def pin_memory(self) -> "KeyedJaggedTensor":
        """Copy into page-locked host memory (needs an accelerator build of torch)."""
        w = None if self._weights is None else self._weights.pin_memory()
        inv = self._inverse_indices
        if inv is not None:
            inv = (inv[0], inv[1].pin_memory())
        return self._rebuild(self._values.pin_memory(), w, self._lengths.pin_memory(), inv)

    def __str__(self) -> str:
        return kjt_string(self._keys, self._values, self._weights, self._offsets.tolist(),
                          self.lengths_offset_per_key())

    def __repr__(self) -> str:
        vbe = f", stride_per_key={self._strides.per_key}" if self._strides.variable else ""
        return (f"KeyedJaggedTensor(keys={self._keys}, stride={self.stride()}{vbe}, values={self._values}, "
                f"lengths={self._lengths}, weights={self._weights})")
