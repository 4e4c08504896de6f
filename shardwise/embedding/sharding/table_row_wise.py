"""Table-row-wise: row blocks over the ranks of one host (a row of a 2-D mesh), so the partial
sums stay inside the host's fast links; routing and output as for row-wise."""

from __future__ import annotations

from ..stages import AllToAllOutputDist, GroupedLookup, InputDist
from .base import Sharder, Stages, row_blocks


def layout(table, ps, topo):
    if ps.host_index >= len(topo.hosts):
        raise ValueError(f"table {table.name!r}: table_row_wise host_index={ps.host_index} but the mesh has "
                         f"{len(topo.hosts)} host(s); use a 2-D mesh (hosts x ranks per host) or a smaller index")
    return row_blocks(table, topo.hosts[ps.host_index])


def build(routing, topo, store, anchor, weighted, dtype) -> Stages:
    return Stages(InputDist(routing, topo, weighted), GroupedLookup(store, anchor),
                  AllToAllOutputDist(routing, topo, anchor, dtype))


SHARDER = Sharder(layout, build)
