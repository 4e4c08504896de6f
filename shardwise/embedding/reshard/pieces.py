"""The pieces of a reshard: the overlap of a table's old and new shard boxes, computed alike on every rank.

Example:
    >>> from shardwise.embedding.plan.values import ShardBox
    >>> old = {"t": [ShardBox("t", 0, 0, 10, 0, 4)]}
    >>> new = {"t": [ShardBox("t", 0, 0, 5, 0, 4), ShardBox("t", 1, 5, 5, 0, 4)]}
    >>> [(p.src, p.dst, p.r0, p.r1) for p in plan_pieces(["t"], old, new, set())]
    [(0, 0, 0, 5), (0, 1, 5, 10)]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..optim.rules import STATE_DTYPE
from ..plan.values import ShardBox

__all__ = ["Piece", "plan_pieces", "whole_box", "piece_numel", "piece_bytes", "cut", "state_kinds", "itemsize"]


@dataclass(frozen=True)
class Piece:
    """Rows [r0, r1) x columns [c0, c1) of ``table`` going from ``src`` (inside ``src_box``) to
    ``dst`` (inside ``dst_box``), with every optimizer-state tensor of those rows: element-wise state
    (Adagrad's sum, Adam's moments) over the same rectangle, per-row state once per row."""

    table: str
    src: int
    dst: int
    r0: int
    r1: int
    c0: int
    c1: int
    src_box: ShardBox
    dst_box: ShardBox


def state_kinds(rule) -> list:
    """(state name or None for the weight, 'elem' | 'row') in a fixed order shared by all ranks."""
    return [(None, "elem")] + ([(n, k) for n, k in rule.state_shapes.items()] if rule is not None else [])


def itemsize(what, weight_dtype) -> int:
    """Bytes per element of the weights (``what=None``, the table's dtype) or of a state tensor (fp32)."""
    return (weight_dtype if what is None else STATE_DTYPE).itemsize


def plan_pieces(tables: list, old: dict, new: dict, replicated: set) -> list:
    """Overlap of old and new boxes, in a canonical order (table config order, new box, old box).

    ``tables``: names in config order; ``old``/``new``: {table: [ShardBox]}; ``replicated``: tables
    whose old boxes are full replicas (data-parallel) -- a destination reads its own replica when it
    has one, else the replica on ``dst % replicas`` so the sources spread.
    """
    out = []
    for name in (n for n in tables if n in new):
        olds = [b for b in old[name] if b.row_size > 0 and b.col_size > 0]
        for nb in (b for b in new[name] if b.row_size > 0 and b.col_size > 0):
            sources = olds
            if name in replicated:
                sources = [b for b in olds if b.rank == nb.rank] or [olds[nb.rank % len(olds)]]
            for ob in sources:
                r0, r1 = max(ob.row_offset, nb.row_offset), min(ob.row_offset + ob.row_size,
                                                                nb.row_offset + nb.row_size)
                c0, c1 = max(ob.col_offset, nb.col_offset), min(ob.col_offset + ob.col_size,
                                                                nb.col_offset + nb.col_size)
                if r1 > r0 and c1 > c0:
                    out.append(Piece(name, ob.rank, nb.rank, r0, r1, c0, c1, ob, nb))
    return out


def whole_box(b: ShardBox) -> Piece:
    """A box that stays where it is, as a piece from itself to itself."""
    return Piece(b.table, b.rank, b.rank, b.row_offset, b.row_offset + b.row_size, b.col_offset,
                 b.col_offset + b.col_size, b, b)


def piece_numel(p: Piece, kind: str) -> int:
    """Elements of one state kind the piece carries (per-row state travels once per row, with the
    piece holding the new box's first column)."""
    if kind == "row":
        return (p.r1 - p.r0) if p.c0 == p.dst_box.col_offset else 0
    return (p.r1 - p.r0) * (p.c1 - p.c0)


def piece_bytes(p: Piece, kinds: list, weight_dtype) -> int:
    """Bytes of the weights and every state tensor (``kinds``: :func:`state_kinds`) the piece carries."""
    return sum(piece_numel(p, kind) * itemsize(what, weight_dtype) for what, kind in kinds)


def cut(view: torch.Tensor, box: ShardBox, p: Piece, kind: str) -> torch.Tensor:
    """The piece's part of ``view``, the rows of ``box`` in a store (weights or one state tensor)."""
    rows = slice(p.r0 - box.row_offset, p.r1 - box.row_offset)
    if kind == "row":
        return view[rows]
    return view[rows, p.c0 - box.col_offset:p.c1 - box.col_offset]
