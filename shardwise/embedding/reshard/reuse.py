"""A rebuilt group's new store may take over an old buffer of the same shape instead of new memory:
its kept boxes need no copy, and received rows land in memory already faulted in (why: docs/reshard.md,
"How it works", step 3). ``plan_moves`` checks the move's order against it; :func:`release` gives the
buffers where a write would come before a read of the old bytes under it fresh memory again.

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


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _in_place(new, w: int, old, ow: int):
    """Rows of new buffer ``w``'s boxes found at the same row of old buffer ``ow``, or None when the
    buffers differ in shape or a box the two share would have to move within the buffer."""
    if [(t.shape, t.dtype) for t in _tensors(new, w)] != [(t.shape, t.dtype) for t in _tensors(old, ow)] or \
            list(new.states[w]) != list(old.states[ow]):
        return None
    old_rows = {old.boxes[i]: base for i, (x, base) in old.loc.items() if x == ow}
    shared = [(base, old_rows[new.boxes[i]], new.boxes[i].row_size) for i, (x, base) in new.loc.items()
              if x == w and new.boxes[i] in old_rows]
    return None if any(a != b for a, b, _ in shared) else sum(n for _, _, n in shared)


def adopt_buffers(old_groups: list, rebuilt: list) -> None:
    """Give each rebuilt group's new buffers the old buffer that fits best (same shapes; the most rows
    already in place; one of the same sharding type first, since only those can hold a box in place);
    the rest keep their fresh, untouched memory."""
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
            g.store.buffers[w] = old_groups[k].store.buffers[ow]
            g.store.states[w] = dict(old_groups[k].store.states[ow])


def release(rebuilt: list, storages: set) -> None:
    """Fresh memory for the new buffers whose storage is in ``storages`` (taken over, but a write
    would land before a read of the old bytes under it)."""
    for store in (g.store for g in rebuilt):
        for w in range(len(store.widths)):
            if _storage(store.buffers[w]) in storages:
                store.buffers[w] = torch.empty_like(store.buffers[w])
            store.states[w].update({n: torch.empty_like(t) for n, t in store.states[w].items()
                                    if _storage(t) in storages})


def memory_split(old_groups: list, rebuilt: list) -> tuple:
    """(bytes of the rebuilt stores in memory taken over from old stores, bytes in new memory)."""
    old = {_storage(t) for g in old_groups for w in range(len(g.store.widths)) for t in _tensors(g.store, w)}
    sizes = [(t.numel() * t.element_size(), _storage(t) in old)
             for g in rebuilt for w in range(len(g.store.widths)) for t in _tensors(g.store, w)]
    reused = sum(n for n, taken in sizes if taken)
    return reused, sum(n for n, _ in sizes) - reused
