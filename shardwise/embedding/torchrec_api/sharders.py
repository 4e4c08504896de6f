"""TorchRec's module sharders (``EmbeddingBagCollectionSharder``, ``EmbeddingCollectionSharder``):
the per-module options :class:`~shardwise.embedding.DistributedModelParallel` honours -- the fused
optimizer (``fused_params``) and the sharding types a module's tables may get (``sharding_types()``).
Not to be confused with ``shardwise.embedding.sharding.ShardingKind``, the per-type layout code.

Example:
    >>> from shardwise.embedding import EmbOptimType
    >>> sharder = EmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    ...                                                       "learning_rate": 0.05})
    >>> sharder.module_type.__name__, sharder.sharding_types("cpu")[:2]
    ('EmbeddingBagCollection', ['data_parallel', 'table_wise'])
"""

from __future__ import annotations

from typing import Any, Optional

from ..collection.bag_collection import EmbeddingBagCollection
from ..collection.embedding_collection import EmbeddingCollection
from ..plan.values import ShardingType

__all__ = ["ModuleSharder", "EmbeddingBagCollectionSharder", "EmbeddingCollectionSharder"]


class ModuleSharder:
    """Options for sharding modules of :attr:`module_type` (TorchRec's base class).

    ``fused_params``: TorchRec's, e.g. ``{"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1}``
    (per-table ``apply_optimizer_in_backward`` settings still win). ``qcomm_codecs_registry``:
    quantized communication of the pooled embeddings. ``sharding_types``: restrict the types the
    module's tables may get (default: every type we implement, on any device -- TorchRec's CPU list
    leaves out row-wise and table-row-wise, ours has them).
    """

    module_type: type = object

    def __init__(self, fused_params: Optional[dict] = None, qcomm_codecs_registry: Optional[dict] = None,
                 sharded_module_order_overwrite: Optional[list] = None, *, sharding_types: Optional[list] = None):
        if fused_params is not None and not isinstance(fused_params, dict):
            raise TypeError(f"{type(self).__name__}(fused_params={fused_params!r}): must be a dict like "
                            f"{{'optimizer': EmbOptimType.EXACT_SGD, 'learning_rate': 0.1}} or None")
        self.fused_params = dict(fused_params) if fused_params else None
        self.qcomm_codecs_registry = qcomm_codecs_registry
        known = [t.value for t in ShardingType]
        chosen = [ShardingType(t).value for t in sharding_types] if sharding_types is not None else known
        self._types = [t for t in known if t in chosen]

    def sharding_types(self, compute_device_type: str = "cpu") -> list:
        """The sharding type values the module's tables may get (``ShardingType.X.value`` strings)."""
        return list(self._types)

    def compute_kernels(self, sharding_type: str = "", compute_device_type: str = "cpu") -> list:
        """Always ``["fused"]``: the optimizer runs inside backward on every table."""
        return ["fused"]

    def shardable_parameters(self, module) -> dict:
        """``{table: weight}`` of an unsharded ``module`` (TorchRec's)."""
        from ..shard_source import table_weight
        return {t.name: table_weight(module, t.name) for t in module.tables}

    def shard(self, module, params: dict, env=None, device=None, module_fqn: Optional[str] = None):
        """Collective: shard one unsharded ``module`` by ``params`` (``{table: ParameterSharding}``, e.g. a
        planner's ``plan.plan[""]``) over ``env``'s process group (TorchRec's signature). Optimizers as in
        DistributedModelParallel: per-table ``apply_optimizer_in_backward`` settings, else this sharder's
        ``fused_params``, else TorchRec's default SGD(lr=0.01), printed.

        Example:
            >>> import torch.distributed as dist
            >>> from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig, ShardingEnv, table_wise
            >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig(10, 4, "t", feature_names=["f"])])
            >>> sharder = EmbeddingBagCollectionSharder(fused_params={"learning_rate": 0.1})   # EXACT_SGD
            >>> sharder.shard(ebc, {"t": table_wise(0)}, ShardingEnv.from_process_group(dist.group.WORLD)).fused_optimizer
            FusedOptimizer(SGD(lr=0.1) for ['t'])
        """
        from ..model_parallel import _settings
        from ..shard_api import check_plan, shard_resolved
        from .sharding_env import mesh_for
        from ..topology import MeshTopology

        who = f"{type(self).__name__}.shard"
        if not isinstance(module, self.module_type):
            raise TypeError(f"{who}: expects an {self.module_type.__name__}, got {type(module).__name__}")
        check_plan(module, params)
        topo = MeshTopology.from_mesh(mesh_for(env, device, None, who))
        settings = _settings({"": module}, [self], None, {"": params}, who)[""]
        return shard_resolved(module, params, topo, settings, who)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(fused_params={self.fused_params}, sharding_types={self._types})"


class EmbeddingBagCollectionSharder(ModuleSharder):
    """Sharder of :class:`EmbeddingBagCollection` modules (TorchRec's signature)."""

    module_type = EmbeddingBagCollection


class EmbeddingCollectionSharder(ModuleSharder):
    """Sharder of :class:`EmbeddingCollection` modules (TorchRec's signature)."""

    module_type = EmbeddingCollection


def sharder_for(module, sharders: Optional[list], who: str) -> Optional[ModuleSharder]:
    """The sharder of ``module``'s type among ``sharders`` (None: defaults); a module type listed twice raises."""
    found = [s for s in (sharders or []) if type(module) is s.module_type or isinstance(module, s.module_type)]
    if len(found) > 1:
        raise ValueError(f"{who}: sharders {found} all apply to {type(module).__name__}; pass one per module type")
    return found[0] if found else None


def check_sharders(sharders: Any, who: str) -> list:
    if sharders is None:
        return []
    bad = [s for s in sharders if not isinstance(s, ModuleSharder)]
    if bad:
        raise TypeError(f"{who}: sharders must be EmbeddingBagCollectionSharder / EmbeddingCollectionSharder "
                        f"instances, got {bad}")
    return list(sharders)
