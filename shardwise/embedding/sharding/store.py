"""Local shard storage: one buffer per column width, plus the fused lookup/update autograd Function."""

from __future__ import annotations

import ctypes
import sys
from typing import Optional, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..optim.native_rows import native_group_by_row
from ..optim.occurrence_sgd import bag_of_occurrences
from ..optim.row_update import RowUpdate
from ..optim.rules import STATE_DTYPE
from ..plan.values import ShardBox

__all__ = ["advise_huge_pages", "local_layout", "ShardStore", "FusedLookup", "group_by_row", "summed_rows", "summed_row_gradients"]

_CHUNK_ELEMENTS = 128 * 1024   # ~512 KB of float32 per temporary: fits in L2
_BLOCK_ROWS = 8192             # touched rows per block of the fused backward (2 MiB of float32 x 64)


_HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14


def advise_huge_pages(t: torch.Tensor) -> torch.Tensor:
    """Ask Linux to back ``t``'s storage with transparent huge pages (``madvise(MADV_HUGEPAGE)``, a hint
    on this allocation only, never a process-wide setting); returns ``t``. Call it before the first
    write: pages already touched stay small. Lookups and updates touch rows all over a table, and with
    4 KiB pages nearly every row costs a TLB miss once a table outgrows the TLB's reach (a few MiB);
    2 MiB pages cut those misses. A no-op off Linux, on other devices, below 2 MiB, or where the
    kernel refuses (THP set to ``never``).

    Example:
        >>> table = advise_huge_pages(torch.empty(1 << 20, 8))   # 32 MiB, not yet written
        >>> table.fill_(0.5).shape                                # first touch: huge pages where granted
        torch.Size([1048576, 8])
    """
    nbytes = t.untyped_storage().nbytes()
    if t.device.type != "cpu" or nbytes < 2 * _HUGE_PAGE or not sys.platform.startswith("linux"):
        return t
    start = t.untyped_storage().data_ptr()
    lo = -(-start // _HUGE_PAGE) * _HUGE_PAGE             # whole huge pages inside the storage only
    hi = (start + nbytes) // _HUGE_PAGE * _HUGE_PAGE
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), ctypes.c_int(_MADV_HUGEPAGE))
    except (OSError, AttributeError):   # no libc symbol: the hint is optional
        pass
    return t


def local_layout(boxes: Sequence[ShardBox], rank: int) -> tuple[list[int], dict[int, tuple[int, int]]]:
    """Where each of ``rank``'s boxes lives: (widths, {box index: (width index, base row)}).

    Boxes of equal column width share one buffer (stacked in box order), so one embedding_bag call
    serves all of them. Any rank can compute any other rank's layout: it depends only on the boxes.
    """
    mine = [(i, b) for i, b in enumerate(boxes) if b.rank == rank]
    widths = sorted({b.col_size for _, b in mine})
    loc, next_row = {}, [0] * len(widths)
    for i, b in mine:
        w = widths.index(b.col_size)
        loc[i] = (w, next_row[w])
        next_row[w] += b.row_size
    return widths, loc


class ShardStore:
    """This rank's shards of a group of tables, with the fused optimizer's state.

    ``full_weights``: ``{table: whole weight}`` to copy each box from, or ``fill(box, out)`` writing a
    box's values into ``out`` (tables built on the meta device: nothing bigger than a box exists).
    ``sync_group`` (data-parallel replicas) sums gradients over ranks before the update;
    ``grad_scale`` multiplies every gradient before the update (1 / world size: gradient division).
    ``full_weights=None`` (with ``dtype``) leaves weights and state uninitialised: a reshard fills
    every element itself, so a fill pass would only cost memory bandwidth.
    """

    def __init__(self, boxes: Sequence[ShardBox], rank: int, full_weights: Optional[dict], device, rule=None,
                 hp: Optional[dict] = None, sync_group=None, compiled: bool = False, dtype=None,
                 grad_scale: float = 1.0):
        self.boxes = list(boxes)
        self.widths, self.loc = local_layout(self.boxes, rank)
        rows = [0] * len(self.widths)
        for i, (w, base) in self.loc.items():
            rows[w] = max(rows[w], base + self.boxes[i].row_size)
        if dtype is None:
            dtype = next(iter(full_weights.values())).dtype
        self.buffers = [advise_huge_pages(torch.empty((r, c), dtype=dtype, device=device))
                        for r, c in zip(rows, self.widths)]
        with torch.no_grad():
            for i, (w, base) in (self.loc.items() if full_weights is not None else ()):
                b = self.boxes[i]
                dst = self.buffers[w][base:base + b.row_size]
                if callable(full_weights):     # materialise this box only (a meta-built collection)
                    full_weights(b, dst)
                else:
                    dst.copy_(full_weights[b.table][b.row_offset:b.row_offset + b.row_size,
                                                    b.col_offset:b.col_offset + b.col_size])
        self.rule, self.hp, self.sync_group = rule, hp or {}, sync_group
        self.grad_scale = float(grad_scale)
        self.no_rule_hook = lambda: None     # the owner's warning when a backward reaches tables without a rule
        # torch.compile fuses the gather/update/scatter passes into one loop (several times faster
        # on CPU) at a one-off compile cost; the kernel is the same math as the eager update.
        self.kernel = torch.compile(rule.kernel, dynamic=True) if (compiled and rule is not None) else None
        self.steps = [0] * len(self.widths)
        self.states = [self._init_state(buf, full_weights is not None) for buf in self.buffers]

    def _init_state(self, buf: torch.Tensor, fill: bool) -> dict:
        if self.rule is None:
            return {}
        fills = self.rule.init_values(self.hp)
        out = {}
        for name, kind in self.rule.state_shapes.items():
            shape = tuple(buf.shape if kind == "elem" else buf.shape[:1])
            out[name] = advise_huge_pages(torch.empty(shape, dtype=STATE_DTYPE, device=buf.device))
            if fill:
                out[name].fill_(float(fills[name]))
        return out

    def box_view(self, i: int, what: Optional[str] = None) -> torch.Tensor:
        """The rows of box ``i`` in the weight buffer (``what=None``) or in an optimizer state buffer."""
        w, base = self.loc[i]
        src = self.buffers[w] if what is None else self.states[w][what]
        return src[base:base + self.boxes[i].row_size]

    @torch.no_grad()
    def apply_gradient(self, w: int, rows: torch.Tensor, grad_rows: torch.Tensor) -> None:
        """Sparse optimizer step on buffer ``w``: ``rows`` unique, ``grad_rows`` their summed gradients."""
        if self.rule is None:
            self.no_rule_hook()
            return
        grad_rows = grad_rows.to(STATE_DTYPE)   # fp16/bf16 tables: the update runs in fp32, like the state
        if self.sync_group is not None:
            rows, grad_rows = self._summed_over_ranks(w, rows, grad_rows)
        self.steps[w] += 1
        self._update(w, rows, grad_rows)

    @torch.no_grad()
    def apply_bag_gradient(self, w: int, ids, offsets, psw, grad: torch.Tensor) -> None:
        """The optimizer step for a pooled lookup of ``ids`` in buffer ``w`` (bags ``offsets``, weights
        ``psw``) whose output gradient is ``grad``: each touched row's summed gradient, then its update.

        On CPU both run over blocks of touched rows: each block's gradient sums and the update's
        temporaries stay in cache, and no per-step temporary is as large as every touched row
        (allocations that size come fresh from the OS each step, one page fault per 4 KiB).
        """
        if self.rule is None:
            self.no_rule_hook()
            return
        occurrence = self.rule.occurrence
        if occurrence is not None and self.sync_group is None and \
                occurrence.applies(self.buffers[w], ids, grad, psw is not None):
            # SGD is linear in the gradient: each occurrence adds into its row, no grouping by row
            self.steps[w] += 1
            occurrence(self.buffers[w], ids, offsets, psw, grad, -self.hp["lr"] * self.grad_scale)
            return
        grouped = group_by_row(ids, offsets, psw, self.buffers[w].shape[0])
        rows = grouped[0]
        if self.sync_group is not None or rows.device.type != "cpu" or rows.numel() <= _BLOCK_ROWS:
            self.apply_gradient(w, rows, summed_rows(grouped, grad))
            return
        self.steps[w] += 1
        grad = grad.contiguous()   # once, not per block
        blocks = -(-rows.numel() // _BLOCK_ROWS)
        size = -(-rows.numel() // blocks)   # even blocks: no tail of a row or two (a recompile of the kernel)
        for a in range(0, rows.numel(), size):
            b = min(a + size, rows.numel())
            self._update(w, rows[a:b], summed_rows(grouped, grad, a, b).to(STATE_DTYPE))

    def _update(self, w: int, rows: torch.Tensor, grad_rows: torch.Tensor) -> None:
        # grad_scale (gradient division: the gradient of the mean of per-rank losses) is applied
        # inside the update's loop, never as a pass of its own over every touched row
        state = self.states[w]
        if self.kernel is not None:
            coeffs = torch.tensor(self.rule.coeffs(self.hp, self.steps[w]) + [self.grad_scale],
                                  dtype=grad_rows.dtype, device=grad_rows.device)
            # the one-loop native kernel where it applies (the same arithmetic), else inductor's
            if not (isinstance(self.rule.update, RowUpdate)
                    and self.rule.update.run_native(self.buffers[w], list(state.values()), rows, grad_rows, coeffs)):
                self.kernel(self.buffers[w], *state.values(), rows, grad_rows, coeffs)
            return
        state["step"] = self.steps[w]
        # Row updates are independent, so on CPU they run in cache-sized row chunks: the
        # element-wise passes then stay in L2 (about 2x faster than whole-batch passes here).
        if isinstance(self.rule.update, RowUpdate) and self.rule.update.compiles(rows, grad_rows, self.buffers[w]):
            # the compiled one-pass kernel cuts its own cache-sized blocks; a call per chunk here would
            # pay its dispatch (guards, wrappers) dozens of times per step
            self.rule.update(self.buffers[w], state, rows, grad_rows, self.hp, scale=self.grad_scale)
            del state["step"]
            return
        width = max(1, grad_rows.shape[1])
        n = max(1, rows.numel()) if rows.device.type != "cpu" else max(1, _CHUNK_ELEMENTS // width)
        for r, g in zip(torch.split(rows, n), torch.split(grad_rows, n)):
            self.rule.update(self.buffers[w], state, r, g if self.grad_scale == 1.0 else g * self.grad_scale,
                             self.hp)
        del state["step"]

    def _summed_over_ranks(self, w: int, rows: torch.Tensor, grad_rows: torch.Tensor):
        # Replicas must apply the same update: all-reduce a dense [rows, dim + 1] buffer whose last
        # column counts touches, so "touched anywhere" is decided from shared data.
        buf = self.buffers[w]
        dense = grad_rows.new_zeros(buf.shape[0], buf.shape[1] + 1)
        dense.index_copy_(0, rows, torch.cat([grad_rows, torch.ones_like(grad_rows[:, :1])], dim=1))
        dist.all_reduce(dense, group=self.sync_group)
        touched = torch.nonzero(dense[:, -1] > 0).flatten()
        return touched, dense.index_select(0, touched)[:, :-1].contiguous()


def group_by_row(ids, offsets, psw, num_rows: int = 2 ** 63 - 1) -> tuple:
    """(unique ids ascending, segment offsets of each id's occurrences, the bag of each occurrence,
    its weight or None), occurrences in bag order within a row (the sort is stable). ``num_rows``
    bounds the ids (the buffer's rows): below 2**31 the sort runs on int32 keys, over twice as fast
    on CPU as int64 ones, and below 2**15 on int16 keys, twice as fast again."""
    native = native_group_by_row() if ids.device.type == "cpu" else None
    grouped = native(ids, offsets) if native is not None else None
    if grouped is not None:   # one numba loop: the same rows, segments and order as the sort below
        rows, seg, bag, order = grouped
        return rows.to(ids.dtype), seg, bag, None if psw is None else psw.index_select(0, order)
    bag = bag_of_occurrences(offsets, ids.numel())
    # the narrowest key type that holds every row: CPU sorts int16 keys about twice as fast as int32
    keys = ids.to(torch.int16) if num_rows <= 2 ** 15 else ids.to(torch.int32) if num_rows <= 2 ** 31 else ids
    sorted_ids, order = torch.sort(keys, stable=True)
    rows, counts = torch.unique_consecutive(sorted_ids, return_counts=True)
    seg = torch.zeros(rows.numel() + 1, dtype=torch.int64, device=ids.device)
    torch.cumsum(counts, 0, out=seg[1:])
    weights = None if psw is None else psw.index_select(0, order)
    return rows.to(ids.dtype), seg, bag.index_select(0, order), weights


def summed_rows(grouped: tuple, grad: torch.Tensor, a: int = 0, b: Optional[int] = None) -> torch.Tensor:
    """The summed gradients of rows ``a:b`` of :func:`group_by_row`'s output: an embedding_bag over
    ``grad`` whose bags are the rows' occurrences (no gradient row materialised per occurrence)."""
    rows, seg, bag, weights = grouped
    b = rows.numel() if b is None else b
    lo, hi = (int(seg[a]), int(seg[b])) if (a, b) != (0, rows.numel()) else (0, bag.numel())
    part = seg[a:b + 1] if lo == 0 else seg[a:b + 1] - lo
    return F.embedding_bag(bag[lo:hi], grad.contiguous(), part, mode="sum",
                           per_sample_weights=None if weights is None else weights[lo:hi], include_last_offset=True)


def summed_row_gradients(ids, offsets, psw, grad, num_rows: int = 2 ** 63 - 1):
    """(unique ids, per-id sum over occurrences of weight x grad of its bag), without materialising
    one gradient row per occurrence. Each row's occurrences are summed in bag order."""
    grouped = group_by_row(ids, offsets, psw, num_rows)
    return grouped[0], summed_rows(grouped, grad)


class FusedLookup(torch.autograd.Function):
    """Pooled lookup in one shard buffer whose backward applies the optimizer to the touched rows.

    Returns no weight gradient: the update happens here, on the local shard, during backward.
    """

    @staticmethod
    def forward(ctx, anchor, store: ShardStore, w: int, ids, offsets, psw):
        ctx.store, ctx.w = store, w
        ctx.save_for_backward(ids, offsets, psw)
        return F.embedding_bag(ids, store.buffers[w], offsets, mode="sum", per_sample_weights=psw,
                               include_last_offset=True)

    @staticmethod
    def backward(ctx, grad):
        ids, offsets, psw = ctx.saved_tensors
        ctx.store.apply_bag_gradient(ctx.w, ids, offsets, psw, grad)
        return None, None, None, None, None, None
