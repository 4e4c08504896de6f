"""KeyedTensor: pooled outputs of several features side by side in one dense tensor.

Constructor order is TorchRec's: ``KeyedTensor(keys, length_per_key, values, key_dim=1)``.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from .fx import SparseMeta

__all__ = ["KeyedTensor", "regroup_kts"]


def regroup_kts(keyed_tensors: Sequence["KeyedTensor"], groups: Sequence[Sequence[str]]) -> list[torch.Tensor]:
    """One tensor per group: the group's key blocks concatenated along the key dim, in group order."""
    kts = list(keyed_tensors)
    if not kts or not all(isinstance(kt, KeyedTensor) for kt in kts):
        raise TypeError(f"regroup needs a non-empty list of KeyedTensors, got {keyed_tensors!r}")
    dims = {kt.key_dim() for kt in kts}
    if len(dims) > 1:
        raise ValueError(f"regroup: the KeyedTensors have different key dims {sorted(dims)}; give them one key_dim")
    key_dim = dims.pop()
    owner: dict[str, int] = {}
    for i, kt in enumerate(kts):
        for k in kt.keys():
            if k in owner:
                raise ValueError(f"regroup: key {k!r} is in KeyedTensors {owner[k]} and {i}; keys must be unique "
                                 f"across the inputs")
            owner[k] = i
    blocks = [kt.to_dict() for kt in kts]
    out = []
    for group in groups:
        missing = [k for k in group if k not in owner]
        if missing:
            raise KeyError(f"regroup: keys {missing} are in none of the KeyedTensors (keys: {list(owner)})")
        parts = [blocks[owner[k]][k] for k in group]
        out.append(torch.cat(parts, dim=key_dim) if parts else kts[0].values().narrow(key_dim, 0, 0))
    return out


def regroup_kts_as_dict(keyed_tensors, groups, keys) -> dict[str, torch.Tensor]:
    """``{keys[i]: group i}`` of ``regroup_kts``."""
    if len(groups) != len(keys):
        raise ValueError(f"regroup_as_dict: {len(groups)} groups but {len(keys)} names; give one name per group")
    return dict(zip(keys, regroup_kts(keyed_tensors, groups)))


# traced modules record one call of each (their argument is a list of KeyedTensors)
torch.fx.wrap("regroup_kts")
torch.fx.wrap("regroup_kts_as_dict")


class KeyedTensor(metaclass=SparseMeta):
    """Dense per-key blocks concatenated along ``key_dim`` (1: ``[B, sum(dims)]``, the pooled outputs).

    Example:
        >>> kt = KeyedTensor(["f1", "f2"], [2, 3], torch.zeros(4, 5))
        >>> kt.to_dict()["f2"].shape
        torch.Size([4, 3])
        >>> [t.shape for t in KeyedTensor.regroup([kt], [["f2"], ["f1", "f2"]])]
        [torch.Size([4, 3]), torch.Size([4, 5])]
    """

    def __init__(self, keys: Sequence[str], length_per_key: Sequence[int], values: torch.Tensor, key_dim: int = 1,
                 offset_per_key: Optional[Sequence[int]] = None, index_per_key: Optional[dict] = None):
        keys, length_per_key = list(keys), list(length_per_key)
        if len(keys) != len(length_per_key):
            raise ValueError(f"KeyedTensor: {len(keys)} keys but {len(length_per_key)} lengths; "
                             f"give one length per key")
        if len(set(keys)) != len(keys):
            raise ValueError(f"KeyedTensor: keys must be unique, got {keys}")
        if not isinstance(values, torch.Tensor) or values.dim() < 1:
            raise TypeError(f"KeyedTensor: values must be a tensor with a key dim (usually 2-D [B, sum(dims)]), got "
                            f"{tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__}")
        empty = not keys and values.numel() == 0   # KeyedTensor([], [], torch.Tensor()): nothing to index
        if not isinstance(key_dim, int) or not (0 <= key_dim < values.dim() or empty):
            raise ValueError(f"KeyedTensor: key_dim={key_dim!r} is not a dim of values {tuple(values.shape)}; "
                             f"use 0..{values.dim() - 1} (1 for [B, sum(dims)])")
        if not empty and (any(n < 0 for n in length_per_key) or sum(length_per_key) != values.shape[key_dim]):
            raise ValueError(f"KeyedTensor: lengths {length_per_key} must be >= 0 and sum to "
                             f"values.shape[{key_dim}]={values.shape[key_dim]}")
        self._keys = keys
        self._length_per_key = length_per_key
        self._values = values
        self._key_dim = key_dim
        if offset_per_key is not None and list(offset_per_key) != self.offset_per_key():
            raise ValueError(f"KeyedTensor: offset_per_key={list(offset_per_key)} but the lengths give "
                             f"{self.offset_per_key()}; drop it (it is computed)")
        if index_per_key is not None and dict(index_per_key) != self._index_per_key():
            raise ValueError(f"KeyedTensor: index_per_key={dict(index_per_key)} does not match keys {keys}")

    @staticmethod
    def from_tensor_list(keys: Sequence[str], tensors: Sequence[torch.Tensor], key_dim: int = 1,
                         cat_dim: int = 1) -> "KeyedTensor":
        """One tensor per key, concatenated along ``cat_dim``; each key's length is its ``shape[key_dim]``."""
        tensors = list(tensors)
        if len(tensors) != len(list(keys)) or not tensors:
            raise ValueError(f"from_tensor_list: {len(list(keys))} keys and {len(tensors)} tensors; give one "
                             f"tensor per key (at least one)")
        return KeyedTensor(keys, [t.shape[key_dim] for t in tensors], torch.cat(tensors, dim=cat_dim), key_dim)

    @staticmethod
    def regroup(keyed_tensors: Sequence["KeyedTensor"], groups: Sequence[Sequence[str]]) -> list[torch.Tensor]:
        """One tensor per group of keys, taken from any of ``keyed_tensors``; gradients flow back."""
        return regroup_kts(keyed_tensors, groups)

    @staticmethod
    def regroup_as_dict(keyed_tensors: Sequence["KeyedTensor"], groups: Sequence[Sequence[str]],
                        keys: Sequence[str]) -> dict[str, torch.Tensor]:
        """``regroup`` with a name per group: ``{keys[i]: group i}``."""
        return regroup_kts_as_dict(keyed_tensors, groups, keys)

    def keys(self) -> list[str]:
        return list(self._keys)

    def values(self) -> torch.Tensor:
        return self._values

    def device(self) -> torch.device:
        return self._values.device

    def length_per_key(self) -> list[int]:
        return list(self._length_per_key)

    def offset_per_key(self) -> list[int]:
        out = [0]
        for n in self._length_per_key:
            out.append(out[-1] + n)
        return out

    def _index_per_key(self) -> dict[str, int]:
        return {k: i for i, k in enumerate(self._keys)}

    def key_dim(self) -> int:
        return self._key_dim

    def to_dict(self) -> dict[str, torch.Tensor]:
        """``{key: block}`` (views, so gradients flow back to ``values()``)."""
        return dict(zip(self._keys, torch.split(self._values, self._length_per_key, dim=self._key_dim)))

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self._keys:
            raise KeyError(f"{key!r} is not a key of this KeyedTensor (keys: {self._keys})")
        i = self._keys.index(key)
        return self._values.narrow(self._key_dim, self.offset_per_key()[i], self._length_per_key[i])

    def to(self, device, non_blocking: bool = False) -> "KeyedTensor":
        return KeyedTensor(self._keys, self._length_per_key, self._values.to(device, non_blocking=non_blocking),
                           self._key_dim)

    def record_stream(self, stream) -> None:
        self._values.record_stream(stream)

    def wait(self) -> "KeyedTensor":
        """Itself: a sharded collection returns its output ready, where TorchRec's returns a
        ``LazyAwaitable[KeyedTensor]``; this lets TorchRec code's ``out.wait()`` run unchanged."""
        return self

    def size_in_bytes(self) -> int:
        return self._values.element_size() * self._values.numel()

    def __str__(self) -> str:
        if not self._keys:
            return "KeyedTensor()\n"
        return "KeyedTensor({\n" + ",\n".join(f'    "{k}": {self[k].tolist()}' for k in self._keys) + "\n})\n"

    def __repr__(self) -> str:
        return f"KeyedTensor(keys={self._keys}, length_per_key={self._length_per_key}, values={self._values})"
