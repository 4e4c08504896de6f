"""TorchRec's plan containers (``torchrec.distributed.types``): a :class:`ShardingPlan` maps each
sharded module's path to an :class:`EmbeddingModuleShardingPlan`, a dict of table name ->
:class:`~shardwise.embedding.plan.ParameterSharding` (shardwise's own, which ``shard()`` and
``DistributedModelParallel`` take).

Example:
    >>> from shardwise.embedding.plan import row_wise, table_wise
    >>> plan = ShardingPlan({"ebc": EmbeddingModuleShardingPlan({"t1": table_wise(1), "t2": row_wise()})})
    >>> plan.plan["ebc"]["t1"].sharding_type == "table_wise", plan.get_plan_for_module("ebc")["t1"].ranks
    (True, (1,))
    >>> print(plan)
    module: ebc
    param | sharding type | compute kernel | ranks
    ----- | ------------- | -------------- | -----
    t1    | table_wise    | fused          | [1]
    t2    | row_wise      | fused          | all
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .values import ParameterSharding

__all__ = ["EmbeddingModuleShardingPlan", "ShardingPlan"]


def _table(rows: list) -> list:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return lines[:1] + [" | ".join("-" * w for w in widths)] + lines[1:]


class EmbeddingModuleShardingPlan(dict):
    """``{table name: ParameterSharding}`` for one module (TorchRec's per-module plan is this dict)."""

    def __str__(self) -> str:
        rows = [("param", "sharding type", "compute kernel", "ranks")]
        for name, ps in self.items():
            ranks = "all" if ps.ranks is None else str(list(ps.ranks))
            if ps.host_index is not None:
                ranks = f"host {ps.host_index}"
            rows.append((name, ps.sharding_type.value, ps.compute_kernel, ranks))
        return "\n".join(_table(rows))


@dataclass
class ShardingPlan:
    """``plan``: ``{module path: EmbeddingModuleShardingPlan}`` (``""`` for a collection that is the
    planned module itself). ``DistributedModelParallel(model, plan=...)`` takes it."""

    plan: dict = field(default_factory=dict)

    def __post_init__(self):
        for path, per_module in self.plan.items():
            for name, ps in dict(per_module).items():
                if not isinstance(ps, ParameterSharding):
                    raise TypeError(f"ShardingPlan: plan[{path!r}][{name!r}] must be a ParameterSharding "
                                    f"(table_wise(0), row_wise(), ...), got {type(ps).__name__}")
            if not isinstance(per_module, EmbeddingModuleShardingPlan):
                self.plan[path] = EmbeddingModuleShardingPlan(per_module)

    def get_plan_for_module(self, module_path: str) -> Optional[EmbeddingModuleShardingPlan]:
        return self.plan.get(module_path)

    def __str__(self) -> str:
        return "\n\n".join(f"module: {path}\n{per_module}" for path, per_module in self.plan.items())
