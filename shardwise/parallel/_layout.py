"""Turning a module's plain-tensor inputs and outputs into DTensors and back, for the styles.

A plain tensor is this rank's piece of a global tensor laid out as a given placement. Like
torch's styles, the pieces are taken to be even (the global size along a sharded dim is the local size
times the mesh size): no communication. Where the module fixes the size (a Linear's input features)
that size is used, which is the same for even pieces and also right for uneven ones. With
``uneven_shards=True`` the other sharded sizes are summed over the mesh (one small all-reduce per
wrapped tensor), so uneven ``torch.chunk`` pieces (e.g. 5 rows on 2 ranks) work.
"""

from __future__ import annotations

from typing import Optional

import torch

from shardwise.tensor import DTensor, Placement
from shardwise.tensor.collectives import all_reduce

__all__ = ["check_placement", "as_layouts", "check_flag", "wrap_local", "to_dtensor", "from_dtensor"]


def check_placement(value, what: str, style: str) -> Optional[Placement]:
    if value is None or isinstance(value, Placement):
        return value
    raise TypeError(
        f"{style}({what}={value!r}): expected one Placement for the 1-D tensor-parallel mesh, "
        "e.g. Shard(-1) or Replicate()"
    )


def as_layouts(value, what: str, style: str) -> Optional[tuple]:
    """``None``, or a tuple of placements (``None`` entries allowed) from one placement or a sequence."""
    if value is None:
        return None
    seq = (value,) if isinstance(value, Placement) else value
    if not isinstance(seq, (tuple, list)):
        raise TypeError(f"{style}({what}={value!r}): expected a Placement or a tuple of Placements/None, "
                        "e.g. (Shard(0), None)")
    return tuple(check_placement(p, what, style) for p in seq)


def check_flag(value, what: str, style: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{style}({what}={value!r}): pass True or False")
    return value


def wrap_local(x: torch.Tensor, mesh, placement: Placement, uneven: bool, known: Optional[dict] = None) -> DTensor:
    """This rank's piece ``x`` laid out as ``placement``, as a DTensor. ``known`` maps dims (either sign)
    to global sizes the module fixes; see the module docstring for the rest."""
    shape = None
    if placement.is_shard() and x.ndim:
        d = placement.dim % x.ndim
        known = known or {}
        size = known.get(d, known.get(d - x.ndim))
        if size is None and uneven:
            local = torch.tensor([x.shape[d]], dtype=torch.long, device=x.device)
            size = int(all_reduce(local, "sum", mesh, 0).item())
        if size is not None:
            shape = list(x.shape)
            shape[d] = size
    return DTensor.from_local(x, mesh, [placement], shape=shape)


def to_dtensor(x, mesh, src: Optional[Placement], dst: Optional[Placement], uneven: bool = False,
               known: Optional[dict] = None):
    """Lay out one input: a plain tensor is wrapped as ``src`` (None: left alone); a DTensor keeps its
    own layout. Either is then redistributed to ``dst`` (None: as is)."""
    if not isinstance(x, torch.Tensor):
        return x
    if not isinstance(x, DTensor):
        if src is None:
            return x
        x = wrap_local(x, mesh, src, uneven, known)
    if dst is not None and x.placements != (dst,):
        x = x.redistribute(mesh, [dst])
    return x


def from_dtensor(x, mesh, dst: Optional[Placement], use_local: bool):
    """Lay out one output: a DTensor is redistributed to ``dst`` (None: as is), then made local if asked."""
    if not isinstance(x, DTensor):
        return x
    if dst is not None and x.placements != (dst,):
        x = x.redistribute(mesh, [dst])
    return x.to_local() if use_local else x
