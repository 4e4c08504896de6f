"""A sharding plan as JSON: what a checkpoint's meta and the report hold (no training loop needed).

Example:
    >>> from shardwise.embedding import ParameterSharding, ShardingType
    >>> raw = plan_to_json({"t_C1": ParameterSharding(ShardingType.ROW_WISE, None, None)})
    >>> raw, plan_from_json(raw) == {"t_C1": ParameterSharding(ShardingType.ROW_WISE, None, None)}
    ({'t_C1': {'type': 'row_wise', 'ranks': None, 'host': None}}, True)
"""

from __future__ import annotations

from ..embedding import ParameterSharding, ShardingType

__all__ = ["plan_to_json", "plan_from_json"]


def plan_to_json(plan: dict) -> dict:
    """``{table: ParameterSharding}`` -> ``{table: {"type", "ranks", "host"}}``."""
    return {t: {"type": ps.sharding_type.value, "ranks": None if ps.ranks is None else list(ps.ranks),
                "host": ps.host_index} for t, ps in plan.items()}


def plan_from_json(raw: dict) -> dict:
    """The inverse of :func:`plan_to_json`."""
    return {t: ParameterSharding(ShardingType(v["type"]), None if v["ranks"] is None else tuple(v["ranks"]),
                                 v["host"]) for t, v in raw.items()}
