"""Placements: how one mesh dimension lays out a tensor.

Placements are small frozen values. They are hashable, compare by value and carry no mutable state,
so a sharding decision cached for one call is valid for every later call with equal inputs.

>>> Shard(0), Replicate(), Partial()
(Shard(dim=0), Replicate(), Partial(reduce_op='sum'))
>>> print(Shard(0), Replicate(), Partial("max"))
S(0) R P(max)
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Placement", "Shard", "Replicate", "Partial", "MaskPartial", "REDUCE_OPS"]

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
