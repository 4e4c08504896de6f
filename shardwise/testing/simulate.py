"""Simulated ranks: collectives and sharding computed on a list of per-rank tensors, in one process.

These are the ground truth for the second rung of the test ladder (shape and value checks without
processes) and the reference that real multi-process results are compared with. They are written
directly from the definitions of the collectives and ``torch.chunk``, independently of the code
under test, and are themselves checked against real gloo collectives in ``tests/testing``.

Conventions: ``per_rank[r]`` is rank ``r``'s tensor; every function returns a new list of
``world_size`` tensors, one per rank, and never modifies its inputs. Shards follow ``torch.chunk``:
chunk size ``ceil(n / world_size)``, trailing ranks short or empty.

Example::

    full = torch.arange(10.0)
    shards = shard(full, 0, 4)            # sizes 3, 3, 3, 1
    assert torch.equal(unshard(shards, 0), full)
    assert all(torch.equal(t, full) for t in all_gather(shards, 0))
"""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = [
    "chunk_sizes",
    "shard",
    "unshard",
    "per_rank_randn",
    "all_reduce",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "REDUCE_OPS",
]

REDUCE_OPS = ("sum", "avg", "max", "min", "product")


def chunk_sizes(n: int, world_size: int) -> list[int]:
    """Length of each rank's shard of ``n`` items under ``torch.chunk`` semantics.

    Example: ``chunk_sizes(10, 4) == [3, 3, 3, 1]``, ``chunk_sizes(2, 4) == [1, 1, 0, 0]``.
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r}: must be an int >= 1")
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n={n!r}: a dimension size must be an int >= 0")
    chunk = -(-n // world_size)
    return [max(0, min(chunk, n - r * chunk)) for r in range(world_size)]


def shard(full: torch.Tensor, dim: int, world_size: int) -> list[torch.Tensor]:
    """Split ``full`` along ``dim`` into ``world_size`` shards, empty ones included."""
    dim = _check_dim(full, dim)
    sizes = chunk_sizes(full.shape[dim], world_size)
    return [t.clone() for t in torch.split(full, sizes, dim=dim)]


def unshard(shards: Sequence[torch.Tensor], dim: int) -> torch.Tensor:
    """Concatenate shards along ``dim``: the inverse of :func:`shard`."""
    _check_list(shards)
    return torch.cat(list(shards), dim=_check_dim(shards[0], dim))


def per_rank_randn(world_size: int, shape: Sequence[int], seed: int = 0,
                   dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """Distinct random CPU tensors, one per rank, the same wherever they are generated.

    A rank picks ``per_rank_randn(...)[ctx.rank]`` and moves it to its device; the parent builds
    the same list to compute the expected result.
    """
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(tuple(shape), generator=gen, dtype=dtype) for _ in range(world_size)]


def all_reduce(per_rank: Sequence[torch.Tensor], op: str = "sum") -> list[torch.Tensor]:
    """Every rank gets the element-wise reduction of all ranks' tensors."""
    _check_same_shape(per_rank, "all_reduce")
    total = _reduce(per_rank, op)
    return [total.clone() for _ in per_rank]


def broadcast(per_rank: Sequence[torch.Tensor], src: int) -> list[torch.Tensor]:
    """Every rank gets rank ``src``'s tensor."""
    _check_list(per_rank)
    if not 0 <= src < len(per_rank):
        raise ValueError(f"src={src}: must be a rank in [0, {len(per_rank) - 1}]")
    return [per_rank[src].clone() for _ in per_rank]


def all_gather(per_rank: Sequence[torch.Tensor], dim: int = 0) -> list[torch.Tensor]:
    """Every rank gets all ranks' tensors concatenated along ``dim`` (uneven sizes allowed)."""
    full = unshard(per_rank, dim)
    return [full.clone() for _ in per_rank]


def reduce_scatter(per_rank: Sequence[torch.Tensor], dim: int = 0,
                   op: str = "sum") -> list[torch.Tensor]:
    """Rank ``r`` gets shard ``r`` (``torch.chunk`` semantics) of the reduction of all tensors."""
    _check_same_shape(per_rank, "reduce_scatter")
    return shard(_reduce(per_rank, op), dim, len(per_rank))


def all_to_all(per_rank: Sequence[torch.Tensor], split_dim: int,
               cat_dim: int) -> list[torch.Tensor]:
    """Rank ``r`` gets shard ``r`` of every rank's tensor along ``split_dim``, concatenated along
    ``cat_dim`` in source-rank order (the exchange behind ``Shard(i) -> Shard(j)``)."""
    _check_list(per_rank)
    world = len(per_rank)
    pieces = [shard(t, split_dim, world) for t in per_rank]  # pieces[src][dst]
    return [unshard([pieces[src][dst] for src in range(world)], cat_dim) for dst in range(world)]


def _reduce(per_rank: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    stacked = torch.stack(list(per_rank))
    if op == "sum":
        return stacked.sum(0)
    if op == "avg":
        return stacked.sum(0) / len(per_rank)
    if op == "max":
        return stacked.amax(0)
    if op == "min":
        return stacked.amin(0)
    if op == "product":
        return stacked.prod(0)
    raise ValueError(f"op={op!r}: a reduction must be one of {REDUCE_OPS}")


def _check_list(per_rank: Sequence[torch.Tensor]) -> None:
    if len(per_rank) == 0:
        raise ValueError("per_rank is empty: pass one tensor per rank (at least one rank)")
    for r, t in enumerate(per_rank):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"per_rank[{r}] is a {type(t).__name__}: pass one tensor per rank")


def _check_same_shape(per_rank: Sequence[torch.Tensor], what: str) -> None:
    _check_list(per_rank)
    shapes = [tuple(t.shape) for t in per_rank]
    if len(set(shapes)) != 1:
        raise ValueError(f"{what} needs the same shape on every rank; got shapes {shapes} by rank")


def _check_dim(t: torch.Tensor, dim: int) -> int:
    if t.dim() == 0:
        raise ValueError(f"dim={dim} on a 0-D tensor: a scalar has no dim to split or join")
    if not -t.dim() <= dim < t.dim():
        raise ValueError(
            f"dim={dim} on a {t.dim()}-D tensor: dim must be in [{-t.dim()}, {t.dim() - 1}]"
        )
    return dim % t.dim()
