"""Table-row-wise: row blocks over the ranks of one host (a row of a 2-D mesh). Partial sums are
first reduced inside the host (fast links), then sent across hosts: the two-level output dist."""

from __future__ import annotations

from typing import Optional

import torch

from ..comm import AllToAll
from ...plan.values import table_row_wise
from ..stages import AllToAllOutputDist, Routed, _blocks, _send_buffer
from .base import ShardingKind, row_blocks, routed_build


def layout(table, ps, topo):
    if ps.host_index >= len(topo.hosts):
        raise ValueError(f"table {table.name!r}: table_row_wise host_index={ps.host_index} but the mesh has "
                         f"{len(topo.hosts)} host(s); use a 2-D mesh (hosts x ranks per host) or a smaller index")
    return row_blocks(table, topo.hosts[ps.host_index])


class TwoLevelOutputDist(AllToAllOutputDist):
    """Level 1, inside a host: local rank j sends the partials of the samples owned by ranks with
    local index k (on any host) to local rank k, which adds the host's partials up. Level 2, across
    hosts: each sum goes to its sample owner among the ranks sharing the local index.

    Needs every rank of a host to hold a block of every table placed there (no empty blocks) and a
    2-D mesh; otherwise it is the one-level all-to-all (same numbers).
    """

    def __init__(self, routing, topo, anchor, dtype):
        super().__init__(routing, topo, anchor, dtype)
        hosts = topo.hosts
        self.local = {r: (h, j) for h, ranks in enumerate(hosts) for j, r in enumerate(ranks)}
        patterns = [[self._pattern(r) for r in ranks] for ranks in hosts]
        uniform = all(all(p == ps[0] for p in ps) for ps in patterns)
        self.enabled = topo.host_group is not None and uniform and len({len(r) for r in hosts}) == 1
        self.host_slots = [routing.output_slots([ranks[0]]) for ranks in hosts]

    def _pattern(self, rank):
        return [(self.routing.boxes[i].table, fi, self.routing.boxes[i].col_size)
                for i, fi, _, _ in self.routing.slots[rank]]

    def _width(self, rank) -> int:
        return sum(self.routing.boxes[i].col_size for i, _, _, _ in self.routing.slots[rank])

    def __call__(self, pooled, routed: Routed, batch: int, batch_sizes: Optional[list] = None):
        if not self.enabled:
            return super().__call__(pooled, routed, batch, batch_sizes)
        topo = self.topo
        host, me_local = self.local[topo.rank]
        per_host, n_hosts = len(topo.hosts[0]), len(topo.hosts)
        send, sizes = _send_buffer(pooled, routed, topo.world_size, self.dtype, topo.device)
        chunks = torch.split(send, sizes)
        # owners of local index k, host by host: that is also the order sums leave in at level 2
        owners = [[topo.hosts[h][k] for h in range(n_hosts)] for k in range(per_host)]
        level1 = torch.cat([chunks[s] for k in range(per_host) for s in owners[k]])
        out1 = [sum(sizes[s] for s in owners[k]) for k in range(per_host)]
        mine = [batch_sizes[s] * self._width(topo.rank) for s in owners[me_local]]
        recv1 = AllToAll.apply(self.anchor, level1, out1, [sum(mine)] * per_host, topo.host_group, self.codecs)
        summed = recv1.view(per_host, -1).sum(0)
        out2 = [batch * self._width(topo.hosts[h][0]) for h in range(n_hosts)]
        recv2 = AllToAll.apply(self.anchor, summed, mine, out2, topo.peer_group, self.codecs)
        blocks = []
        for h, part in enumerate(torch.split(recv2, out2)):
            blocks += _blocks(part, self.host_slots[h], batch)
        return blocks


def sharding_of(boxes, topo):
    return table_row_wise(list(topo.hosts).index(tuple(b.rank for b in boxes)))


SHARDER = ShardingKind(layout, routed_build(TwoLevelOutputDist), sharding_of)
