"""ShardedEmbeddingCollection: an EmbeddingCollection's tables split over ranks, built by
:func:`~shardwise.embedding.shard`.

Everything but the output is the bag collection's: the same shard boxes and sharding classes,
routing and input dist, ShardStore (weights, fused optimizer state, row-wise sparse updates),
meta construction, digest / ``src_rank`` checks, state dicts and DCP checkpoints, reshard and load
statistics. Only the stages differ (:mod:`~shardwise.embedding.sharding.sequence`): a plain
embedding lookup per id and a sequence output dist that returns the rows in the input's order.
"""

from __future__ import annotations

from .collection.embedding_collection import EmbeddingCollection, check_sequence_features, sequence_output
from .sharded_collection import ShardedEmbeddingBagCollection
from .sharding.sequence import build_sequence
from .topology import MeshTopology

__all__ = ["ShardedEmbeddingCollection", "EmbeddingCollection"]


class ShardedEmbeddingCollection(ShardedEmbeddingBagCollection):
    """An EmbeddingCollection whose tables are split over ranks (table-, row-, column-wise,
    table-row-wise or data-parallel); built by :func:`~shardwise.embedding.shard`.

    ``forward(kjt)`` takes this rank's local batch and returns what the unsharded module returns
    for it: ``{feature: JaggedTensor}`` with one row per id, in the input's order, and the input's
    lengths. ``backward`` on a loss of those rows updates the local shards with the fused optimizer
    (rows of repeated ids summed; divided by the world size with gradient division, the default).
    State-dict keys are ``embeddings.<table>.weight``.

    Example:
        >>> import functools, torch; from shardwise.embedding import EmbeddingConfig, row_wise, shard
        >>> from shardwise.sparse import KeyedJaggedTensor
        >>> ec = EmbeddingCollection([EmbeddingConfig(10, 4, "items", feature_names=["item_seq"])])
        >>> sharded = shard(ec, {"items": row_wise()}, optimizer=functools.partial(torch.optim.SGD, lr=0.1))
        >>> out = sharded(KeyedJaggedTensor(["item_seq"], torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 1])))
        >>> out["item_seq"].values().shape                 # one row per id
        torch.Size([3, 4])
        >>> out["item_seq"].values().pow(2).sum().backward()
    """

    _prefix = "embeddings"
    _takes_variable_batch = False
    _local_shortcut = False   # one row per id in the input's order: the sequence output dist

    def __init__(self, ec: EmbeddingCollection, plan: dict, topo: MeshTopology, optimizer=None,
                 compile_optimizer: bool = False, gradient_division: bool = True, load_sample_every: int = 4):
        super().__init__(ec, plan, topo, optimizer, compile_optimizer, gradient_division, load_sample_every)
        self._need_indices = ec.need_indices()  # each output's weights are its feature's ids

    def _make_stages(self, sharder, routing, store):
        return build_sequence(sharder, routing, self._topo, store, self._anchor, self._dtype)

    def _check_features(self, kjt) -> None:
        check_sequence_features(kjt, self._features)

    def embedding_dim(self) -> int:
        return self._tables[0].embedding_dim

    def embedding_configs(self) -> list:
        return list(self._tables)

    def feature_names(self) -> list[str]:
        return list(self._features)

    def need_indices(self) -> bool:
        return self._need_indices

    def _lookup_pending(self, pending) -> dict:
        """One row per id, back on the rank that owns the sample, in the input's order."""
        kjt = pending.kjt
        keys, per_key = kjt.keys(), kjt.length_per_key()
        rows = {}
        for i, g in enumerate(self._groups):
            routed = pending.routed(i)
            looked = g.stages.lookup(routed)
            counts = [per_key[keys.index(f)] if f in keys else 0 for f, _ in g.routing.features]
            out = g.stages.output_dist(looked, routed, sum(counts), self._dtype)
            for (f, _), part in zip(g.routing.features, out.split(counts)):
                rows[f] = part
        return sequence_output(self._features, kjt, rows, self.embedding_dim(), self._dtype, self._topo.device,
                               self._need_indices)
