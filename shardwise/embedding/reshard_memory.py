"""Memory for a reshard's new stores, and the test that decides which writes must wait.

A reshard that rebuilds a sharding-type group used to allocate the group's new buffers afresh and copy
every kept row into them. On CPU that costs twice: the copy itself, and a page fault per 4 KiB page of
the new memory on first touch (measured here: filling 100 MB of fresh memory took ~5x as long as
filling a warm buffer). Instead, a new buffer is carved out of the old buffers' memory wherever that
puts rows that stay on this rank exactly where they already are (no copy at all), and only buffers
that cannot be placed so get fresh memory, advised to use 2 MiB pages (one fault per 2 MiB).

Carving never leaves memory dead: a region of old buffers is reused only if new buffers cover it
completely, so after the reshard every byte of kept storage belongs to some new buffer.

Because new buffers may then overlap old shards that are still being sent or copied, a write must
wait for the reads of the bytes it overwrites (``span``): ``reshard_schedule`` orders the gloo move
by exactly that, and the one-batch path for other backends checks writes against :class:`Spans`.
"""

from __future__ import annotations

import bisect
import ctypes
import sys
from dataclasses import dataclass, field

import torch

__all__ = ["fresh", "fresh_copy", "span", "Spans", "NewBuffer", "carve"]

_HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14


def fresh(shape, dtype, device) -> torch.Tensor:
    """Uninitialised memory; large CPU buffers are advised to use transparent huge pages."""
    t = torch.empty(shape, dtype=dtype, device=device)
    if t.device.type == "cpu" and sys.platform.startswith("linux") and t.numel() * t.element_size() >= 4 * _HUGE_PAGE:
        _advise_huge_pages(t)
    return t


def fresh_copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``t`` in :func:`fresh` memory (a temporary that must outlive the reads)."""
    out = fresh(t.shape, t.dtype, t.device)
    out.copy_(t)
    return out


def _advise_huge_pages(t: torch.Tensor) -> None:
    # Must run before the first touch. Only a hint: where transparent huge pages are off, the kernel
    # ignores it and the buffer simply faults in 4 KiB pages as before.
    start, end = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    lo, hi = -(-start // _HUGE_PAGE) * _HUGE_PAGE, end // _HUGE_PAGE * _HUGE_PAGE
    if hi <= lo:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), ctypes.c_int(_MADV_HUGEPAGE))
    except (OSError, AttributeError):
        pass


def span(t: torch.Tensor) -> tuple[int, int]:
    """Bytes [lo, hi) of memory that view ``t`` can touch (a column slice spans its whole rows)."""
    if t.numel() == 0:
        return (0, 0)
    extent = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + extent * t.element_size()


class Spans:
    """Byte spans still to be read; ``meets(s)`` tells whether span ``s`` overlaps any of them."""

    def __init__(self, spans):
        spans = sorted(x for x in spans if x[1] > x[0])
        self._starts = [lo for lo, _ in spans]
        self._reach, top = [], 0
        for _, hi in spans:          # furthest end among the spans starting so far
            top = max(top, hi)
            self._reach.append(top)

    def meets(self, s: tuple[int, int]) -> bool:
        if s[1] <= s[0]:
            return False
        i = bisect.bisect_left(self._starts, s[1])     # spans starting before s ends
        return i > 0 and self._reach[i - 1] > s[0]


@dataclass
class NewBuffer:
    """One new width buffer of one kind (weights or an element-wise state) on this rank.

    ``in_place``: (old contiguous view, first row in this buffer) of rows that stay on this rank with
    this buffer's width -- where the buffer would have to start for them to need no copy.
    """

    key: tuple
    rows: int
    width: int
    in_place: list = field(default_factory=list)

    @property
    def numel(self) -> int:
        return self.rows * self.width


def _regions(owned: list) -> dict:
    """{storage address: [[lo, hi, holder tensor], ...]} merged element ranges of the old buffers."""
    per: dict = {}
    for t in owned:
        if t.numel():
            per.setdefault(t.untyped_storage().data_ptr(), []).append(
                [t.storage_offset(), t.storage_offset() + t.numel(), t])
    out = {}
    for key, rs in per.items():
        rs.sort(key=lambda r: r[0])
        merged = [rs[0]]
        for r in rs[1:]:
            if r[0] <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], r[1])
            else:
                merged.append(r)
        out[key] = merged
    return out


def _candidates(buffers: list, regions: dict) -> list:
    """(bytes kept in place, buffer index, storage, start, region) for each feasible placement."""
    out = []
    for bi, b in enumerate(buffers):
        score: dict = {}
        for view, row in b.in_place:
            key = (view.untyped_storage().data_ptr(), view.storage_offset() - row * b.width)
            score[key] = score.get(key, 0) + view.numel()
        for (storage, start), kept in score.items():
            for ri, (lo, hi, _) in enumerate(regions.get(storage, [])):
                if lo <= start and start + b.numel <= hi:
                    out.append((kept, bi, storage, start, ri))
    out.sort(key=lambda c: (-c[0], c[1], c[3]))
    return out


def carve(buffers: list, owned: list) -> dict:
    """Place new buffers inside the old buffers ``owned`` (same kind, being released by this reshard).

    Returns ``{buffer key: tensor}`` for the buffers placed; the others need fresh memory. A region
    (adjacent old buffers in one storage) is reused only if placements cover it completely: first the
    placements that keep the most bytes in place, then buffers of exactly a leftover gap's size.
    """
    regions = _regions(owned)
    placed: dict = {}           # (storage, region index) -> {buffer index: start}
    taken: set = set()
    for _, bi, storage, start, ri in _candidates(buffers, regions):
        mine = placed.setdefault((storage, ri), {})
        end = start + buffers[bi].numel
        if bi not in taken and not any(st < end and start < st + buffers[j].numel for j, st in mine.items()):
            mine[bi] = start
            taken.add(bi)
    out = {}
    for (storage, ri), mine in sorted(placed.items()):
        lo, hi, holder = regions[storage][ri]
        filled = _fill_gaps(buffers, taken, mine, lo, hi) if mine else None
        for bi, st in (filled or {}).items():   # None: a gap nothing fits; the region is released
            b = buffers[bi]
            out[b.key] = holder.new_empty(0).set_(holder.untyped_storage(), st, (b.rows, b.width), (b.width, 1))
    return out


def _fill_gaps(buffers: list, taken: set, mine: dict, lo: int, hi: int):
    """``mine`` plus untaken buffers that exactly fill the gaps of [lo, hi); None if impossible."""
    pos, gaps = lo, []
    for bi, st in sorted(mine.items(), key=lambda x: x[1]):
        if st > pos:
            gaps.append((pos, st))
        pos = st + buffers[bi].numel
    if pos < hi:
        gaps.append((pos, hi))
    out, used = dict(mine), set()
    for g0, g1 in gaps:
        fit = next((bi for bi, b in enumerate(buffers) if bi not in taken and bi not in used
                    and b.numel == g1 - g0), None)
        if fit is None:
            return None
        used.add(fit)
        out[fit] = g0
    taken.update(used)
    return out
