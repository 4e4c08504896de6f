"""Per-parameter placement decisions for :class:`~.data_parallel.DataParallel`.

A sharded parameter is stored as ``Shard(0)``: dim 0 is padded up to a
multiple of the world size so every rank holds exactly
``ceil(shape[0] / N)`` rows (torch.chunk semantics for the valid part; the
padding is zero and stays zero through the optimizer).  Decisions depend on
names and shapes only, which every rank shares.

Example::

    lay = choose_layouts("fully_shard", {"w": torch.empty(5, 3)}, world=2)
    lay["w"].local_shape  # torch.Size([3, 3])
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch

__all__ = ["ParamLayout", "choose_layouts"]

ShardRule = Callable[[str, torch.Tensor], Optional[bool]]


@dataclass(frozen=True)
class ParamLayout:
    fqn: str
    shape: torch.Size
    dtype: torch.dtype
    sharded: bool
    world: int

    @property
    def rows(self) -> int:
        """Rows of dim 0 held per rank (padded) when sharded."""
        return math.ceil(self.shape[0] / self.world) if self.sharded else self.shape[0]

    @property
    def padded_rows(self) -> int:
        return self.rows * self.world if self.sharded else self.shape[0]

    @property
    def local_shape(self) -> torch.Size:
        if not self.sharded:
            return self.shape
        return torch.Size((self.rows, *self.shape[1:]))

    def valid_rows(self, rank: int) -> int:
        """Unpadded rows on ``rank`` (what ``torch.chunk`` would give it)."""
        if not self.sharded:
            return self.shape[0]
        return max(0, min(self.rows, self.shape[0] - rank * self.rows))


def choose_layouts(
    style: str,
    params: dict[str, torch.Tensor],
    world: int,
    threshold: int = 1 << 16,
    rule: ShardRule | None = None,
) -> dict[str, ParamLayout]:
    """Decide, per parameter, whether it is sharded.

    ``default`` shards parameters with at least ``threshold`` elements;
    ``rule(fqn, param)`` may override by returning True/False (None keeps
    the size decision).  0-dim parameters are always replicated.
    """
    out = {}
    for fqn, p in params.items():
        if style == "replicate" or p.dim() == 0:
            shard = False
        elif style == "fully_shard":
            shard = True
        else:
            shard = p.numel() >= threshold
            decided = rule(fqn, p) if rule is not None else None
            if decided is not None:
                if not isinstance(decided, bool):
                    raise TypeError(
                        f"shard_rule({fqn!r}, ...) returned {decided!r}; it must return "
                        "True (shard), False (replicate) or None (use the size threshold)"
                    )
                shard = decided and p.dim() > 0
        out[fqn] = ParamLayout(fqn, p.shape, p.dtype, shard, world)
    return out
