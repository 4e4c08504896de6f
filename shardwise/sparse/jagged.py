"""JaggedTensor: one feature's variable-length bags, stored as flat values plus lengths.

The constructor takes TorchRec's positional order ``(values, weights, lengths, offsets)``; lengths and
offsets are validated eagerly and kept as int64.
"""

from __future__ import annotations

from typing import Optional

import torch

from .fx import SparseMeta
from .text import jt_string

__all__ = ["JaggedTensor", "lengths_to_offsets"]


def _as_index_tensor(name: str, value, device, flatten: bool = False) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        try:
            value = torch.as_tensor(value, dtype=torch.int64, device=device)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"{name} must be a 1-D integer tensor or a list of ints, got {type(value).__name__}; "
                f"pass e.g. torch.tensor([2, 0, 1])"
            ) from exc
    # an empty float tensor (torch.tensor([])) carries no values to misread: TorchRec accepts it too
    bad_dtype = value.dtype.is_floating_point or value.dtype == torch.bool or value.dtype.is_complex
    if bad_dtype and value.numel():
        raise TypeError(f"{name} must have an integer dtype, got {value.dtype}; cast it with .long()")
    if value.dim() != 1:
        if flatten and value.dim() > 1:
            return value.reshape(-1)   # TorchRec keeps [keys, batch] lengths as given; flat is the same data
        raise ValueError(f"{name} must be 1-D, got shape {tuple(value.shape)}; flatten it first")
    return value


def lengths_to_offsets(lengths: torch.Tensor) -> torch.Tensor:
    """Exclusive prefix sum with a leading zero: lengths [2, 0, 3] -> offsets [0, 2, 2, 5].

    Example:
        >>> lengths_to_offsets(torch.tensor([2, 0, 3]))
        tensor([0, 2, 2, 5])
    """
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths, dim=0, out=offsets[1:])
    return offsets


def _check_weights(values: torch.Tensor, weights, what: str, float_weights: bool) -> None:
    if not isinstance(weights, torch.Tensor) or weights.dim() != 1 or weights.shape[0] != values.shape[0]:
        got = tuple(weights.shape) if isinstance(weights, torch.Tensor) else type(weights).__name__
        raise ValueError(f"{what}: weights must have one entry per value ({values.shape[0]}), got {got}; "
                         f"pass one weight per id")
    if float_weights and not weights.dtype.is_floating_point and weights.numel():
        # embedding_bag multiplies rows by them: integer weights fail (or truncate) deep in the lookup
        raise TypeError(f"{what}: weights must have a floating-point dtype, got {weights.dtype}; cast them "
                        f"with .float()")


def check_jagged(
    values: torch.Tensor,
    lengths: Optional[torch.Tensor],
    offsets: Optional[torch.Tensor],
    weights: Optional[torch.Tensor],
    what: str,
    values_1d: bool = True,
    float_weights: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate a (values, lengths | offsets, weights) triple; return (lengths, offsets) as int64.

    The bags run along dim 0 of ``values``; ``values_1d=False`` allows trailing dims (e.g. [N, D]
    embeddings per id). ``float_weights=False`` admits integer weights (an output's ids).
    """
    if not isinstance(values, torch.Tensor) or values.dim() == 0 or (values_1d and values.dim() != 1):
        raise TypeError(f"{what}: values must be a 1-D tensor, got {type(values).__name__}"
                        f"{'' if not isinstance(values, torch.Tensor) else ' of shape ' + str(tuple(values.shape))}; "
                        f"pass every bag's ids in one flat tensor (e.g. torch.tensor([4, 5, 6]) or t.flatten())")
    if lengths is None and offsets is None:
        if values.shape[0] == 0:   # TorchRec's KeyedJaggedTensor([], torch.Tensor()): no bags at all
            lengths = torch.zeros(0, dtype=torch.int64, device=values.device)
        else:
            raise ValueError(f"{what}: pass lengths or offsets (neither was given)")
    # before any .item(): a tensor on another device fails there with torch's message, naming nothing
    for name, t in (("lengths", lengths), ("offsets", offsets), ("weights", weights)):
        if isinstance(t, torch.Tensor) and t.device != values.device:
            raise ValueError(f"{what}: {name} are on {t.device} but values on {values.device}; move them "
                             f"with .to(values.device)")
    lengths_given = lengths is not None
    if lengths is not None:
        lengths = _as_index_tensor(f"{what}: lengths", lengths, values.device, flatten=True).long()
        if values.is_meta:   # shapes only (TorchRec builds KJTs on the meta device): nothing to read
            return lengths, (offsets.long() if offsets is not None else lengths_to_offsets(lengths))
        if lengths.numel() and bool((lengths < 0).any()):
            bad = lengths[lengths < 0][0].item()
            raise ValueError(f"{what}: lengths must be >= 0, found {bad}; every bag needs a non-negative size")
        computed = lengths_to_offsets(lengths)
        if offsets is not None:
            offsets = _as_index_tensor(f"{what}: offsets", offsets, values.device).long()
            # TorchRec writes "no bags" as empty offsets as well as [0]
            if not (torch.equal(offsets, computed) or (offsets.numel() == 0 and lengths.numel() == 0)):
                raise ValueError(f"{what}: offsets {offsets.tolist()} do not match lengths {lengths.tolist()}; "
                                 f"pass only one of them")
        offsets = computed
    else:
        offsets = _as_index_tensor(f"{what}: offsets", offsets, values.device).long()
        if values.is_meta:
            return offsets[1:] - offsets[:-1], offsets
        if offsets.numel() == 0:
            offsets = torch.zeros(1, dtype=torch.int64, device=values.device)
        if offsets[0].item() != 0:
            raise ValueError(f"{what}: offsets must start with 0 and have one more entry than bags, "
                             f"got {offsets.tolist()}")
        lengths = offsets[1:] - offsets[:-1]
        if lengths.numel() and bool((lengths < 0).any()):
            raise ValueError(f"{what}: offsets must be non-decreasing, got {offsets.tolist()}")
    total = int(offsets[-1].item())
    if total != values.shape[0]:
        given = "lengths sum to" if lengths_given else "offsets end at"
        raise ValueError(f"{what}: {given} {total} but there are {values.shape[0]} values; "
                         f"the lengths must add up to the number of values")
    if weights is not None:
        _check_weights(values, weights, what, float_weights)
    return lengths, offsets


def jt_from_dense_lengths(values: torch.Tensor, lengths, weights: Optional[torch.Tensor] = None) -> "JaggedTensor":
    """See ``JaggedTensor.from_dense_lengths``."""
    if not isinstance(values, torch.Tensor) or values.dim() < 2:
        raise ValueError("from_dense_lengths: values must be a padded [B, N, ...] tensor, got "
                         f"{getattr(values, 'shape', type(values).__name__)}; use from_dense for a list")
    lengths = _as_index_tensor("from_dense_lengths: lengths", lengths, values.device).long()
    if lengths.numel() != values.shape[0] or bool((lengths > values.shape[1]).any()):
        raise ValueError(f"from_dense_lengths: lengths {lengths.tolist()} need one entry per row of values "
                         f"{tuple(values.shape)}, each at most {values.shape[1]}")
    mask = torch.arange(values.shape[1], device=values.device).unsqueeze(0) < lengths.unsqueeze(1)
    return JaggedTensor(values[mask], None if weights is None else weights[mask], lengths)


# one graph node when traced (its checks read the lengths' values)
torch.fx.wrap("jt_from_dense_lengths")


class _JaggedAccessors:
    """The accessors shared by the jagged types (TorchRec's names)."""

    _values: torch.Tensor
    _lengths: torch.Tensor
    _offsets: torch.Tensor
    _weights: Optional[torch.Tensor]
    _lengths_given: bool
    _offsets_given: bool

    def values(self) -> torch.Tensor:
        return self._values

    def lengths(self) -> torch.Tensor:
        self._lengths_given = True
        return self._lengths

    def offsets(self) -> torch.Tensor:
        self._offsets_given = True
        return self._offsets

    def lengths_or_none(self) -> Optional[torch.Tensor]:
        """Lengths if they were given or already asked for, else None (as TorchRec)."""
        return self._lengths if self._lengths_given else None

    def offsets_or_none(self) -> Optional[torch.Tensor]:
        """Offsets if they were given or already asked for, else None (as TorchRec)."""
        return self._offsets if self._offsets_given else None

    def weights(self) -> torch.Tensor:
        if self._weights is None:
            raise ValueError(f"this {type(self).__name__} has no weights; use weights_or_none()")
        return self._weights

    def weights_or_none(self) -> Optional[torch.Tensor]:
        return self._weights

    def device(self) -> torch.device:
        return self._values.device

    def _tensors(self) -> list[torch.Tensor]:
        return [t for t in (self._values, self._weights, self._lengths, self._offsets) if t is not None]

    def record_stream(self, stream) -> None:
        """Mark every tensor as used on ``stream`` (CUDA caching allocator), like Tensor.record_stream."""
        for t in self._tensors():
            t.record_stream(stream)

    def size_in_bytes(self) -> int:
        return sum(t.element_size() * t.numel() for t in self._tensors())


class JaggedTensor(_JaggedAccessors, metaclass=SparseMeta):
    """A batch of variable-length bags for one feature: ``JaggedTensor(values, weights, lengths, offsets)``.

    ``values`` may have trailing dims (bags run along dim 0), e.g. ``[N, D]`` embeddings per id.

    Example:
        >>> jt = JaggedTensor(torch.tensor([4, 5, 6]), None, torch.tensor([2, 0, 1]))
        >>> jt.to_dense()
        [tensor([4, 5]), tensor([], dtype=torch.int64), tensor([6])]
        >>> jt.to_padded_dense(padding_value=-1)
        tensor([[ 4,  5],
                [-1, -1],
                [ 6, -1]])
    """

    def __init__(self, values: torch.Tensor, weights: Optional[torch.Tensor] = None,
                 lengths: Optional[torch.Tensor] = None, offsets: Optional[torch.Tensor] = None):
        # integer weights are admitted here (not on a KeyedJaggedTensor, whose weights scale lookups):
        # EmbeddingCollection(need_indices=True) returns the ids as its output's weights, as TorchRec
        self._lengths, self._offsets = check_jagged(values, lengths, offsets, weights, "JaggedTensor",
                                                    values_1d=False, float_weights=False)
        self._values = values
        self._weights = weights
        self._lengths_given, self._offsets_given = lengths is not None, offsets is not None

    # ---- constructors -------------------------------------------------------------------------
    @classmethod
    def from_lengths(cls, values, lengths, weights=None) -> "JaggedTensor":
        return cls(values, weights=weights, lengths=lengths)

    @classmethod
    def from_offsets(cls, values, offsets, weights=None) -> "JaggedTensor":
        return cls(values, weights=weights, offsets=offsets)

    @staticmethod
    def empty(is_weighted: bool = False, device=None, values_dtype=None, weights_dtype=None,
              lengths_dtype: torch.dtype = torch.int32) -> "JaggedTensor":
        """No bags. ``values_dtype`` defaults to torch's default dtype, as TorchRec's does."""
        w = torch.empty(0, dtype=weights_dtype, device=device) if is_weighted else None
        return JaggedTensor(torch.empty(0, dtype=values_dtype, device=device), w,
                            torch.empty(0, dtype=lengths_dtype, device=device))

    @staticmethod
    def empty_like(jt: "JaggedTensor", device=None) -> "JaggedTensor":
        """With ``device=None`` no bags, same dtypes; else uninitialised tensors of ``jt``'s shapes there.

        The copy keeps ``jt``'s lengths (``empty_like`` of them would be garbage that fails validation).
        """
        if device is None:
            w = None if jt._weights is None else jt._weights.new_empty(0)
            return JaggedTensor(jt._values.new_empty((0,) + tuple(jt._values.shape[1:])), w,
                                jt._lengths.new_empty(0))
        w = None if jt._weights is None else torch.empty_like(jt._weights, device=device)
        return JaggedTensor(torch.empty_like(jt._values, device=device), w, jt._lengths.to(device))

    @staticmethod
    def from_dense(values: list, weights: Optional[list] = None) -> "JaggedTensor":
        """One tensor per bag: ``from_dense([t0, t1, ...])`` has lengths ``[len(t0), len(t1), ...]``."""
        if not isinstance(values, (list, tuple)) or not values:
            raise ValueError(f"from_dense needs a non-empty list of tensors (one per bag), got {values!r}")
        if weights is not None and len(weights) != len(values):
            raise ValueError(f"from_dense: {len(weights)} weight tensors for {len(values)} bags; give one per bag")
        flat = torch.cat(list(values), dim=0)
        lengths = torch.tensor([v.shape[0] for v in values], dtype=torch.int64, device=flat.device)
        w = torch.cat(list(weights), dim=0) if weights is not None else None
        return JaggedTensor(flat, w, lengths)

    @staticmethod
    def from_dense_lengths(values: torch.Tensor, lengths: torch.Tensor,
                           weights: Optional[torch.Tensor] = None) -> "JaggedTensor":
        """Bag ``i`` is the first ``lengths[i]`` entries of row ``i`` of a padded ``[B, N]`` tensor."""
        return jt_from_dense_lengths(values, lengths, weights)

    # ---- views --------------------------------------------------------------------------------
    def to_dense(self) -> list[torch.Tensor]:
        """One tensor per bag."""
        return list(torch.split(self._values, self._lengths.tolist()))

    def to_dense_weights(self) -> Optional[list[torch.Tensor]]:
        """One weight tensor per bag, or None when unweighted."""
        if self._weights is None:
            return None
        return list(torch.split(self._weights, self._lengths.tolist()))

    def _padded(self, flat: torch.Tensor, desired_length: Optional[int], padding_value) -> torch.Tensor:
        n = int(self._lengths.max().item()) if desired_length is None and self._lengths.numel() else \
            (desired_length or 0)
        out = flat.new_full((self._lengths.numel(), n) + tuple(flat.shape[1:]), padding_value)
        pos = torch.arange(flat.shape[0], device=flat.device) - torch.repeat_interleave(
            self._offsets[:-1], self._lengths, output_size=flat.shape[0])
        row = torch.repeat_interleave(torch.arange(self._lengths.numel(), device=flat.device), self._lengths,
                                      output_size=flat.shape[0])
        keep = pos < n   # bags longer than desired_length are truncated, as TorchRec does
        out[row[keep], pos[keep]] = flat[keep]
        return out

    def to_padded_dense(self, desired_length: Optional[int] = None, padding_value: float = 0.0) -> torch.Tensor:
        """``[B, N]``: bags padded with ``padding_value`` (N = longest bag or ``desired_length``)."""
        return self._padded(self._values, desired_length, padding_value)

    def to_padded_dense_weights(self, desired_length: Optional[int] = None,
                                padding_value: float = 0.0) -> Optional[torch.Tensor]:
        """Like ``to_padded_dense`` for the weights; None when unweighted."""
        return None if self._weights is None else self._padded(self._weights, desired_length, padding_value)

    # ---- movement -----------------------------------------------------------------------------
    def to(self, device, non_blocking: bool = False) -> "JaggedTensor":
        w = None if self._weights is None else self._weights.to(device, non_blocking=non_blocking)
        return JaggedTensor(self._values.to(device, non_blocking=non_blocking), w,
                            self._lengths.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "JaggedTensor":
        w = None if self._weights is None else self._weights.pin_memory()
        return JaggedTensor(self._values.pin_memory(), w, self._lengths.pin_memory())

    def __len__(self) -> int:
        return self._lengths.numel()

    def __str__(self) -> str:
        return jt_string(self._values, self._weights, self._offsets.tolist())

    def __repr__(self) -> str:
        return f"JaggedTensor(values={self._values}, lengths={self._lengths}, weights={self._weights})"
