"""The planner's cost model: estimated seconds per training step on each rank, from a Calibration.

A rank's step = the work of its shards (lookup compute for the ids routed to them; the bytes of
their ids, lengths and pooled blocks in the all-to-alls, forward and backward; a data-parallel
table's gradient all-reduce) plus fixed costs that a plan pays once per *sharding type group* and
not per table: each non-data-parallel type present runs its own all-to-alls (lengths, ids, pooled
blocks forward and backward; table-row-wise sends its pooled blocks in two levels, inside the host
and then between hosts), whose messages every rank waits for, and its own routing and assembly;
each local buffer (type x column width) is one lookup call; each data-parallel width is one
all-reduce. The fixed costs are what make one more sharding type cost something, so a
tiny table goes data-parallel only where that beats adding its ids to a group that runs anyway.

Example:
    >>> from shardwise.embedding.plan.calibration import Calibration
    >>> from shardwise.embedding.plan.values import LayoutTopology
    >>> from shardwise.embedding import EmbeddingBagConfig
    >>> model = CostModel(Calibration.nominal(), LayoutTopology.flat(2), 256, lambda t: 1.0, lambda t: 4)
    >>> t = EmbeddingBagConfig(1000, 16, "t", feature_names=["f"])
    >>> whole, half = ShardBox("t", 0, 0, 1000, 0, 16), ShardBox("t", 0, 0, 500, 0, 16)
    >>> model.shard(t, ShardingType.ROW_WISE, half) < model.shard(t, ShardingType.TABLE_WISE, whole)
    True
"""

from __future__ import annotations

from ..collection.config import EmbeddingConfig
from .values import LayoutTopology, ShardBox, ShardingType

__all__ = ["CostModel", "FixedCosts"]

_ID_BYTES = 8             # ids and lengths travel as int64
_GRAD_BYTES = 4           # a data-parallel table's gradient buffer is fp32 (the optimizer state dtype)
# A group's input routing (cut ids into units, sort, count) and output assembly (split, add, cat) are
# each a handful of small kernels, forward and backward, like one small lookup call: counted as 4 calls.
_STAGE_CALLS = 4
_A2A_INPUT = 2            # all-to-alls per step of a group's input: lengths, ids (then pooled forward, backward)


class CostModel:
    """Seconds per step. ``ids_per_bag(table)``: ids per bag of each of its features; ``elem_bytes(table)``:
    bytes of one of its weight elements (what its lookups read and its pooled outputs carry)."""

    def __init__(self, cal, topo: LayoutTopology, batch: int, ids_per_bag, elem_bytes):
        self.cal, self.topo, self.batch, self.ids_per_bag, self.elem = cal, topo, batch, ids_per_bag, elem_bytes
        w = topo.world_size
        per_host = len(topo.hosts[0])
        # share of a rank's peers on its own host: the rest cost cross_host_factor times more per byte
        near = (per_host - 1) / (w - 1) if w > 1 else 1.0
        self.flat_factor = near + (1.0 - near) * cal.cross_host_factor
        self.off_rank = (w - 1) / w          # the rest of an all-to-all stays on the rank

    def shard(self, t, sharding_type: ShardingType, box: ShardBox) -> float:
        """Variable seconds of one shard on its rank."""
        c, w, elem = self.cal, self.topo.world_size, self.elem(t)
        feats = len(t.feature_names)
        per_id = c.lookup_s_per_id + c.lookup_s_per_byte * box.col_size * elem
        if sharding_type == ShardingType.DATA_PARALLEL:
            # local lookups plus the ring all-reduce of a dense [rows, dim + 1] gradient
            ring = 2 * (w - 1) / w * box.row_size * (box.col_size + 1) * _GRAD_BYTES
            return self.batch * feats * self.ids_per_bag(t) * per_id + ring * c.all_reduce_s_per_byte * self.flat_factor
        bags = self.batch * w * feats
        ids = bags * self.ids_per_bag(t) * (box.row_size / t.num_embeddings)
        inputs = (ids + bags) * _ID_BYTES * self.off_rank
        pooled = 2 * bags * box.col_size * elem * self.off_rank      # blocks forward, their gradients back
        if isinstance(t, EmbeddingConfig):   # unpooled (EmbeddingCollection): one row back per routed id, not per bag
            pooled = 2 * ids * box.col_size * elem * self.off_rank
        byte = c.all_to_all_s_per_byte
        if sharding_type == ShardingType.TABLE_ROW_WISE:
            # partial sums meet inside the host, then one sum per sample crosses hosts, shared by
            # the host's shards
            per_host = len(self.topo.hosts[0])
            comm = inputs * byte * self.flat_factor + pooled * byte + pooled / per_host * byte * c.cross_host_factor
        else:
            comm = (inputs + pooled) * byte * self.flat_factor
        return ids * per_id + comm

    def group_seconds(self, sharding_type: ShardingType) -> float:
        """Fixed seconds on every rank once a sharding type group exists (its collectives' messages)."""
        w, msg = self.topo.world_size, self.cal.all_to_all_s_per_message
        # a group's own routing and assembly on every rank, priced as small lookup calls
        stages = _STAGE_CALLS * self.cal.lookup_s_per_call
        if sharding_type == ShardingType.DATA_PARALLEL:
            return stages              # its all-reduces are per width: width_seconds
        if sharding_type == ShardingType.TABLE_ROW_WISE:
            # lengths and ids over all ranks; the pooled blocks forward and backward in two levels:
            # inside the host, then among the ranks of the same local index
            per_host = len(self.topo.hosts[0])
            hosts = w // per_host
            return stages + (_A2A_INPUT * (w - 1) + 2 * (per_host - 1 + hosts - 1)) * msg
        return stages + (_A2A_INPUT + 2) * (w - 1) * msg

    def width_seconds(self, sharding_type: ShardingType) -> float:
        """Fixed seconds on every rank per data-parallel column width (one all-reduce each)."""
        if sharding_type != ShardingType.DATA_PARALLEL:
            return 0.0
        return 2 * (self.topo.world_size - 1) * self.cal.all_reduce_s_per_message


class FixedCosts:
    """Which groups, widths and local buffers a (partial) plan has; prices what a placement adds."""

    def __init__(self, model: CostModel):
        self.model, self.types, self.widths, self.buffers = model, set(), set(), set()

    def delta(self, sharding_type: ShardingType, boxes) -> tuple[float, dict]:
        """(seconds added to every rank, {rank: seconds added to it}) by placing ``boxes``."""
        everyone = 0.0 if sharding_type in self.types else self.model.group_seconds(sharding_type)
        new_widths = {b.col_size for b in boxes} - {w for t, w in self.widths if t == sharding_type}
        everyone += len(new_widths) * self.model.width_seconds(sharding_type)
        per_rank: dict = {}
        for b in boxes:
            if b.row_size and (sharding_type, b.col_size, b.rank) not in self.buffers:
                per_rank[b.rank] = per_rank.get(b.rank, 0.0) + self.model.cal.lookup_s_per_call
        return everyone, per_rank

    def add(self, sharding_type: ShardingType, boxes) -> None:
        self.types.add(sharding_type)
        for b in boxes:
            self.widths.add((sharding_type, b.col_size))
            if b.row_size:
                self.buffers.add((sharding_type, b.col_size, b.rank))
