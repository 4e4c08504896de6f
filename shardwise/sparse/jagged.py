"""JaggedTensor: one feature's variable-length bags, stored as flat values plus lengths."""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["JaggedTensor"]


def _as_index_tensor(name: str, value, device) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        try:
            value = torch.as_tensor(value, dtype=torch.int64, device=device)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"{name} must be a 1-D integer tensor or a list of ints, got {type(value).__name__}; "
                f"pass e.g. torch.tensor([2, 0, 1])"
            ) from exc
    if value.dtype.is_floating_point or value.dtype == torch.bool or value.dtype.is_complex:
        raise TypeError(f"{name} must have an integer dtype, got {value.dtype}; cast it with .long()")
    if value.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(value.shape)}; flatten it first")
    return value


def lengths_to_offsets(lengths: torch.Tensor) -> torch.Tensor:
    """Exclusive prefix sum with a leading zero: lengths [2, 0, 3] -> offsets [0, 2, 2, 5]."""
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths, dim=0, out=offsets[1:])
    return offsets


def check_jagged(
    values: torch.Tensor,
    lengths: Optional[torch.Tensor],
    offsets: Optional[torch.Tensor],
    weights: Optional[torch.Tensor],
    what: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate a (values, lengths | offsets, weights) triple; return (lengths, offsets) as int64."""
    if not isinstance(values, torch.Tensor) or values.dim() != 1:
        raise TypeError(f"{what}: values must be a 1-D tensor, got {type(values).__name__}"
                        f"{'' if not isinstance(values, torch.Tensor) else ' of shape ' + str(tuple(values.shape))}; "
                        f"pass every bag's ids in one flat tensor (e.g. torch.tensor([4, 5, 6]) or t.flatten())")
    if lengths is None and offsets is None:
        raise ValueError(f"{what}: pass lengths or offsets (neither was given)")
    # before any .item(): a tensor on another device fails there with torch's message, naming nothing
    for name, t in (("lengths", lengths), ("offsets", offsets), ("weights", weights)):
        if isinstance(t, torch.Tensor) and t.device != values.device:
            raise ValueError(f"{what}: {name} are on {t.device} but values on {values.device}; move them "
                             f"with .to(values.device)")
    lengths_given = lengths is not None
    if lengths is not None:
        lengths = _as_index_tensor(f"{what}: lengths", lengths, values.device).long()
        if lengths.numel() and bool((lengths < 0).any()):
            bad = lengths[lengths < 0][0].item()
            raise ValueError(f"{what}: lengths must be >= 0, found {bad}; every bag needs a non-negative size")
        computed = lengths_to_offsets(lengths)
        if offsets is not None:
            offsets = _as_index_tensor(f"{what}: offsets", offsets, values.device).long()
            if not torch.equal(offsets, computed):
                raise ValueError(f"{what}: offsets {offsets.tolist()} do not match lengths {lengths.tolist()}; "
                                 f"pass only one of them")
        offsets = computed
    else:
        offsets = _as_index_tensor(f"{what}: offsets", offsets, values.device).long()
        if offsets.numel() == 0 or offsets[0].item() != 0:
            raise ValueError(f"{what}: offsets must start with 0 and have one more entry than bags, "
                             f"got {offsets.tolist()}")
        lengths = offsets[1:] - offsets[:-1]
        if lengths.numel() and bool((lengths < 0).any()):
            raise ValueError(f"{what}: offsets must be non-decreasing, got {offsets.tolist()}")
    total = int(offsets[-1].item())
    if total != values.numel():
        given = "lengths sum to" if lengths_given else "offsets end at"
        raise ValueError(f"{what}: {given} {total} but there are {values.numel()} values; "
                         f"the lengths must add up to the number of values")
    if weights is not None:
        if not isinstance(weights, torch.Tensor) or weights.shape != values.shape:
            got = tuple(weights.shape) if isinstance(weights, torch.Tensor) else type(weights).__name__
            raise ValueError(f"{what}: weights must have one entry per value ({values.numel()}), got {got}; "
                             f"pass one weight per id")
        if not weights.dtype.is_floating_point:
            # embedding_bag multiplies rows by them: integer weights fail (or truncate) deep in the lookup
            raise TypeError(f"{what}: weights must have a floating-point dtype, got {weights.dtype}; cast them "
                            f"with .float()")
    return lengths, offsets


class _JaggedAccessors:
    """The (values, lengths, offsets, weights) accessors shared by the jagged types."""

    _values: torch.Tensor
    _lengths: torch.Tensor
    _offsets: torch.Tensor
    _weights: Optional[torch.Tensor]

    def values(self) -> torch.Tensor:
        return self._values

    def lengths(self) -> torch.Tensor:
        return self._lengths

    def offsets(self) -> torch.Tensor:
        return self._offsets

    def weights(self) -> torch.Tensor:
        if self._weights is None:
            raise ValueError(f"this {type(self).__name__} has no weights; use weights_or_none()")
        return self._weights

    def weights_or_none(self) -> Optional[torch.Tensor]:
        return self._weights


class JaggedTensor(_JaggedAccessors):
    """A batch of variable-length bags for one feature.

    Example:
        >>> jt = JaggedTensor(values=torch.tensor([4, 5, 6]), lengths=torch.tensor([2, 0, 1]))
        >>> jt.to_dense()
        [tensor([4, 5]), tensor([], dtype=torch.int64), tensor([6])]
    """

    def __init__(self, values: torch.Tensor, lengths=None, offsets=None, weights=None):
        self._lengths, self._offsets = check_jagged(values, lengths, offsets, weights, "JaggedTensor")
        self._values = values
        self._weights = weights

    @classmethod
    def from_lengths(cls, values, lengths, weights=None) -> "JaggedTensor":
        return cls(values, lengths=lengths, weights=weights)

    @classmethod
    def from_offsets(cls, values, offsets, weights=None) -> "JaggedTensor":
        return cls(values, offsets=offsets, weights=weights)

    def to_dense(self) -> list[torch.Tensor]:
        return list(torch.split(self._values, self._lengths.tolist()))

    def __len__(self) -> int:
        return self._lengths.numel()

    def __repr__(self) -> str:
        return f"JaggedTensor(values={self._values}, lengths={self._lengths}, weights={self._weights})"
