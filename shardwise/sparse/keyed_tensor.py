"""KeyedTensor: pooled outputs of several features side by side in one dense [B, sum(dims)] tensor."""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["KeyedTensor"]


class KeyedTensor:
    """Dense per-key blocks concatenated along dim 1.

    Example:
        >>> kt = KeyedTensor(["f1", "f2"], [2, 3], torch.zeros(4, 5))
        >>> kt.to_dict()["f2"].shape
        torch.Size([4, 3])
    """

    def __init__(self, keys: Sequence[str], length_per_key: Sequence[int], values: torch.Tensor, key_dim: int = 1):
        keys, length_per_key = list(keys), list(length_per_key)
        if len(keys) != len(length_per_key):
            raise ValueError(f"KeyedTensor: {len(keys)} keys but {len(length_per_key)} lengths; "
                             f"give one length per key")
        if len(set(keys)) != len(keys):
            raise ValueError(f"KeyedTensor: keys must be unique, got {keys}")
        if not isinstance(values, torch.Tensor) or values.dim() != 2:
            raise TypeError(f"KeyedTensor: values must be a 2-D tensor, got "
                            f"{tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__}")
        if key_dim != 1:
            raise ValueError(f"KeyedTensor: only key_dim=1 is supported, got {key_dim}")
        if any(n < 0 for n in length_per_key) or sum(length_per_key) != values.shape[1]:
            raise ValueError(f"KeyedTensor: lengths {length_per_key} must be >= 0 and sum to values.shape[1]="
                             f"{values.shape[1]}")
        self._keys = keys
        self._length_per_key = length_per_key
        self._values = values

    def keys(self) -> list[str]:
        return list(self._keys)

    def values(self) -> torch.Tensor:
        return self._values

    def length_per_key(self) -> list[int]:
        return list(self._length_per_key)

    def offset_per_key(self) -> list[int]:
        out = [0]
        for n in self._length_per_key:
            out.append(out[-1] + n)
        return out

    def key_dim(self) -> int:
        return 1

    def to_dict(self) -> dict[str, torch.Tensor]:
        """``{key: values[:, block]}`` (views, so gradients flow back to ``values()``)."""
        return dict(zip(self._keys, torch.split(self._values, self._length_per_key, dim=1)))

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self._keys:
            raise KeyError(f"{key!r} is not a key of this KeyedTensor (keys: {self._keys})")
        i = self._keys.index(key)
        start = sum(self._length_per_key[:i])
        return self._values[:, start:start + self._length_per_key[i]]

    def __repr__(self) -> str:
        return f"KeyedTensor(keys={self._keys}, length_per_key={self._length_per_key}, values={self._values})"
