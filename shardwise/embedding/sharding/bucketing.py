"""Row-block bucketing by a one-byte key: a stable sort by *run* instead of by (unit, sample).

The input dist orders a rank's ids by (slot, sample, position in the bag) -- for row-wise, the
bags of each row block, grouped by destination rank. The general path gets there with a stable
sort of int32 (unit, sample) keys. When every unit (feature x row block) goes to exactly one slot
(row-wise, table-row-wise; not column-wise, whose units go to every column shard), the slot
sequence splits into *runs*: consecutive slots with strictly ascending features. The input is
feature-major, so a run's ids in input order already are its slots' ids in send order, and a
stable sort of one byte per id (the id's run) puts every id in its place; one-byte keys sort
several times faster on CPU than the int32 ones. A run's bag lengths come from a running count of
its ids read at the bag offsets. Row-wise over equal tables is one run per rank, and an id's run
is a comparison with the row-block starts. Ids are rebased to their shard's buffer rows in the
same pass: the same ids in the same order as the sort path.

Example (what InputDist.route runs for a row-wise group)::

    b = RowBucketing.build(routing, slot_unit, slot_shift, device)   # None: the sort path
    send_ids, send_lengths, send_w, slot_len, sent = b(values, lengths, weights, counts, batch, keep)
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["RowBucketing"]

_MAX_RUNS = 256   # runs numbered in one byte
_SLOT_LOOP = 64   # up to this many slots a loop of in-place adds beats building a shift per id


class RowBucketing:
    """Per-routing constants of the sort-free bucketing; :meth:`build` says whether it applies."""

    def __init__(self, routing, slot_unit: list, slot_shift: list, device):
        self.routing, self.device = routing, device
        self.nf = len(routing.features)
        feature_of = [f for f, starts in enumerate(routing.range_starts) for _ in starts]
        runs: list[list[int]] = []      # features of each run's slots
        unit_run = [0] * routing.num_units
        for u in slot_unit:
            f = feature_of[u]
            if not runs or runs[-1][-1] >= f:
                runs.append([])
            runs[-1].append(f)
            unit_run[u] = len(runs) - 1
        self.num_runs = len(runs)
        # row of each slot in the [run x feature] table of per-bag counts, and its id shift
        self.slot_rows = torch.tensor([r * self.nf + f for r, fs in enumerate(runs) for f in fs],
                                      dtype=torch.int64, device=device)
        self.shifts = [s - routing.unit_start[u] for u, s in zip(slot_unit, slot_shift)]
        self.slot_shift = torch.tensor(self.shifts, dtype=torch.int64, device=device)
        # each feature's block -> run map; one shared by every feature when their row blocks and runs agree
        self.starts = routing.range_starts
        self.block_run = [[unit_run[routing.unit_base[f] + b] for b in range(len(s))] for f, s in enumerate(self.starts)]
        self.one_map = all(s == self.starts[0] for s in self.starts) and \
            all(r == self.block_run[0] for r in self.block_run)
        self.luts = [None if r == list(range(len(r))) else torch.tensor(r, dtype=torch.uint8, device=device)
                     for r in self.block_run]

    @classmethod
    def build(cls, routing, slot_unit: list, slot_shift: list, device) -> Optional["RowBucketing"]:
        """The bucketing for ``routing``, or None where the sort path must run (single row ranges,
        a unit sent to several slots, or more runs than one byte numbers)."""
        if routing.single_range or sorted(slot_unit) != list(range(routing.num_units)):
            return None
        b = cls(routing, slot_unit, slot_shift, device)
        return b if b.num_runs <= _MAX_RUNS else None

    def _runs_of(self, seg: torch.Tensor, f: int) -> torch.Tensor:
        """The run of each id of feature ``f`` (uint8): its row block by comparisons, mapped to a run."""
        starts = self.starts[f]
        block = torch.zeros(seg.shape, dtype=torch.uint8, device=seg.device) if len(starts) < 2 \
            else torch.ge(seg, starts[1]).view(torch.uint8)
        for s in starts[2:]:   # ids are in range (batch check), so block b starts where row s does
            block = block + torch.ge(seg, s).view(torch.uint8)
        lut = self.luts[f]
        return block if lut is None else lut.index_select(0, block.long())

    def _keys(self, values: torch.Tensor, counts: list) -> torch.Tensor:
        if self.one_map:   # every feature alike: one comparison pass over all ids
            return self._runs_of(values, 0)
        key = torch.empty(values.shape, dtype=torch.uint8, device=values.device)
        start = 0
        for f, n in enumerate(counts):
            if n:
                key[start:start + n] = self._runs_of(values[start:start + n], f)
            start += n
        return key

    def __call__(self, values, lengths, weights, counts: list, batch: int, keep_positions: bool):
        """(send ids, send lengths, send weights, ids per slot, sent positions or None)."""
        n, dev = values.numel(), values.device
        key = self._keys(values, counts)
        order = torch.sort(key, stable=True).indices
        offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=dev)
        torch.cumsum(lengths, 0, out=offsets[1:])
        # per-bag id counts of each run: a running count of the run's ids at the bag offsets (the
        # last run's are what the others leave)
        running = torch.zeros(n + 1, dtype=torch.int64, device=dev)
        per_run, left = [], lengths.to(torch.int64)
        for r in range(self.num_runs - 1):
            torch.cumsum(key == r, 0, out=running[1:])
            at = running.index_select(0, offsets)
            per_run.append(at[1:] - at[:-1])
            left = left - per_run[-1]
        per_run.append(left)
        cells = torch.cat(per_run) if len(per_run) > 1 else per_run[0]
        send_lengths = cells.view(self.num_runs * self.nf, batch).index_select(0, self.slot_rows)
        slot_len = send_lengths.sum(1)
        send_ids = values.index_select(0, order)
        if len(self.shifts) <= _SLOT_LOOP:   # each slot's ids are contiguous: one in-place add per slot
            at = 0
            for shift, k in zip(self.shifts, slot_len.tolist()):
                send_ids[at:at + k].add_(shift)
                at += k
        else:
            send_ids.add_(torch.repeat_interleave(self.slot_shift, slot_len, output_size=n))
        send_w = None if weights is None else weights.index_select(0, order)
        return send_ids, send_lengths.flatten(), send_w, slot_len, (order if keep_positions else None)
