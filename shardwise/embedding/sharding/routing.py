"""Static routing derived from shard boxes: which ids go to which rank, and where results land.

Everything here is a pure function of the boxes, the table configs and the output column layout,
so every rank builds identical routing (and a reshard only has to rebuild it from new boxes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..collection.config import EmbeddingBagConfig
from ..plan.values import ShardBox  # noqa: F401  (GroupSpec.boxes holds them)
from .store import local_layout

__all__ = ["GroupSpec", "Routing"]


@dataclass
class GroupSpec:
    """The tables of one sharding type and their boxes (``boxes`` include empty ones)."""

    tables: list            # EmbeddingBagConfig, config order
    boxes: list             # ShardBox, config table order then shard order
    feature_cols: dict      # feature -> first column in the collection's output
    total_dim: int          # width of the collection's output


class Routing:
    """Units, slots and output placement for one group.

    A *unit* is (feature, row range of its table): the ids of that feature that fall into one row
    block. A *slot* is (box, feature): a unit delivered to the rank holding ``box``, so column-wise
    boxes receive the same unit several times. Slots to a rank are ordered by (width buffer on that
    rank, box, feature), which makes each width's bags contiguous per source.
    """

    def __init__(self, spec: GroupSpec, world: int, local_only_rank: int | None = None):
        self.spec = spec
        self.boxes = [b for b in spec.boxes if b.row_size > 0 and b.col_size > 0]
        tables = {t.name: t for t in spec.tables}
        self.features: list[tuple[str, EmbeddingBagConfig]] = [(f, t) for t in spec.tables for f in t.feature_names]
        ranges = {name: sorted({(b.row_offset, b.row_size) for b in self.boxes if b.table == name})
                  for name in tables}
        self.unit_base, starts, unit_start = [], [], []
        for _, t in self.features:
            self.unit_base.append(len(unit_start))
            unit_start.extend(r[0] for r in ranges[t.name])
            starts.append([r[0] for r in ranges[t.name]])
        self.num_units = len(unit_start)
        self.range_starts = starts
        self.single_range = all(len(s) <= 1 for s in starts)
        self.unit_start = unit_start
        dests = range(world) if local_only_rank is None else [local_only_rank]
        self.slots = {d: [] for d in range(world)}
        self.width_ranges = {d: [] for d in range(world)}
        for d in dests:
            self._build_slots(d, ranges)

    def _build_slots(self, d: int, ranges: dict) -> None:
        widths, loc = local_layout(self.boxes, d)
        order = sorted(loc, key=lambda i: (loc[i][0], i))
        slots = []
        for i in order:
            b = self.boxes[i]
            rng = ranges[b.table].index((b.row_offset, b.row_size))
            for fi, (_, t) in enumerate(self.features):
                if t.name == b.table:
                    slots.append((i, fi, self.unit_base[fi] + rng, loc[i][1]))
        self.slots[d] = slots
        for w in range(len(widths)):
            members = [k for k, s in enumerate(slots) if loc[s[0]][0] == w]
            self.width_ranges[d].append((widths[w], members[0], members[-1] + 1))

    def slot_tensors(self, device) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """(unit of each slot, id shift of each slot, slots per destination), destinations in order."""
        units, shifts, counts = [], [], []
        for d in sorted(self.slots):
            counts.append(len(self.slots[d]))
            for _, _, u, base in self.slots[d]:
                units.append(u)
                shifts.append(base)
        return (torch.tensor(units, dtype=torch.int64, device=device),
                torch.tensor(shifts, dtype=torch.int64, device=device), counts)

    def output_slots(self, dests: Sequence[int]) -> list[tuple[str, int, int]]:
        """(feature, first column within the feature, columns) of each pooled block received from
        ``dests``, in the order they arrive (destination, then that destination's slot order)."""
        out = []
        for d in dests:
            for i, fi, _, _ in self.slots[d]:
                b = self.boxes[i]
                out.append((self.features[fi][0], b.col_offset, b.col_size))
        return out

    def uniform(self) -> bool:
        """True when every rank receives the same (table, feature, columns) slot pattern, so pooled
        partials line up elementwise across ranks and can be summed by a reduce-scatter."""
        def pattern(d):
            return [(self.boxes[i].table, fi, self.boxes[i].col_offset, self.boxes[i].col_size)
                    for i, fi, _, _ in self.slots[d]]
        first = pattern(0)
        return bool(first) and all(pattern(d) == first for d in self.slots)
