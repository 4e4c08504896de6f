"""``DistributedModelParallel``: shard every embedding collection inside a model from one plan and
keep the rest data-parallel -- TorchRec's entry point and signature, with :func:`shard` as the primitive.

Optimizers as TorchRec users set them: torch's ``apply_optimizer_in_backward`` on a table's weight
(wins), a sharder's ``fused_params``, or our ``optimizer=`` factory; a table with none of them gets
TorchRec's default for fused tables, SGD(lr=0.01), and the choice is printed. ``fused_optimizer`` is one
:class:`~shardwise.optim.CombinedOptimizer` for the whole model; ``state_dict()`` and
``named_parameters()`` use the unwrapped model's names (``ebc.embedding_bags.t.weight``) at any world size.

Example:
    >>> import torch
    >>> from torch.distributed.optim import _apply_optimizer_in_backward as apply_optimizer_in_backward
    >>> from shardwise.embedding import DistributedModelParallel, EmbeddingBagCollection, EmbeddingBagConfig
    >>> from shardwise.optim import CombinedOptimizer, KeyedOptimizerWrapper, RowWiseAdagrad, in_backward_optimizer_filter
    >>> from shardwise.sparse import KeyedJaggedTensor
    >>> class Tiny(torch.nn.Module):      # a DLRM in miniature: an embedding collection, a dense layer
    ...     def __init__(self, ebc):
    ...         super().__init__(); self.ebc, self.top = ebc, torch.nn.Linear(4, 1)
    ...     def forward(self, kjt): return self.top(self.ebc(kjt).values())
    >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig(10, 4, "t", feature_names=["f"])], device="meta")
    >>> apply_optimizer_in_backward(RowWiseAdagrad, ebc.parameters(), {"lr": 0.05})
    >>> model = DistributedModelParallel(Tiny(ebc), device=torch.device("cpu"))
    >>> list(model.state_dict())
    ['ebc.embedding_bags.t.weight', 'top.weight', 'top.bias']
    >>> dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(model.named_parameters())),
    ...                               lambda ps: torch.optim.Adam(ps, lr=1e-3))
    >>> opt = CombinedOptimizer([model.fused_optimizer, dense])
    >>> kjt = KeyedJaggedTensor(["f"], torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 1]))
    >>> model(kjt).sum().backward(); opt.step()                 # embeddings updated in backward
"""

from __future__ import annotations

import sys
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import nn

from ..optim.keyed import CombinedOptimizer
from .collection.bag_collection import EmbeddingBagCollection
from .collection.embedding_collection import EmbeddingCollection
from .optim.rules import resolve_optimizer
from .optim.settings import describe, table_optimizers
from .plan.planner import GreedyShardingPlanner
from .plan.values import ParameterSharding
from .sharded_collection import shard_resolved
from .torchrec_api.sharders import check_sharders, sharder_for
from .torchrec_api.sharding_env import ShardingEnv, mesh_for
from .shard_source import check_one_dtype
from .topology import MeshTopology

__all__ = ["DistributedModelParallel"]

_WHO = "DistributedModelParallel"
DEFAULT_FUSED = torch.optim.SGD, {"lr": 0.01}   # FBGEMM's EXACT_SGD at 0.01: TorchRec 1.8's fused tables, on CPU too


def _collections(module: nn.Module) -> dict:
    return {path: m for path, m in module.named_modules()
            if isinstance(m, (EmbeddingBagCollection, EmbeddingCollection))}


def _per_collection(plan: Any, found: dict, topo: MeshTopology, planner) -> dict:
    """``{path: {table: ParameterSharding}}`` from TorchRec's per-module form (or an object with a
    ``.plan`` dict, TorchRec's ShardingPlan), a flat ``{table: ...}`` plan (table names unique across
    collections), or the planner (all tables at once)."""
    tables = {path: [t.name for t in ebc.tables] for path, ebc in found.items()}
    if plan is None:
        planner = planner or GreedyShardingPlanner(topo.world_size, memory_per_rank_bytes=2**40)
        every = [t for ebc in found.values() for t in ebc.tables]
        plan = planner.plan(every)
    if not isinstance(plan, dict) and isinstance(getattr(plan, "plan", None), dict):
        plan = plan.plan
    if not isinstance(plan, dict):
        raise TypeError(f"{_WHO}: plan must be a dict ({{module path: {{table: ParameterSharding}}}} or {{table: "
                        f"ParameterSharding}}) or a ShardingPlan, got {type(plan).__name__}")
    if plan and all(isinstance(v, ParameterSharding) for v in plan.values()):
        names = [n for ns in tables.values() for n in ns]
        if len(set(names)) != len(names):
            raise ValueError(f"{_WHO}: a flat plan needs table names unique across collections, got {names}; key "
                             f"the plan by module path instead ({list(tables)})")
        return {path: {n: plan[n] for n in ns if n in plan} for path, ns in tables.items()}
    unknown = sorted(set(plan) - set(tables))
    if unknown:
        raise ValueError(f"{_WHO}: plan names modules {unknown} that are not embedding collections of the model; "
                         f"collections are at {list(tables)}")
    return {path: dict(plan.get(path, {})) for path in tables}


def _replace(root: nn.Module, path: str, new: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, new)


def _settings(found: dict, sharders: list, optimizer, plan: dict, who: str = _WHO) -> dict:
    """Per collection ``{table: (rule, hp)}``; resolved (and every error raised) before any collection changes."""
    out, defaulted = {}, []
    fallback = resolve_optimizer(lambda ps: DEFAULT_FUSED[0](ps, **DEFAULT_FUSED[1]))
    for path, ebc in found.items():
        sharder = sharder_for(ebc, sharders, who)
        where = f"{who}, collection {path or '(the model)'!r}" if who == _WHO else who
        if sharder is not None:
            bad = {n: p.sharding_type.value for n, p in plan[path].items()
                   if p.sharding_type.value not in sharder.sharding_types()}
            if bad:
                raise ValueError(f"{where}: tables {bad} are planned with sharding types that its sharder allows not "
                                 f"(allowed: {sharder.sharding_types()}); change the plan or the sharder")
        settings = table_optimizers(ebc, optimizer, sharder.fused_params if sharder else None, where)
        for t, s in settings.items():
            if s is None:
                settings[t] = (fallback[0], dict(fallback[1]))
                defaulted.append(f"{path}.{t}" if path else t)
        out[path] = settings
    if defaulted and (not dist.is_initialized() or dist.get_rank() == 0):
        print(f"{who}: no optimizer was given for tables {defaulted} (no apply_optimizer_in_backward on their "
              f"weights, no optimizer= and no fused_params): they train with {describe(*fallback)} fused into backward, "
              f"TorchRec's default for fused tables. (TorchRec leaves small data-parallel tables to your dense "
              f"optimizer instead; here every table is fused.)", file=sys.stderr)
    return out


class DistributedModelParallel(nn.Module):
    """Wrap ``module``: every ``EmbeddingBagCollection`` and ``EmbeddingCollection`` inside is sharded
    by ``plan`` -- TorchRec's ``{module path: {table: ParameterSharding}}`` (or ShardingPlan), a flat
    ``{table: ParameterSharding}``, or None for the planner's choice over all tables -- over ``env``'s
    process group (default: every rank) on ``device``'s type (default: the default group's), with each
    table's optimizer fused into backward; the remaining (dense) parameters are wrapped in
    ``DistributedDataParallel`` when ``init_data_parallel`` (and more than one rank).

    ``sharders``: :class:`EmbeddingBagCollectionSharder` / :class:`EmbeddingCollectionSharder` with
    ``fused_params`` and allowed ``sharding_types``. Ours on top: ``mesh=`` (instead of ``env``/``device``),
    ``optimizer=`` (a torch optimizer factory for every table without its own setting), ``planner=``,
    and ``shard_kwargs`` for :func:`shard` (``gradient_division``, ``src_rank``, ``compile_optimizer``).
    TorchRec's ``init_parameters`` is accepted (meta-built collections are always materialised shard by
    shard); ``data_parallel_wrapper`` is not supported.

    ``module`` is the unwrapped model; ``named_parameters()`` / ``state_dict()`` use its names (the
    tables as DTensor / ShardedTable views, marked as optimized in backward); ``fused_optimizer`` is one
    CombinedOptimizer over the collections' fused optimizers; ``plan`` is the plan used.
    Raises ``ValueError`` when the model holds no embedding collection.

    Example: see the module's.
    """

    def __init__(self, module: nn.Module, env: Optional[ShardingEnv] = None, device: Any = None,
                 plan: Any = None, sharders: Optional[list] = None, init_data_parallel: bool = True,
                 init_parameters: bool = True, data_parallel_wrapper: Any = None, *, mesh: Any = None,
                 optimizer=None, planner: Optional[GreedyShardingPlanner] = None,
                 data_parallel: Optional[bool] = None, **shard_kwargs):
        super().__init__()
        if isinstance(env, dict):
            raise TypeError(f"{_WHO}: the second argument is env (a ShardingEnv), as in TorchRec; pass the plan by "
                            f"keyword: {_WHO}(module, plan=...)")
        if data_parallel_wrapper is not None:
            raise NotImplementedError(f"{_WHO}: data_parallel_wrapper is not supported; the dense part is wrapped in "
                                      f"DistributedDataParallel (init_data_parallel=False to leave it unwrapped)")
        found = _collections(module)
        if not found:
            raise ValueError(f"{_WHO}: {type(module).__name__} holds no EmbeddingBagCollection (or EmbeddingCollection) "
                             f"to shard; use DistributedDataParallel for a dense model")
        sharders = check_sharders(sharders, _WHO)
        topo = MeshTopology.from_mesh(mesh_for(env, device, mesh, _WHO))
        self.plan = _per_collection(plan, found, topo, planner)
        for path, ebc in found.items():     # before any collection of the model is replaced
            check_one_dtype(ebc, f"{_WHO}, collection {path or '(the model)'!r}")
        settings = _settings(found, sharders, optimizer, self.plan)
        for path, ebc in found.items():
            sharder = sharder_for(ebc, sharders, _WHO)
            codecs = sharder.qcomm_codecs_registry if sharder is not None else None
            sharded = shard_resolved(ebc, self.plan[path], topo, settings[path], _WHO,
                                     qcomm_codecs_registry=codecs, **shard_kwargs)
            if path:
                _replace(module, path, sharded)
            else:
                module = sharded
        self._paths = list(found)
        self._inner_module = [module]          # a list: not a second registration of the same module
        wrap = init_data_parallel if data_parallel is None else data_parallel
        dense = any(p.requires_grad for p in module.parameters())
        if wrap and dense and topo.world_size > 1:
            from torch.nn.parallel import DistributedDataParallel

            module = DistributedDataParallel(module, process_group=topo.group)
        self._dmp_wrapped_module = module
        self._topo = topo
        self._fused = CombinedOptimizer([(p, m.fused_optimizer) for p, m in self.sharded_modules.items()])

    def forward(self, *args, **kwargs):
        return self._dmp_wrapped_module(*args, **kwargs)

    @property
    def module(self) -> nn.Module:
        """The model with sharded collections, without the DistributedDataParallel wrapper (TorchRec's)."""
        return self._inner_module[0]

    @property
    def sharded_modules(self) -> dict:
        """``{module path: ShardedEmbeddingBagCollection | ShardedEmbeddingCollection}``."""
        inner = self.module
        return {p: (inner.get_submodule(p) if p else inner) for p in self._paths}

    @property
    def fused_optimizer(self) -> CombinedOptimizer:
        """All fused optimizers as one :class:`~shardwise.optim.KeyedOptimizer` (keys
        ``<path>.embedding_bags.<t>.weight``): param groups an LR scheduler drives, state dicts."""
        return self._fused

    def world_size(self) -> int:
        return self._topo.world_size if dist.is_initialized() else 1

    # ---- names as the unwrapped model's -------------------------------------------------------------
    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        """The unwrapped model's names; each table's weight (a view of its shards, with
        ``_in_backward_optimizers`` set, so :func:`~shardwise.optim.in_backward_optimizer_filter`
        leaves it out of a dense optimizer) where its collection is."""
        sharded = {id(m): p for p, m in self.sharded_modules.items()}
        pre = f"{prefix}." if prefix else ""
        for path, mod in self.module.named_modules(remove_duplicate=remove_duplicate):
            at = f"{pre}{path}." if path else pre
            if id(mod) in sharded:
                for key, w in mod.fused_optimizer.params.items():
                    yield at + key, w
            elif recurse or not path:
                for name, p in mod.named_parameters(recurse=False):
                    yield at + name, p

    def parameters(self, recurse: bool = True):
        """The dense parameters only, unlike ``named_parameters()``: what a dense torch optimizer takes
        (one that builds state eagerly, like Adagrad, would otherwise allocate it for whole tables).
        TorchRec's ``parameters()`` lists the tables too."""
        for _, p in self.named_parameters(recurse=recurse):
            if not hasattr(p, "_in_backward_optimizers"):
                yield p

    def state_dict(self, destination=None, prefix: str = "", keep_vars: bool = False):
        return self.module.state_dict(destination=destination, prefix=prefix, keep_vars=keep_vars)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Load a state dict with the unwrapped model's names; one saved before those names (keys under
        ``module.`` or ``module.module.``) is mapped. Every key is checked before anything is loaded."""
        state = _legacy_mapped(dict(state_dict), set(self.state_dict()))
        parts, rest = {}, dict(state)
        for path in sorted(self._paths, key=len, reverse=True):
            pre = f"{path}." if path else ""
            parts[path] = {k[len(pre):]: rest.pop(k) for k in list(rest) if k.startswith(pre)}
        dense_keys = {k for k in self.module.state_dict()
                      if not any(k.startswith(f"{p}.") or not p for p in self._paths)}
        missing = sorted(dense_keys - set(rest))
        unexpected = sorted(set(rest) - dense_keys)
        for path, part in parts.items():
            m = self.sharded_modules[path]
            keys = set(m.state_dict())
            missing += sorted(f"{path}.{k}" if path else k for k in keys - set(part))
            unexpected += sorted(f"{path}.{k}" if path else k for k in set(part) - keys)
        if strict and (missing or unexpected):
            raise ValueError(f"{_WHO}.load_state_dict: missing keys {missing}, unexpected keys {unexpected}; pass "
                             f"strict=False to load a subset (nothing was loaded)")
        for path, part in parts.items():
            self.sharded_modules[path].load_state_dict(part, strict=False)
        if rest:
            self.module.load_state_dict(rest, strict=False)
        return nn.modules.module._IncompatibleKeys(missing, unexpected)


def _legacy_mapped(state: dict, known: set) -> dict:
    """Keys written before DMP used the unwrapped names (``module.<name>``, ``module.module.<name>``)
    mapped to ``<name>``; other keys unchanged."""
    out = {}
    for k, v in state.items():
        name = k
        for old in ("module.module.", "module."):
            if k not in known and k.startswith(old) and k[len(old):] in known:
                name = k[len(old):]
                break
        out[name] = v
    return out
