"""Measured lookup load: how many ids each shard of each table served, summed over ranks.

A row-wise table's hot rows sit in one row block, so the planner's uniform-id estimate can be far
from what ranks actually do; this meter counts it from the batches themselves.

Example:
    >>> meter = LoadMeter(sharded.boxes(), plan, rank, world, device)     # doctest: +SKIP
    >>> meter.observe(kjt); meter.per_rank()                               # doctest: +SKIP
    [123456.0, 65432.0]
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..embedding import ShardBox, ShardingType

__all__ = ["LoadMeter"]


class LoadMeter:
    """Per shard box: ids routed to it since the last :meth:`reset`. Counting is local; ``totals``
    all-reduces, so every rank calls it at the same step."""

    def __init__(self, boxes: list[ShardBox], plan: dict, rank: int, world: int, device):
        self.boxes, self.rank, self.world, self.device = list(boxes), rank, world, device
        self._dp = {t for t, ps in plan.items() if ps.sharding_type == ShardingType.DATA_PARALLEL}
        self._by_table: dict[str, list[int]] = {}
        for i, b in enumerate(self.boxes):
            self._by_table.setdefault(b.table, []).append(i)
        self.reset()

    def reset(self) -> None:
        # counts stay on the device: no host sync per step
        self._counts = torch.zeros(len(self.boxes), dtype=torch.float64, device=self.device)
        self._carried = torch.zeros(len(self.boxes), dtype=torch.float64)
        self.steps = 0

    def snapshot(self) -> dict:
        """Collective: the all-rank sums so far, for a checkpoint (see :meth:`restore`)."""
        return {"sum": self._summed().tolist(), "steps": self.steps}

    def restore(self, snap: dict) -> None:
        """Continue counting from a snapshot taken with the same boxes (same plan and world size)."""
        if len(snap["sum"]) != len(self.boxes):
            raise ValueError(f"load snapshot has {len(snap['sum'])} shard counts, this plan {len(self.boxes)}; "
                             f"restore only onto the plan it was taken from")
        self.reset()
        self._carried = torch.tensor(snap["sum"], dtype=torch.float64)
        self.steps = int(snap["steps"])

    def _summed(self) -> torch.Tensor:
        t = self._counts.clone()
        if dist.is_initialized():
            dist.all_reduce(t)
        return t.cpu() + self._carried

    def observe(self, kjt, table_of: dict) -> None:
        """Count this rank's ids of ``kjt`` (feature -> table via ``table_of``)."""
        self.steps += 1
        for feature, jt in kjt.to_dict().items():
            table = table_of[feature]
            ids = jt.values().to(self.device)
            for i in self._by_table[table]:
                b = self.boxes[i]
                if table in self._dp:
                    # replicated tables are looked up where the batch lives
                    if b.rank == self.rank:
                        self._counts[i] += ids.numel()
                    continue
                if b.row_size == 0:
                    continue
                hit = (ids >= b.row_offset) & (ids < b.row_offset + b.row_size)
                self._counts[i] += hit.sum()

    def totals(self) -> list[float]:
        """Collective: ids per box, summed over ranks, per step observed."""
        return (self._summed() / max(self.steps, 1)).tolist()

    def per_rank(self, totals: list[float]) -> list[float]:
        """Lookup work per rank per step: ids x columns of every box it holds."""
        out = [0.0] * self.world
        for b, n in zip(self.boxes, totals):
            out[b.rank] += n * b.col_size
        return out

    def per_table(self, totals: list[float]) -> dict:
        """``{table: [(rank, ids per step, ids x dim per step), ...]}`` (the stats a rebalancer needs)."""
        out: dict = {}
        for b, n in zip(self.boxes, totals):
            out.setdefault(b.table, []).append((b.rank, n, n * b.col_size))
        return out
