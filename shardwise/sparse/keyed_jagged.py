"""KeyedJaggedTensor: many features' bags for one batch, key-major in one flat values tensor."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from .jagged import JaggedTensor, _JaggedAccessors, check_jagged

__all__ = ["KeyedJaggedTensor"]


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


class KeyedJaggedTensor(_JaggedAccessors):
    """Bags of ids for several features over one batch.

    Values are laid out key-major: all bags of ``keys[0]`` (sample 0..B-1), then ``keys[1]``...
    ``lengths`` has ``len(keys) * B`` entries, B being the batch size (``stride()``).

    Example:
        >>> kjt = KeyedJaggedTensor(["f1", "f2"], torch.tensor([1, 2, 3, 4]),
        ...                         lengths=torch.tensor([2, 0, 1, 1]))   # batch of 2
        >>> kjt["f1"].to_dense()
        [tensor([1, 2]), tensor([], dtype=torch.int64)]
    """

    def __init__(self, keys, values, lengths=None, offsets=None, weights=None, stride=None):
        keys = _check_keys(keys)
        if isinstance(values, torch.Tensor) and (values.dtype.is_floating_point or values.dtype.is_complex
                                                 or values.dtype == torch.bool):
            raise TypeError(f"KeyedJaggedTensor: values are ids and must have an integer dtype, got {values.dtype}; "
                            "cast them with .long()")
        lengths, offsets = check_jagged(values, lengths, offsets, weights, "KeyedJaggedTensor")
        n = lengths.numel()
        if keys:
            if n % len(keys):
                raise ValueError(f"KeyedJaggedTensor: {n} lengths cannot be split evenly over {len(keys)} keys "
                                 f"{keys}; pass len(keys) * batch_size lengths (key-major)")
            inferred = n // len(keys)
            if stride is not None and stride != inferred:
                raise ValueError(f"KeyedJaggedTensor: stride={stride} but {n} lengths over {len(keys)} keys "
                                 f"give batch size {inferred}; drop stride or fix lengths")
            stride = inferred
        else:
            if n:
                raise ValueError(f"KeyedJaggedTensor: no keys but {n} lengths; pass the keys of the lengths")
            if stride is None:
                raise ValueError("KeyedJaggedTensor: with no keys the batch size is unknown; pass stride=B")
        if not isinstance(stride, int) or stride < 0:
            raise ValueError(f"KeyedJaggedTensor: stride must be a non-negative int, got {stride!r}")
        self._keys = keys
        self._values = values
        self._lengths = lengths
        self._offsets = offsets
        self._weights = weights
        self._stride = stride
        self._length_per_key: Optional[list[int]] = None

    # ---- constructors -------------------------------------------------------------------------
    @classmethod
    def from_lengths(cls, keys, values, lengths, weights=None, stride=None) -> "KeyedJaggedTensor":
        """Build from per-bag lengths (key-major)."""
        return cls(keys, values, lengths=lengths, weights=weights, stride=stride)

    @classmethod
    def from_offsets(cls, keys, values, offsets, weights=None, stride=None) -> "KeyedJaggedTensor":
        """Build from offsets (length ``len(keys) * B + 1``, starting at 0)."""
        return cls(keys, values, offsets=offsets, weights=weights, stride=stride)

    from_lengths_sync = from_lengths
    from_offsets_sync = from_offsets

    @classmethod
    def from_jt_dict(cls, jts: dict) -> "KeyedJaggedTensor":
        """Build from ``{key: JaggedTensor}``; every JaggedTensor must hold the same batch size."""
        if not jts:
            raise ValueError("from_jt_dict needs at least one key; use KeyedJaggedTensor([], ..., stride=B)")
        keys = list(jts)
        sizes = {k: len(jt) for k, jt in jts.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"from_jt_dict: batch sizes differ per key {sizes}; give every key the same batch")
        weighted = [jt.weights_or_none() is not None for jt in jts.values()]
        if any(weighted) and not all(weighted):
            raise ValueError("from_jt_dict: some JaggedTensors have weights and others not; weight all or none")
        values = torch.cat([jt.values() for jt in jts.values()])
        lengths = torch.cat([jt.lengths() for jt in jts.values()])
        weights = torch.cat([jt.weights() for jt in jts.values()]) if all(weighted) else None
        return cls(keys, values, lengths=lengths, weights=weights)

    # ---- accessors ----------------------------------------------------------------------------
    def keys(self) -> list[str]:
        return list(self._keys)

    def stride(self) -> int:
        """Batch size B (bags per key)."""
        return self._stride

    def length_per_key(self) -> list[int]:
        """Number of values of each key, in key order."""
        if self._length_per_key is None:
            if self._keys:
                per_key = self._lengths.view(len(self._keys), self._stride).sum(dim=1)
                self._length_per_key = per_key.tolist()
            else:
                self._length_per_key = []
        return list(self._length_per_key)

    def offset_per_key(self) -> list[int]:
        out = [0]
        for n in self.length_per_key():
            out.append(out[-1] + n)
        return out

    def _key_index(self, key: str) -> int:
        try:
            return self._keys.index(key)
        except ValueError:
            raise KeyError(f"feature {key!r} is not in this KeyedJaggedTensor (keys: {self._keys})") from None

    def __getitem__(self, key: str) -> JaggedTensor:
        i = self._key_index(key)
        start, stop = self.offset_per_key()[i], self.offset_per_key()[i + 1]
        w = None if self._weights is None else self._weights[start:stop]
        lengths = self._lengths[i * self._stride:(i + 1) * self._stride]
        return JaggedTensor(self._values[start:stop], lengths=lengths, weights=w)

    def to_dict(self) -> dict[str, JaggedTensor]:
        """``{key: JaggedTensor}`` in key order."""
        return {k: self[k] for k in self._keys}

    # ---- transforms ---------------------------------------------------------------------------
    def split(self, segments: Sequence[int]) -> list["KeyedJaggedTensor"]:
        """Split the keys into consecutive groups of the given sizes (they must sum to len(keys)).

        Example:
            >>> a, b = kjt.split([1, 1])   # kjt with keys ['f1', 'f2']
            >>> a.keys(), b.keys()
            (['f1'], ['f2'])
        """
        segments = list(segments)
        if any((not isinstance(s, int)) or s < 0 for s in segments) or sum(segments) != len(self._keys):
            raise ValueError(f"split segments {segments} must be non-negative ints summing to the number of "
                             f"keys ({len(self._keys)})")
        per_key = self.offset_per_key()
        out, k = [], 0
        for seg in segments:
            v0, v1 = per_key[k], per_key[k + seg]
            out.append(KeyedJaggedTensor(
                self._keys[k:k + seg], self._values[v0:v1],
                lengths=self._lengths[k * self._stride:(k + seg) * self._stride],
                weights=None if self._weights is None else self._weights[v0:v1],
                stride=self._stride))
            k += seg
        return out

    def permute(self, indices: Sequence[int]) -> "KeyedJaggedTensor":
        """Reorder (or select) keys: the result's key j is this tensor's key ``indices[j]``.

        Example:
            >>> kjt.permute([1, 0]).keys()   # kjt with keys ['f1', 'f2']
            ['f2', 'f1']
        """
        indices = list(indices)
        n = len(self._keys)
        for i in indices:
            if not isinstance(i, int) or not 0 <= i < n:
                raise ValueError(f"permute index {i!r} is out of range for {n} keys; use 0..{n - 1}")
        per_key = self.offset_per_key()
        b = self._stride
        values = [self._values[per_key[i]:per_key[i + 1]] for i in indices]
        lengths = [self._lengths[i * b:(i + 1) * b] for i in indices]
        weights = None
        if self._weights is not None:
            weights = torch.cat([self._weights[per_key[i]:per_key[i + 1]] for i in indices]) if indices \
                else self._weights[:0]
        return KeyedJaggedTensor(
            [self._keys[i] for i in indices],
            torch.cat(values) if values else self._values[:0],
            lengths=torch.cat(lengths) if lengths else self._lengths[:0],
            weights=weights, stride=b)

    def to(self, device) -> "KeyedJaggedTensor":
        w = None if self._weights is None else self._weights.to(device)
        return KeyedJaggedTensor(self._keys, self._values.to(device), lengths=self._lengths.to(device),
                                 weights=w, stride=self._stride)

    def __repr__(self) -> str:
        return (f"KeyedJaggedTensor(keys={self._keys}, stride={self._stride}, values={self._values}, "
                f"lengths={self._lengths}, weights={self._weights})")

