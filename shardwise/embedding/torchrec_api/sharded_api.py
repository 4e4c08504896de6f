"""TorchRec-shaped methods of the sharded collections: the staged forward as awaitables, the stage
lists TorchRec's tutorial prints, ``embedding_bag_configs()``, quantized comms, and a clear refusal of TorchScript.

TorchRec's ``ShardedEmbeddingBagCollection`` runs a forward in stages: ``input_dist(ctx, features)``
gives an ``Awaitable`` whose ``wait()`` gives another (the ids' all-to-all in flight) whose ``wait()``
gives the routed batch; ``compute_and_output_dist(ctx, batch)`` looks it up and returns a
``LazyAwaitable`` of the ``KeyedTensor``. Here the same calls sit on
:meth:`~shardwise.embedding.ShardedEmbeddingBagCollection.start_input_dist` and ``forward_from``.
Unlike TorchRec, ``forward`` itself returns the ``KeyedTensor`` (ready; its ``wait()`` returns it).

Example:
    >>> import torch; from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig, row_wise, shard
    >>> from shardwise.sparse import KeyedJaggedTensor
    >>> sharded = shard(EmbeddingBagCollection([EmbeddingBagConfig(10, 4, "t", feature_names=["f"])]), {"t": row_wise()})
    >>> kjt = KeyedJaggedTensor(["f"], torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 1]))
    >>> ctx = sharded.create_context()
    >>> dist_input = sharded.input_dist(ctx, kjt).wait().wait()
    >>> out = sharded.compute_and_output_dist(ctx, dist_input)      # a LazyAwaitable
    >>> torch.equal(out.wait().values(), sharded(kjt).wait().values())
    True
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Optional

from ..awaitable import Awaitable, LazyNoWait
from ..collection.config import EmbeddingBagConfig
from ..qcomm import check_registry, codecs_digest
from ..sharding.comm import all_gather_ints

__all__ = ["TorchRecShardedAPI", "ShardedModuleContext", "use_qcomm"]


@dataclass
class ShardedModuleContext:
    """What TorchRec's ``create_context()`` returns: per-forward state shared by the stages (here
    the batch in flight, for inspection)."""

    pending: Optional[object] = None
    extra: dict = field(default_factory=dict)


class _IdsArrived(Awaitable):
    """Inner awaitable of ``input_dist``: its ``wait()`` waits for the ids' all-to-all."""

    def __init__(self, pending):
        super().__init__()
        self._pending = pending

    def _wait_impl(self):
        for ex in self._pending.exchanges:
            if ex is not None:
                ex.wait()
        return self._pending


class _HeadersArrived(Awaitable):
    """Outer awaitable of ``input_dist``: its ``wait()`` takes the batch sizes in and sends the ids."""

    def __init__(self, pending):
        super().__init__()
        self._pending = pending

    def _wait_impl(self) -> _IdsArrived:
        self._pending.advance()
        return _IdsArrived(self._pending)


class TorchRecShardedAPI:
    """Mixed into the sharded collections (see the module docstring)."""

    _qcomm_codecs: Optional[dict] = None   # set by use_qcomm(); read when a group's stages are built

    def create_context(self) -> ShardedModuleContext:
        return ShardedModuleContext()

    def input_dist(self, ctx: ShardedModuleContext, features) -> Awaitable:
        """Collective: start ``features``' input dist (as ``start_input_dist``); two ``wait()`` calls
        give the batch that :meth:`compute_and_output_dist` takes."""
        ctx.pending = self.start_input_dist(features)
        return _HeadersArrived(ctx.pending)

    def compute_and_output_dist(self, ctx: ShardedModuleContext, dist_input) -> LazyNoWait:
        """Collective: look ``dist_input`` up and send the pooled rows back (as ``forward_from``; run
        now, so every rank issues its collectives at this call); the result comes as a LazyAwaitable."""
        return LazyNoWait(self.forward_from(dist_input))

    def embedding_bag_configs(self) -> list:
        """The tables' ``EmbeddingBagConfig`` s in the unsharded collection's order, whatever the plan
        (TorchRec's method; the unsharded ``EmbeddingBagCollection`` has it). A sharded
        ``EmbeddingCollection`` has ``embedding_configs()`` instead and raises here, naming it.

        Example:
            >>> from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig, row_wise, shard
            >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig(10, 4, "t", feature_names=["f"])])
            >>> [c.name for c in shard(ebc, {"t": row_wise()}).embedding_bag_configs()]
            ['t']
        """
        configs = list(self._tables)
        if not all(isinstance(c, EmbeddingBagConfig) for c in configs):
            raise AttributeError(f"{type(self).__name__} has no embedding_bag_configs(): its tables are "
                                 f"EmbeddingConfigs (one row per id, no pooling); use embedding_configs()")
        return configs

    @property
    def _input_dists(self) -> list:
        """Each sharding-type group's input dist stage (the names TorchRec's tutorial prints)."""
        return [g.stages.input_dist for g in self._groups]

    @property
    def _lookups(self) -> list:
        return [g.stages.lookup for g in self._groups]

    @property
    def _output_dists(self) -> list:
        return [g.stages.output_dist for g in self._groups]

    def __prepare_scriptable__(self):
        # torch.jit.script calls this first: refuse with the way out instead of a scripting error
        raise TypeError(f"torch.jit.script({type(self).__name__}): TorchScript cannot script a sharded collection "
                        f"(its stages run Python collectives); TorchRec scripts quantized inference modules only, "
                        f"which shardwise does not have. Run it eagerly, or torch.compile the dense part")


def use_qcomm(module, registry: Optional[dict], *, check_ranks: bool = True) -> None:
    """Collective (with ``check_ranks``): send ``module``'s embedding collectives through ``registry``'s
    codecs from now on (forward and backward; a later reshard keeps them); None: full precision. Every
    rank calls it with the same registry: one small all-gather compares them first and every rank
    raises if they differ (``shard(..., qcomm_codecs_registry=)`` compares it in its own digest and
    skips this).

    Example:
        >>> from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig, row_wise, shard
        >>> from shardwise.embedding.qcomm import CommType, QCommsConfig, get_qcomm_codecs_registry
        >>> sharded = shard(EmbeddingBagCollection([EmbeddingBagConfig(10, 4, "t", feature_names=["f"])]), {"t": row_wise()})
        >>> use_qcomm(sharded, get_qcomm_codecs_registry(QCommsConfig(CommType.BF16, CommType.BF16)))
        >>> sharded._output_dists[0].codecs.forward
        QuantizedCommCodec(BF16)
    """
    registry = check_registry(registry)
    if check_ranks:
        _check_same_registry(module._topo, registry)
    module._qcomm_codecs = registry
    for g in module._groups:
        g.stages.output_dist.set_qcomm(registry)


def _check_same_registry(topo, registry: Optional[dict]) -> None:
    mine = codecs_digest(registry)
    digest = list(hashlib.sha256(mine.encode()).digest()[:8])
    rows = all_gather_ints(digest, topo.world_size, topo.group, topo.device)
    differ = [r for r in range(topo.world_size) if rows[r] != rows[0]]
    if differ:
        raise ValueError(f"qcomm: ranks {differ} (of the mesh) passed another qcomm_codecs_registry than rank 0 "
                         f"(this rank: {mine}); pass the same registry (or None) on every rank")
