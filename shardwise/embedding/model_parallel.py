"""``DistributedModelParallel``: shard every embedding collection inside a model from one plan and
keep the rest data-parallel -- TorchRec's entry point, with :func:`shard` as the primitive.

Example:
    >>> import functools, torch
    >>> from shardwise.embedding import DistributedModelParallel, EmbeddingBagCollection, EmbeddingBagConfig
    >>> from shardwise.sparse import KeyedJaggedTensor
    >>> class Tiny(torch.nn.Module):      # a DLRM in miniature: an embedding collection, a dense layer
    ...     def __init__(self, ebc):
    ...         super().__init__(); self.ebc, self.top = ebc, torch.nn.Linear(4, 1)
    ...     def forward(self, kjt): return self.top(self.ebc(kjt).values())
    >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig(10, 4, "t", feature_names=["f"])])
    >>> model = DistributedModelParallel(Tiny(ebc), optimizer=functools.partial(torch.optim.Adagrad, lr=0.05))
    >>> model.plan                                                     # the planner's, per collection
    {'ebc': {'t': ParameterSharding(sharding_type=<ShardingType.TABLE_WISE: 'table_wise'>, ranks=(0,), host_index=None)}}
    >>> dense_opt = torch.optim.Adam(model.parameters(), lr=1e-3)     # the dense parameters only
    >>> kjt = KeyedJaggedTensor(["f"], torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 1]))
    >>> model(kjt).sum().backward(); dense_opt.step()                 # embeddings update in backward
"""

from __future__ import annotations

from typing import Any, Optional

import torch.distributed as dist
from torch import nn

from .collection.bag_collection import EmbeddingBagCollection
from .collection.embedding_collection import EmbeddingCollection
from .plan.planner import EmbeddingShardingPlanner
from .plan.values import ParameterSharding
from .sharded_collection import ShardedEmbeddingBagCollection, shard
from .shard_source import check_one_dtype
from .topology import Topology

__all__ = ["DistributedModelParallel"]


def _collections(module: nn.Module) -> dict:
    return {path: m for path, m in module.named_modules()
            if isinstance(m, (EmbeddingBagCollection, EmbeddingCollection))}


def _per_collection(plan: Optional[dict], found: dict, topo: Topology, planner) -> dict:
    """``{path: {table: ParameterSharding}}`` from TorchRec's per-module form, a flat ``{table: ...}``
    plan (table names unique across collections), or the planner (all tables at once)."""
    tables = {path: [t.name for t in ebc.tables] for path, ebc in found.items()}
    if plan is None:
        planner = planner or EmbeddingShardingPlanner(topo.world_size, memory_per_rank_bytes=2**40)
        every = [t for ebc in found.values() for t in ebc.tables]
        plan = planner.plan(every)
    if not isinstance(plan, dict):
        raise TypeError(f"plan must be a dict ({{module path: {{table: ParameterSharding}}}} or {{table: "
                        f"ParameterSharding}}), got {type(plan).__name__}")
    if plan and all(isinstance(v, ParameterSharding) for v in plan.values()):
        names = [n for ns in tables.values() for n in ns]
        if len(set(names)) != len(names):
            raise ValueError(f"a flat plan needs table names unique across collections, got {names}; key the "
                             f"plan by module path instead ({list(tables)})")
        return {path: {n: plan[n] for n in ns if n in plan} for path, ns in tables.items()}
    unknown = sorted(set(plan) - set(tables))
    if unknown:
        raise ValueError(f"plan names modules {unknown} that are not embedding collections of the model; "
                         f"collections are at {list(tables)}")
    return {path: dict(plan.get(path, {})) for path in tables}


def _replace(root: nn.Module, path: str, new: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, new)


class DistributedModelParallel(nn.Module):
    """Wrap ``module``: every ``EmbeddingBagCollection`` and ``EmbeddingCollection`` inside is sharded
    over ``mesh`` (default: all ranks) by ``plan`` -- TorchRec's ``{module path: {table: ParameterSharding}}``, a flat ``{table:
    ParameterSharding}``, or None for :class:`EmbeddingShardingPlanner`'s choice over all tables --
    with ``optimizer`` fused into backward; the remaining (dense) parameters are wrapped in
    ``DistributedDataParallel`` when ``data_parallel`` (and more than one rank). ``shard_kwargs`` go
    to :func:`shard` (``gradient_division``, ``src_rank``, ``compile_optimizer``).

    ``parameters()`` are the dense parameters (the embeddings update themselves in backward);
    ``fused_optimizer`` / ``sharded_modules`` reach the sharded collections; ``plan`` is the plan used.
    Raises ``ValueError`` when the model holds no embedding collection.

    Example: see the module's.
    """

    def __init__(self, module: nn.Module, plan: Optional[dict] = None, *, mesh: Any = None, optimizer=None,
                 planner: Optional[EmbeddingShardingPlanner] = None, data_parallel: bool = True, **shard_kwargs):
        super().__init__()
        found = _collections(module)
        if not found:
            raise ValueError(f"{type(module).__name__} holds no EmbeddingBagCollection (or EmbeddingCollection) "
                             f"to shard; use DistributedDataParallel for a dense model")
        topo = Topology.from_mesh(mesh)
        self.plan = _per_collection(plan, found, topo, planner)
        for path, ebc in found.items():     # before any collection of the model is replaced
            check_one_dtype(ebc, f"DistributedModelParallel, collection {path or '(the model)'!r}")
        for path, ebc in found.items():
            sharded = shard(ebc, self.plan[path], mesh=topo.mesh, optimizer=optimizer, **shard_kwargs)
            if path:
                _replace(module, path, sharded)
            else:
                module = sharded
        self._paths = list(found)
        dense = any(p.requires_grad for p in module.parameters())
        if data_parallel and dense and topo.world_size > 1:
            from torch.nn.parallel import DistributedDataParallel

            module = DistributedDataParallel(module, process_group=topo.group)
        self.module = module
        self._topo = topo

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @property
    def _inner(self) -> nn.Module:
        return getattr(self.module, "module", self.module) if not isinstance(
            self.module, ShardedEmbeddingBagCollection) else self.module

    @property
    def sharded_modules(self) -> dict:
        """``{module path: ShardedEmbeddingBagCollection | ShardedEmbeddingCollection}``."""
        inner = self._inner
        return {p: (inner.get_submodule(p) if p else inner) for p in self._paths}

    @property
    def fused_optimizer(self) -> dict:
        """``{module path: FusedOptimizer}`` of the sharded collections (their state dicts, loading)."""
        return {p: m.fused_optimizer for p, m in self.sharded_modules.items()}

    def world_size(self) -> int:
        return self._topo.world_size if dist.is_initialized() else 1
