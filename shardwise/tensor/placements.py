"""Placements: how one mesh dimension lays out a tensor.

Placements are small frozen values. They are hashable, compare by value and carry no mutable state,
so a sharding decision cached for one call is valid for every later call with equal inputs.

>>> Shard(0), Replicate(), Partial()
(Shard(dim=0), Replicate(), Partial(reduce_op='sum'))
>>> print(Shard(0), Replicate(), Partial("max"))
S(0) R P(max)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["Placement", "Shard", "Replicate", "Partial", "MaskPartial", "NormPartial", "REDUCE_OPS"]

# PyTorch's Partial reduce ops (c10d's); band/bor/bxor are for integer tensors
REDUCE_OPS = ("sum", "avg", "max", "min", "product", "band", "bor", "bxor")


class Placement:
    """Base of all placements. Subclasses are frozen dataclasses.

    Example:
        >>> isinstance(Shard(0), Placement), Shard(0).is_shard(dim=0), Replicate().is_replicate()
        (True, True, True)
    """

    __slots__ = ()

    def is_shard(self, dim: int | None = None) -> bool:
        return False

    def is_replicate(self) -> bool:
        return False

    def is_partial(self) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class Shard(Placement):
    """The tensor is split along ``dim`` with ``torch.chunk`` semantics (trailing shards may be short
    or empty).

    >>> print(Shard(1))
    S(1)
    """

    dim: int

    def __post_init__(self):
        if not isinstance(self.dim, int) or isinstance(self.dim, bool):
            raise TypeError(f"Shard(dim={self.dim!r}): dim must be an int, e.g. Shard(0)")

    def is_shard(self, dim: int | None = None) -> bool:
        return dim is None or dim == self.dim

    def __str__(self) -> str:
        return f"S({self.dim})"


@dataclass(frozen=True, slots=True)
class Replicate(Placement):
    """Every rank of the mesh dimension holds the whole tensor.

    >>> print(Replicate())
    R
    """

    def is_replicate(self) -> bool:
        return True

    def __str__(self) -> str:
        return "R"


@dataclass(frozen=True, slots=True)
class Partial(Placement):
    """Every rank holds a partial value; the global value is their reduction with ``reduce_op``: one of
    ``REDUCE_OPS`` as in PyTorch (``"product"`` multiplies; ``"band"``/``"bor"``/``"bxor"`` for integers).

    >>> print(Partial("avg"), Partial("product"))
    P(avg) P(product)
    """

    reduce_op: str = "sum"

    def __post_init__(self):
        if self.reduce_op not in REDUCE_OPS:
            raise ValueError(
                f"Partial(reduce_op={self.reduce_op!r}): reduce_op must be one of {REDUCE_OPS}; "
                "use Partial('sum') for pending sums"
            )

    def is_partial(self) -> bool:
        return True

    def is_linear(self) -> bool:
        """Sum and average commute with linear ops (add, scale, matmul with a replicated operand)."""
        return self.reduce_op in ("sum", "avg")

    # How the parts are reduced: ``after_reduce(c10d reduce with collective_op of before_reduce(part))``.
    # Identity for the c10d ops; NormPartial reduces p-th powers.
    @property
    def collective_op(self) -> str:
        return self.reduce_op

    def before_reduce(self, x):
        return x

    def after_reduce(self, x):
        return x

    def __str__(self) -> str:
        return f"P({self.reduce_op})"


@dataclass(frozen=True, slots=True)
class MaskPartial(Partial):
    """A pending sum produced by a row-wise (dim-0) sharded lookup.

    Each rank looked up only the ids inside its own row block and wrote zero rows for the others, so
    the global value is the sum over the mesh dimension. The mask itself is never stored here: it is
    applied inside the lookup kernel. The fields are plain values describing the sharded table
    (``num_embeddings`` rows split over mesh dimension ``mesh_dim``), so equal lookups share one cached
    sharding decision.

    >>> print(MaskPartial(num_embeddings=10, mesh_dim=0))
    MP(10@0)
    """

    reduce_op: str = field(default="sum", init=False, repr=False)
    num_embeddings: int = -1
    mesh_dim: int = 0

    def __post_init__(self):
        for name in ("num_embeddings", "mesh_dim"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeError(f"MaskPartial({name}={v!r}): must be an int")

    def __str__(self) -> str:
        return f"MP({self.num_embeddings}@{self.mesh_dim})"


@dataclass(frozen=True, slots=True)
class NormPartial(Partial):
    """A pending p-norm (PyTorch's ``_NormPartial``): every rank holds the p-norm of its part of the
    values, and the global value is the p-norm of the parts, ``(sum_r |x_r|^p)^(1/p)`` (``max_r`` for
    ``p = inf``). A sharded vector's norm becomes one without a collective, and norms of such norms stay
    pending (gradient clipping reduces once for all gradients).

    The parts are reduced sign-preserving (``sign(x)|x|^p``, summed, ``sign(s)|s|^(1/p)``): for the
    non-negative parts of a norm that is the p-norm, and a replicated value taken as a pending one (kept
    on one rank, zeros elsewhere; on every rank for ``inf``) comes back exactly, negative or not.

    >>> print(NormPartial(2.0), NormPartial(float("inf")))
    NP(2) NP(inf)
    >>> NormPartial(2).is_linear(), NormPartial(2) == Partial("sum")
    (False, False)
    """

    reduce_op: str = field(default="norm", init=False, repr=False)
    norm_type: float = 2.0

    def __post_init__(self):
        p = self.norm_type
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not (p > 0):
            raise ValueError(
                f"NormPartial(norm_type={p!r}): norm_type must be a number > 0 (inf allowed); a 0-norm is a "
                "pending sum (Partial('sum')) and a -inf norm a pending minimum (Partial('min'))"
            )
        object.__setattr__(self, "norm_type", float(p))

    def is_linear(self) -> bool:
        return False

    @property
    def collective_op(self) -> str:
        return "max" if self.norm_type == math.inf else "sum"

    def before_reduce(self, x):
        if self.norm_type == math.inf:
            return x
        return x.sign() * x.abs().pow(self.norm_type) if self.norm_type != 1 else x

    def after_reduce(self, x):
        if self.norm_type in (1, math.inf):
            return x
        return x.sign() * x.abs().pow(1.0 / self.norm_type)

    def combine(self, parts):
        """The global value from the parts stacked along dim 0 (the reduction the collectives do)."""
        reduced = parts.amax(0) if self.norm_type == math.inf else self.before_reduce(parts).sum(0)
        return self.after_reduce(reduced)

    def split(self, full, n: int, gen) -> list:
        """``n`` parts of ``full`` of the forms the ops make (the validator's inputs): a non-negative
        element as non-negative parts, a negative one on one rank (on every rank for ``inf``)."""
        import torch

        owner = torch.randint(0, n, full.shape, generator=gen)
        share = torch.rand((n, *full.shape), generator=gen, dtype=full.dtype)
        neg = full < 0
        parts = []
        for r in range(n):
            if self.norm_type == math.inf:  # non-negative: below the value except on the owner
                part = torch.where(owner == r, full, full * share[r])
                parts.append(torch.where(neg, full, part))
            else:  # non-negative: shares whose p-th powers sum to |x|^p
                w = share / share.sum(0)
                part = full * w[r].pow(1.0 / self.norm_type)
                parts.append(torch.where(neg, torch.where(owner == r, full, torch.zeros_like(full)), part))
        return parts

    def __str__(self) -> str:
        return f"NP({self.norm_type:g})"
