"""The forward of a sharded bag collection whose every shard is local and whole: no routing, no exchange.

In a process group of one rank every table sits on rank 0, and unless a plan cuts it into several boxes
there (``column_wise([0, 0])``) each table is one box of all its rows and columns. Such a batch needs
no routing, no id all-to-all and no output dist: each group's
:class:`~shardwise.embedding.sharding.store.ShardStore` is looked up as stacked tables
(:class:`~shardwise.embedding.collection.stacked.StackedTables`, how ``FusedEmbeddingBagCollection``
runs): one ``embedding_bag`` per width buffer over the batch's key-major ids as they come, and the
fused update of the same store in its backward. The ids reach ``embedding_bag`` and the update in the
order the general path's routing gives them (slots by width, table, feature; samples in order), so
outputs and updated weights are the general path's bit for bit. Bad batches raise the general path's
error (the id range check runs inside the lookup, before any lookup; its message comes from the full
batch check). Quantized comms (``use_qcomm``) keep the general path: their rounding is part of the
results.

Example (what a sharded collection in a group of one rank runs):
    >>> from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig, shard, table_wise
    >>> from shardwise.sparse import KeyedJaggedTensor
    >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig(10, 4, f"t{i}", feature_names=[f"f{i}"]) for i in range(2)])
    >>> sharded = shard(ebc, {"t0": table_wise(0), "t1": table_wise(0)})
    >>> local = LocalLookup.build(sharded._groups, sharded._topo, sharded._features)
    >>> kjt = KeyedJaggedTensor(["f0", "f1"], torch.tensor([1, 2, 9]), lengths=torch.tensor([1, 1, 1, 0]))
    >>> torch.equal(local(kjt, sharded._anchor, False), ebc(kjt).values())
    True
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ...sparse import KeyedTensor
from ..collection.stacked import StackedTables
from .exchange import PendingInput

__all__ = ["LocalLookup", "local_lookup", "start_local", "finish_local"]


def _whole_here(group, rank: int) -> bool:
    """Every table of ``group`` is one box of all its rows and columns on ``rank``."""
    boxes = {b.table: b for b in group.routing.boxes}
    if len(boxes) != len(group.routing.boxes) or len(boxes) != len(group.spec.tables):
        return False
    for t in group.spec.tables:
        b = boxes.get(t.name)
        if b is None or b.rank != rank or (b.row_offset, b.row_size, b.col_offset, b.col_size) != \
                (0, t.num_embeddings, 0, t.embedding_dim):
            return False
    return True


class LocalLookup:
    """Every group's store looked up as stacked tables (see the module docstring); :meth:`build`
    says whether the groups allow it."""

    def __init__(self, groups: list, features: list):
        self.stacks = [StackedTables.over_store(g.spec.tables, g.store) for g in groups]
        self.features = list(features)

    @classmethod
    def build(cls, groups: list, topo, features: list) -> Optional["LocalLookup"]:
        """The local lookup of ``groups`` when the process group has one rank and every table is whole
        on it (a fact of the boxes, the same on every rank), else None."""
        if topo.world_size != 1 or not groups or not all(_whole_here(g, topo.rank) for g in groups):
            return None
        return cls(groups, features)

    def __call__(self, kjt, anchor: torch.Tensor, weighted: bool, per_feature: bool = False,
                 on_bad_id: Optional[Callable] = None):
        """Pooled bags of a checked ``kjt``: ``[B, sum of dims]`` in the collection's feature order, or
        ``{feature: [B, dim]}`` with ``per_feature``; ``on_bad_id()`` raises for an id outside its table."""
        if len(self.stacks) == 1:
            return self.stacks[0].lookup(kjt, anchor, weighted, per_feature, on_bad_id)
        found: dict = {}
        for stack in self.stacks:   # every stack checks its ids before its own lookups
            found.update(stack.lookup(kjt, anchor, weighted, True, on_bad_id))
        out = {f: found[f] for f in self.features}
        return out if per_feature else torch.cat(list(out.values()), dim=1)


def start_local(module, kjt, problem: Optional[str], local: LocalLookup) -> PendingInput:
    """``module.start_input_dist`` for a :class:`LocalLookup`: nothing to route or exchange, and with
    one rank the batch sizes and bad-batch flags every rank agrees on are this rank's own."""
    topo = module._topo
    local_kjt = kjt.to(topo.device) if problem is None and kjt.values().device != topo.device else kjt
    flag = int(problem is not None)
    batch = kjt.stride() if problem is None else 0
    n = len(module._groups)
    pending = PendingInput(module, kjt, local_kjt, problem, [None] * n, [None] * n, agreed=[(batch, flag)])
    pending.local_lookup = local
    return pending


def local_lookup(module) -> Optional[LocalLookup]:
    """``module``'s (a sharded bag collection's) :class:`LocalLookup`, built again once a reshard
    replaced its groups; None where it has none, where its class keeps the general path
    (``_local_shortcut``) or where quantized comms are on (their rounding is part of the results)."""
    if not module._local_shortcut or module._qcomm_codecs is not None:
        return None
    if module._local_of is not module._groups:
        module._local = LocalLookup.build(module._groups, module._topo, module._features)
        module._local_of = module._groups
    return module._local


def finish_local(module, pending: PendingInput) -> KeyedTensor:
    """``module.forward_from`` for a batch from :func:`start_local`: its pooled bags as a KeyedTensor."""
    kjt, vbe = pending.kjt, pending.vbe

    def bad_id():   # the general path's error, from the full check of the batch
        module._raise_everywhere(module._check_batch(kjt) or "ValueError: an id is outside its table's rows",
                                 [module._topo.rank])

    out = pending.local_lookup(kjt, module._anchor, module._is_weighted, vbe is not None, bad_id)
    if vbe is not None:   # a VBE batch: each sample's rows from its feature's deduplicated bag
        out = torch.cat([vbe.expand(f, out[f]) for f in module._features], dim=1)
    if torch.is_grad_enabled() and not out.requires_grad:
        # no lookup ran (no ids): zeros that still reach the anchor, as the general path's output
        # does through its collectives, so a backward of a loss of them runs as it does there
        out = out + module._anchor.sum()
    return KeyedTensor(module._features, module._dims, out)
