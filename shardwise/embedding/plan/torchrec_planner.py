"""TorchRec's planner interface (``torchrec.distributed.planner``): :class:`Topology`,
:class:`ParameterConstraints` and :class:`EmbeddingShardingPlanner` with ``plan(module, sharders)``
and ``collective_plan(module, sharders, pg)`` returning a :class:`ShardingPlan`.

The search is shardwise's own :class:`GreedyShardingPlanner` (balanced estimated step time under
each rank's memory; see its docstring); this layer reads TorchRec's arguments: the memory per rank
from the topology (HBM on ``cuda``, DDR on ``cpu``), hosts from ``local_world_size``, the allowed
sharding types per table from the sharders and the constraints, ids per bag from
``pooling_factors``. TorchRec's own search components (enumerator, proposer, partitioner,
performance model) are not taken: passing one is an error, not ignored.

Example:
    >>> from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig
    >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig(1000, 8, "t1", feature_names=["f1"]),
    ...                               EmbeddingBagConfig(50000, 16, "t2", feature_names=["f2"])], device="meta")
    >>> planner = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"),
    ...                                    constraints={"t2": ParameterConstraints(sharding_types=["row_wise"])})
    >>> plan = planner.plan(ebc)                     # a collection that is the module itself: path ""
    >>> plan.plan[""]["t2"].sharding_type.value
    'row_wise'
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import torch
import torch.distributed as dist

from .planner import GreedyShardingPlanner
from .sharding_plan import EmbeddingModuleShardingPlan, ShardingPlan
from .values import ShardingType

__all__ = ["Topology", "ParameterConstraints", "EmbeddingShardingPlanner"]

_log = logging.getLogger(__name__)
GIB = 1024 ** 3
_BANDWIDTHS = ("hbm_mem_bw", "ddr_mem_bw", "ssd_mem_bw", "hbm_to_ddr_mem_bw", "intra_host_bw", "inter_host_bw",
               "bwd_compute_multiplier", "weighted_feature_bwd_compute_multiplier", "uneven_sharding_perf_multiplier")


class Topology:
    """TorchRec's ``Topology(world_size, compute_device, hbm_cap=, ddr_cap=, local_world_size=, ...)``.

    Memory per rank: ``hbm_cap`` (default 32 GiB, TorchRec's) on ``"cuda"``, ``ddr_cap`` (default
    128 GiB) on ``"cpu"``. ``local_world_size`` ranks per host (default: one host) must divide
    ``world_size``. TorchRec's bandwidth arguments are accepted and kept but not used: shardwise's
    cost model takes measured figures (``EmbeddingShardingPlanner(calibration=...)``).

    Example:
        >>> Topology(world_size=4, compute_device="cpu", local_world_size=2).memory_per_rank[0] // 2**30
        128
    """

    def __init__(self, world_size: int, compute_device: str, hbm_cap: Optional[int] = None,
                 ddr_cap: Optional[int] = None, ssd_cap: Optional[int] = None, local_world_size: Optional[int] = None,
                 pod_size: Optional[int] = None, custom_topology_data=None, generalized_comms_bandwidths=None,
                 created_by_factory: bool = False, **bandwidths):
        unknown = sorted(set(bandwidths) - set(_BANDWIDTHS))
        if unknown:
            raise TypeError(f"Topology: unknown arguments {unknown}; TorchRec's are world_size, compute_device, "
                            f"hbm_cap, ddr_cap, ssd_cap, local_world_size, pod_size and {list(_BANDWIDTHS)}")
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"Topology: world_size={world_size!r} must be a positive int")
        if compute_device not in ("cpu", "cuda"):
            raise ValueError(f"Topology: compute_device={compute_device!r} is not supported; use 'cpu' or 'cuda'")
        if custom_topology_data is not None or generalized_comms_bandwidths is not None:
            raise ValueError("Topology: custom_topology_data / generalized_comms_bandwidths are not supported; give "
                             "per-rank memory to GreedyShardingPlanner(memory_per_rank_bytes=[...]) and measured "
                             "costs as calibration=calibrate()")
        local = world_size if local_world_size is None else local_world_size
        if isinstance(local, bool) or not isinstance(local, int) or local < 1 or world_size % local:
            raise ValueError(f"Topology: local_world_size={local_world_size!r} must be a positive int dividing "
                             f"world_size={world_size} (hosts of equal size)")
        if pod_size is not None and pod_size > world_size:
            raise ValueError(f"Topology: pod_size={pod_size} cannot be greater than world_size={world_size}")
        self.world_size, self.compute_device, self.local_world_size = world_size, compute_device, local
        self.hbm_cap = (32 * GIB if hbm_cap is None else hbm_cap) if compute_device == "cuda" else 0
        self.ddr_cap = 128 * GIB if ddr_cap is None else ddr_cap
        self.ssd_cap, self.pod_size, self.bandwidths = ssd_cap, pod_size, dict(bandwidths)
        cap = self.hbm_cap if compute_device == "cuda" else self.ddr_cap
        if not isinstance(cap, (int, float)) or cap <= 0:
            raise ValueError(f"Topology: the {'hbm_cap' if compute_device == 'cuda' else 'ddr_cap'} for "
                             f"{compute_device} must be a positive number of bytes, got {cap!r}")
        self.memory_per_rank = [int(cap)] * world_size

    def __repr__(self) -> str:
        return (f"Topology(world_size={self.world_size}, compute_device={self.compute_device!r}, "
                f"local_world_size={self.local_world_size}, memory_per_rank={self.memory_per_rank[0]})")


@dataclass
class ParameterConstraints:
    """TorchRec's per-table constraints (keyed by table name in ``constraints=``). Honoured:
    ``sharding_types``, ``compute_kernels`` (``"fused"``, or ``"dense"`` for data-parallel),
    ``pooling_factors`` (their mean: ids per bag in the cost model), ``is_weighted`` and
    ``feature_names`` (informational). The cache, UVM, SSD, key-value and per-feature batch options
    are CUDA/FBGEMM features shardwise does not have: setting one is an error naming it.

    Example:
        >>> ParameterConstraints(sharding_types=["table_wise"], pooling_factors=[2.0, 4.0]).pooling_factors
        [2.0, 4.0]
    """

    sharding_types: Optional[list] = None
    compute_kernels: Optional[list] = None
    min_partition: Optional[int] = None
    pooling_factors: list = field(default_factory=lambda: [1.0])
    num_poolings: Optional[list] = None
    batch_sizes: Optional[list] = None
    is_weighted: bool = False
    cache_params: Any = None
    enforce_hbm: Optional[bool] = None
    stochastic_rounding: Optional[bool] = None
    bounds_check_mode: Any = None
    feature_names: Optional[list] = None
    output_dtype: Any = None
    device_group: Optional[str] = None
    key_value_params: Any = None
    use_virtual_table: bool = False


_UNSUPPORTED = ("min_partition", "num_poolings", "batch_sizes", "cache_params", "enforce_hbm", "stochastic_rounding",
                "bounds_check_mode", "output_dtype", "device_group", "key_value_params")
_SEARCH_PARTS = ("enumerator", "storage_reservation", "proposer", "partitioner", "performance_model", "stats",
                 "callbacks", "plan_loader")


def _check_constraint(name: str, c) -> tuple:
    """(allowed ShardingTypes or None, mean pooling factor) of one table's constraints."""
    if not isinstance(c, ParameterConstraints):
        raise TypeError(f"constraints[{name!r}] must be a ParameterConstraints, got {type(c).__name__}")
    for attr in _UNSUPPORTED:
        if getattr(c, attr) is not None:
            raise ValueError(f"constraints[{name!r}].{attr}={getattr(c, attr)!r} is not supported by shardwise's "
                             f"planner (a CUDA/FBGEMM or per-feature option); drop it")
    if c.use_virtual_table:
        raise ValueError(f"constraints[{name!r}].use_virtual_table: virtual (key-value) tables are not supported")
    kernels = set(c.compute_kernels or ["fused"])
    if not kernels & {"fused", "dense"}:
        raise ValueError(f"constraints[{name!r}].compute_kernels={c.compute_kernels!r}: shardwise has one kernel "
                         f"('fused': the optimizer runs in the backward); UVM, caching and quantized kernels are "
                         f"CUDA/FBGEMM features -- use ['fused']")
    types = None
    if c.sharding_types is not None:
        types = set()
        for t in c.sharding_types:
            try:
                types.add(ShardingType(getattr(t, "value", t)))
            except ValueError:
                raise ValueError(f"constraints[{name!r}].sharding_types: {t!r} is not a shardwise sharding type; "
                                 f"use {[x.value for x in ShardingType]}") from None
    factors = list(c.pooling_factors or [1.0])
    if any(not isinstance(f, (int, float)) or not f > 0 for f in factors):
        raise ValueError(f"constraints[{name!r}].pooling_factors={factors!r} must be positive numbers")
    return types, sum(factors) / len(factors)


def _collections(module, sharders, device_type: str) -> list:
    """``[(path, collection, allowed types or None)]`` for each unsharded collection a sharder takes
    (every collection when ``sharders`` is None); a collection's own children are not searched."""
    from ..collection import EmbeddingBagCollection, EmbeddingCollection

    kinds = (EmbeddingBagCollection, EmbeddingCollection)
    found, skip, seen = [], None, []
    for path, m in module.named_modules():
        if skip is not None and path.startswith(skip):
            continue
        if not isinstance(m, kinds):
            continue
        skip = path + "." if path else ""
        seen.append(type(m).__name__)
        if sharders is None:
            found.append((path, m, None))
            continue
        mine = [s for s in sharders if getattr(s, "module_type", None) in (None, type(m))
                or (isinstance(getattr(s, "module_type", None), type) and isinstance(m, s.module_type))]
        if mine:
            types = {ShardingType(x) for s in mine for x in s.sharding_types(device_type)
                     if getattr(x, "value", x) in ShardingType._value2member_map_}
            found.append((path, m, types))
    if seen and not found:
        raise ValueError(f"no sharder takes any of the module's collections ({sorted(set(seen))}); the sharders' "
                         f"module types are {[getattr(getattr(s, 'module_type', None), '__name__', None) for s in sharders]}"
                         f" -- pass shardwise's EmbeddingBagCollectionSharder / EmbeddingCollectionSharder")
    return found


def _digest(plan: ShardingPlan) -> int:
    text = repr(sorted((p, sorted((n, repr(ps)) for n, ps in m.items())) for p, m in plan.plan.items()))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=7).digest(), "little", signed=True)   # 56 bits: negation cannot overflow


class EmbeddingShardingPlanner:
    """TorchRec's ``EmbeddingShardingPlanner(topology=, batch_size=, constraints=, ...)``: ``plan(module,
    sharders)`` plans every embedding collection in ``module`` that a sharder takes (all of them when
    ``sharders`` is None) in one search and returns a :class:`ShardingPlan` keyed by module path.

    ``topology`` defaults to TorchRec's: every rank of the default process group (1 without one),
    ``LOCAL_WORLD_SIZE`` ranks per host, ``cuda`` if available. ``batch_size``: examples per rank
    per step (default 512). shardwise's own options (keyword only): ``calibration`` (measured
    costs), ``optimizer`` (whose state the memory estimate counts, default ``"adagrad"``),
    ``data_parallel_max_rows``, ``min_column_width``. A sharder is any object with
    ``sharding_types(compute_device_type)`` (and optionally ``module_type``).

    Example:
        >>> from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig
        >>> model = torch.nn.ModuleDict({"ebc": EmbeddingBagCollection(
        ...     [EmbeddingBagConfig(100, 4, "t", feature_names=["f"])], device="meta")})
        >>> planner = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"))
        >>> list(planner.plan(model).plan), planner.plan(model).plan["ebc"]["t"].compute_kernel
        (['ebc'], 'fused')
    """

    def __init__(self, topology: Optional[Topology] = None, batch_size: Optional[int] = None, enumerator=None,
                 storage_reservation=None, proposer=None, partitioner=None, performance_model=None, stats=None,
                 constraints: Optional[dict] = None, debug: bool = True, callbacks=None,
                 timeout_seconds: Optional[int] = None, plan_loader=None, *, calibration=None,
                 optimizer: str = "adagrad", data_parallel_max_rows: int = 1024, min_column_width: int = 32):
        given = {k: v for k, v in (("enumerator", enumerator), ("storage_reservation", storage_reservation),
                                   ("proposer", proposer), ("partitioner", partitioner),
                                   ("performance_model", performance_model), ("stats", stats),
                                   ("callbacks", callbacks), ("plan_loader", plan_loader)) if v is not None}
        if given:
            raise ValueError(f"EmbeddingShardingPlanner: {sorted(given)} are parts of TorchRec's own search, which "
                             f"shardwise does not run; its greedy search takes constraints=, calibration= and "
                             f"topology= (or pass a plan of your own to DistributedModelParallel(plan=...))")
        if topology is not None and not isinstance(topology, Topology):
            raise TypeError(f"EmbeddingShardingPlanner: topology must be a shardwise Topology, got "
                            f"{type(topology).__name__}")
        self._topology = topology
        self._batch_size = 512 if batch_size is None else batch_size
        self._constraints = {name: _check_constraint(name, c) for name, c in (constraints or {}).items()}
        self._debug = debug
        self._options = {"calibration": calibration, "optimizer": optimizer,
                         "data_parallel_max_rows": data_parallel_max_rows, "min_column_width": min_column_width}

    @property
    def topology(self) -> Topology:
        """The topology given, or TorchRec's default one read now (the default process group)."""
        if self._topology is not None:
            return self._topology
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        return Topology(world_size=world, compute_device="cuda" if torch.cuda.is_available() else "cpu",
                        local_world_size=local if local and world % local == 0 else world)

    def plan(self, module: torch.nn.Module, sharders: Optional[list] = None) -> ShardingPlan:
        """The plan of every collection in ``module`` (a pure function of the arguments: no collective)."""
        topo = self.topology
        found = _collections(module, sharders, topo.compute_device)
        if not found:
            return ShardingPlan({})
        unknown = sorted(set(self._constraints) - {t.name for _, m, _ in found for t in m.tables})
        if unknown:
            raise ValueError(f"constraints name tables {unknown} that no planned collection holds; the tables are "
                             f"{sorted(t.name for _, m, _ in found for t in m.tables)}")
        tables, owner, table_types, ids = self._tables(found)
        greedy = GreedyShardingPlanner(
            topo.world_size, topo.memory_per_rank, batch_size_per_rank=self._batch_size, ids_per_bag=ids,
            ranks_per_host=topo.local_world_size, table_sharding_types=table_types,
            memory_flag="Topology(hbm_cap= / ddr_cap=)", **self._options)
        flat = greedy.plan(tables)
        if self._debug:
            _log.info("shardwise plan:\n%s", greedy.format_plan(flat, tables))
        out: dict = {path: EmbeddingModuleShardingPlan() for path, _, _ in found}
        for t in tables:
            path, name = owner[t.name]
            out[path][name] = flat[t.name]
        return ShardingPlan(out)

    def _tables(self, found: list) -> tuple:
        """The configs planned together (renamed apart where collections share table or feature
        names), which (path, table) each came from, allowed types and ids per bag by planned name."""
        names = [t.name for _, m, _ in found for t in m.tables]
        feats = [f for _, m, _ in found for t in m.tables for f in t.feature_names]
        clash = len(set(names)) < len(names) or len(set(feats)) < len(feats)
        tables, owner, table_types, ids = [], {}, {}, {}
        for i, (path, m, sharder_types) in enumerate(found):
            for t in m.tables:
                planned = replace(t, name=f"{t.name}__{i}", feature_names=[f"{f}__{i}" for f in t.feature_names]) \
                    if clash else t
                tables.append(planned)
                owner[planned.name] = (path, t.name)
                allowed, pooling = self._constraints.get(t.name, (None, 1.0))
                if sharder_types is not None:
                    allowed = sharder_types if allowed is None else allowed & sharder_types
                    if not allowed:
                        raise ValueError(f"table {t.name!r} of {path or 'the module'!r}: its sharders allow "
                                         f"{sorted(x.value for x in sharder_types)} and its constraints "
                                         f"{sorted(x.value for x in self._constraints[t.name][0])}: nothing in common")
                if allowed is not None:
                    table_types[planned.name] = allowed
                ids[planned.name] = pooling
        return tables, owner, table_types, ids

    def collective_plan(self, module: torch.nn.Module, sharders: Optional[list] = None, pg=None) -> ShardingPlan:
        """:meth:`plan` on every rank of ``pg`` (default: the default group), then a check that every
        rank planned the same (a digest reduced over ``pg``); ranks that differ raise alike."""
        plan = self.plan(module, sharders)
        if not (dist.is_available() and dist.is_initialized()):
            return plan
        group = pg if pg is not None else dist.group.WORLD
        if dist.get_world_size(group) != self.topology.world_size:
            raise ValueError(f"collective_plan: the topology has world_size={self.topology.world_size} but the "
                             f"process group has {dist.get_world_size(group)} ranks; give Topology(world_size=...) "
                             f"the group's size")
        device = torch.device("cpu")
        if "nccl" in str(dist.get_backend(group)):
            from ..._device import local_device

            device = local_device("cuda")
        mine = torch.tensor([_digest(plan), -_digest(plan)], dtype=torch.int64, device=device)
        both = mine.clone()
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
        if both[0] != mine[0] or both[1] != mine[1]:
            raise RuntimeError("collective_plan: the ranks planned differently (different tables, constraints, "
                               "topology or calibration on some rank); give every rank the same arguments")
        return plan
