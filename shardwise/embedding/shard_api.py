"""``shard()``: the checks that every rank called it alike, the tables' optimizer settings, then the
sharded module (:class:`~shardwise.embedding.ShardedEmbeddingBagCollection` or, for an
EmbeddingCollection, :class:`~shardwise.embedding.ShardedEmbeddingCollection`).
:class:`~shardwise.embedding.DistributedModelParallel` enters at :func:`shard_resolved` with settings it
resolved for the whole model first.

Example:
    >>> import functools, torch
    >>> from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig, row_wise
    >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig(10, 4, "t0", feature_names=["f"])])
    >>> shard(ebc, {"t0": row_wise()}, optimizer=functools.partial(torch.optim.SGD, lr=0.1)).fused_optimizer
    FusedOptimizer(SGD(lr=0.1) for ['t0'])
"""

from __future__ import annotations

from typing import Any, Optional


from .collection.bag_collection import EmbeddingBagCollection
from .optim.settings import table_optimizers
from .plan.values import ParameterSharding
from .shard_source import check_or_broadcast, check_same_everywhere
from .qcomm import check_registry, codecs_digest
from .torchrec_api.sharded_api import use_qcomm
from .topology import MeshTopology

__all__ = ["shard", "shard_resolved"]


def check_plan(ebc: EmbeddingBagCollection, plan: dict) -> None:
    if not isinstance(plan, dict):
        raise TypeError(f"plan must be a dict {{table name: ParameterSharding}}, got {type(plan).__name__}")
    names = [t.name for t in ebc.tables]
    missing = [n for n in names if n not in plan]
    extra = sorted(k for k in plan if k not in names)
    if missing or extra:
        raise ValueError(f"plan must place every table exactly once: missing {missing}, unknown {extra}; "
                         f"tables are {names}")
    for name in names:
        if not isinstance(plan[name], ParameterSharding):
            raise TypeError(f"plan[{name!r}] must be a ParameterSharding (e.g. table_wise(0)), "
                            f"got {plan[name]!r}")


def shard(ebc: EmbeddingBagCollection, plan: dict, mesh: Any = None, optimizer=None, *,
          compile_optimizer: bool = False, src_rank: Optional[int] = None,
          gradient_division: bool = True, load_sample_every: int = 4,
          fused_params: Optional[dict] = None,
          qcomm_codecs_registry: Optional[dict] = None) -> ShardedEmbeddingBagCollection:
    """Shard ``ebc`` (an EmbeddingBagCollection, or an EmbeddingCollection: then a
    :class:`~shardwise.embedding.ShardedEmbeddingCollection`) over ``mesh`` (default: all ranks of the
    default process group) per ``plan``.

    Each rank materialises only its own shards: copied out of ``ebc``'s tables when it was built with
    storage (every table's digest is compared across ranks first and differing tables raise, unless
    ``src_rank`` names a rank whose tables are broadcast to the others, in place), or drawn from the
    seeded init when ``ebc`` was built with ``device="meta"`` (nothing the size of a table is ever
    allocated; the values are the same as an eager build with the same ``init_seed``). ``optimizer`` is
    fused into backward, e.g. ``functools.partial(torch.optim.Adagrad, lr=0.1)``; or TorchRec's
    ``fused_params={"optimizer": EmbOptimType..., "learning_rate": ...}``; a table whose weight got
    torch's ``apply_optimizer_in_backward(cls, params, kwargs)`` takes that setting instead (see
    :mod:`shardwise.embedding.optim.settings`). Without any, the module is forward-only (a backward
    warns once that those tables stay frozen).
    ``gradient_division=True`` (TorchRec's default) divides every embedding gradient by the world
    size: training then follows the mean of the per-rank losses, like DDP's dense gradients;
    ``False`` keeps the sum (the gradient of the summed losses).
    ``load_sample_every=k``: the lookup load that :meth:`~ShardedEmbeddingBagCollection.load_stats`
    reports (for rebalancing) is counted on every k-th forward (the first after a reset always), so
    the counting stays off the other steps; ``1`` counts every forward.
    The default update already runs a torch.compile'd one-pass kernel on large CPU updates (eager on
    small ones; :mod:`shardwise.embedding.optim.row_update`). ``compile_optimizer=True`` compiles it
    for every update, whatever its size (the first step pays the compile).
    ``qcomm_codecs_registry`` (from :func:`~shardwise.embedding.qcomm.get_qcomm_codecs_registry`) sends the
    pooled/sequence embeddings and their gradients over the wire in fp16/bf16 (TorchRec's qcomm).

    Example:
        >>> import functools, torch; from shardwise.embedding import EmbeddingBagConfig, row_wise, table_wise
        >>> from shardwise.sparse import KeyedJaggedTensor
        >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig(10, 4, t, feature_names=[t + "_f"]) for t in ("t0", "t1")])
        >>> sharded = shard(ebc, {"t0": table_wise(0), "t1": row_wise()},
        ...                 optimizer=functools.partial(torch.optim.SGD, lr=0.1))
        >>> kjt = KeyedJaggedTensor(["t0_f", "t1_f"], torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 1]))
        >>> sharded(kjt).values().sum().backward()       # kjt: this rank's batch
    """
    from .sharded_sequence import EmbeddingCollection

    if not isinstance(ebc, (EmbeddingBagCollection, EmbeddingCollection)):
        raise TypeError(f"shard() expects an EmbeddingBagCollection or an EmbeddingCollection, got "
                        f"{type(ebc).__name__}")
    check_plan(ebc, plan)
    check_registry(qcomm_codecs_registry)   # before the process group is needed: bad input first
    settings = table_optimizers(ebc, optimizer, fused_params, "shard()")
    return shard_resolved(ebc, plan, MeshTopology.from_mesh(mesh), settings, "shard()", compile_optimizer=compile_optimizer,
                          src_rank=src_rank, gradient_division=gradient_division, load_sample_every=load_sample_every,
                          qcomm_codecs_registry=qcomm_codecs_registry)


def shard_resolved(ebc, plan: dict, topo: MeshTopology, settings: dict, where: str, *, compile_optimizer: bool = False,
                   src_rank: Optional[int] = None, gradient_division: bool = True, load_sample_every: int = 4,
                   qcomm_codecs_registry: Optional[dict] = None):
    """:func:`shard` after the optimizer settings were resolved (``{table: (rule, hp) | None}``);
    errors name ``where`` (``shard()`` or ``DistributedModelParallel``). Collective."""
    from .sharded_collection import ShardedEmbeddingBagCollection
    from .sharded_sequence import EmbeddingCollection, ShardedEmbeddingCollection   # it subclasses ours

    if src_rank is not None and (not isinstance(src_rank, int) or isinstance(src_rank, bool)
                                 or not 0 <= src_rank < topo.world_size):
        raise ValueError(f"{where}: src_rank={src_rank!r} must be a rank of the mesh (0..{topo.world_size - 1}) or None")
    if not isinstance(gradient_division, bool):
        raise TypeError(f"{where}: gradient_division={gradient_division!r} must be True (divide by the world "
                        f"size, TorchRec's default) or False (sum)")
    if not isinstance(load_sample_every, int) or isinstance(load_sample_every, bool) or load_sample_every < 1:
        raise ValueError(f"{where}: load_sample_every={load_sample_every!r} must be an int >= 1 (count the lookup "
                         f"load on every k-th forward; 1 = every forward)")
    check_registry(qcomm_codecs_registry)
    check_same_everywhere(ebc, plan, topo, src_rank, gradient_division, settings, where,
                          codecs_digest(qcomm_codecs_registry))
    check_or_broadcast(ebc, topo, src_rank, where)
    cls = ShardedEmbeddingCollection if isinstance(ebc, EmbeddingCollection) else ShardedEmbeddingBagCollection
    sharded = cls(ebc, plan, topo, settings, compile_optimizer, gradient_division, load_sample_every)
    if qcomm_codecs_registry is not None:
        use_qcomm(sharded, qcomm_codecs_registry, check_ranks=False)   # compared by check_same_everywhere
    return sharded
