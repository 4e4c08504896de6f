"""A rebuilt group's new store may take over an old buffer of the same shape instead of new memory.

Why: on CPU the first touch of a fresh page costs about as much as carrying its bytes over the wire,
and a rebuilt group would otherwise copy every table that stays into new memory. When an old buffer
has the shape of a new one and every box the two hold sits at the same row in both, the new store
takes the old buffer over (weights and every state tensor): those boxes
need no copy at all, and received rows land in memory already faulted in. Which old bytes are still
to be read when a write lands is the executor's to check (``plan_moves``); the buffers where the
loop's order cannot keep a read before the write get fresh memory again (:func:`release`).

Example:
    >>> adopt_buffers(old_groups, rebuilt)           # doctest: +SKIP
    >>> moves = plan_moves(pieces, kinds, views, rank, world, dtype, chunk)   # doctest: +SKIP
    >>> release(rebuilt, moves.conflicts)            # doctest: +SKIP
"""

from __future__ import annotations

import torch

__all__ = ["adopt_buffers", "release", "memory_split"]


def _tensors(store, w: int) -> list:
    return [store.buffers[w], *store.states[w].values()]


def _in_place(new, w: int, old, ow: int):
    """Boxes of new buffer ``w`` found at the same row of old buffer ``ow``, or None when the buffers
    differ in shape or a box the two share would have to move within the buffer."""
    if [(t.shape, t.dtype) for t in _tensors(new, w)] != [(t.shape, t.dtype) for t in _tensors(old, ow)] or \
            list(new.states[w]) != list(old.states[ow]):
        return None
    at = {old.boxes[i]: where for i, where in old.loc.items()}
    kept = 0
    for i, (nw, base) in new.loc.items():
        where = at.get(new.boxes[i])
        if nw != w or where is None or where[0] != ow:
            continue
        if where[1] != base:
            return None
        kept += new.boxes[i].row_size
    return kept


def adopt_buffers(old_groups: list, rebuilt: list) -> None:
    """Give each rebuilt group's new buffers the old buffer that fits best (same shapes; the most rows
    already in place; one of the same sharding type first, since only those can hold a box in place);
    the rest keep their fresh, untouched memory. A layout change (table- to row-wise, say) whose rank
    holds as many rows after as before takes over the old memory whole: its kept rows often sit at the
    same place (then they need no copy), and it writes no fresh page."""
    free = {(k, ow) for k, g in enumerate(old_groups) for ow in range(len(g.store.widths))}
    for g in rebuilt:
        for w in range(len(g.store.widths)):
            fits = {(k, ow): _in_place(g.store, w, old_groups[k].store, ow) for k, ow in sorted(free)}
            fits = {key: kept for key, kept in fits.items() if kept is not None}
            if not fits:
                continue
            k, ow = max(fits, key=lambda key: (old_groups[key[0]].sharding_type == g.sharding_type,
                                                fits[key], -key[0], -key[1]))
            free.discard((k, ow))
            src = old_groups[k].store
            g.store.buffers[w] = src.buffers[ow]
            g.store.states[w] = dict(src.states[ow])


def release(rebuilt: list, storages: set) -> None:
    """Fresh memory for the new buffers whose storage is in ``storages`` (taken over, but a write
    would land before a read of the old bytes under it)."""
    for g in rebuilt:
        s = g.store
        for w in range(len(s.widths)):
            if s.buffers[w].untyped_storage().data_ptr() in storages:
                s.buffers[w] = torch.empty_like(s.buffers[w])
            for name, t in s.states[w].items():
                if t.untyped_storage().data_ptr() in storages:
                    s.states[w][name] = torch.empty_like(t)


def memory_split(old_groups: list, rebuilt: list) -> tuple:
    """(bytes of the rebuilt stores in memory taken over from old stores, bytes in new memory)."""
    old = {t.untyped_storage().data_ptr() for g in old_groups for w in range(len(g.store.widths))
           for t in _tensors(g.store, w)}
    reused = fresh = 0
    for g in rebuilt:
        for w in range(len(g.store.widths)):
            for t in _tensors(g.store, w):
                n = t.numel() * t.element_size()
                if t.untyped_storage().data_ptr() in old:
                    reused += n
                else:
                    fresh += n
    return reused, fresh
