"""Matrix products, with strategies generated from einsum strings (a new op is one line)."""

from __future__ import annotations

from torch.ops import aten

from ...placements import Shard
from ...propagation.registry import register_rule
from ...propagation.schema import Strategy
from ..common import LINEAR_PARTIALS, PSUM, R, broadcast_placement

__all__ = ["einsum_strategies"]


def einsum_strategies(equation: str) -> list[tuple[tuple, object]]:
    """One-mesh-dim strategies of a product ``"mk,kn->mn"``: (input placements, output placement).

    Batch and free letters shard inputs and output alike; a contracted letter gives a pending sum; a
    partial operand times replicated ones stays partial."""
    lhs, out = equation.split("->")
    ins = lhs.split(",")
    letters = sorted(set("".join(ins)) | set(out), key=lambda c: ("".join(ins) + out).index(c))
    result = [(tuple(R for _ in ins), R)]
    for c in letters:
        placed = tuple(Shard(s.index(c)) if c in s else R for s in ins)
        result.append((placed, Shard(out.index(c)) if c in out else PSUM))
    for i in range(len(ins)):
        for p in LINEAR_PARTIALS:
            result.append((tuple(p if j == i else R for j in range(len(ins))), p))
    return result


def _rule_for(equation: str):
    table = einsum_strategies(equation)

    def rule(schema, mesh_size):
        return [Strategy((outp,), ins) for ins, outp in table]

    return rule


register_rule(aten.mm.default)(_rule_for("mk,kn->mn"))
register_rule(aten.bmm.default)(_rule_for("bmk,bkn->bmn"))
register_rule(aten.dot.default)(_rule_for("k,k->"))
register_rule(aten.mv.default)(_rule_for("mk,k->m"))


_MM_TABLE = einsum_strategies("mk,kn->mn")


@register_rule(aten.addmm.default)
def addmm_rule(schema, mesh_size):
    # out = beta * bias + alpha * (m1 @ m2): the bias follows the output by broadcasting
    bias = schema.tensor_args[0]
    out_shape = schema.outputs[0].shape
    strategies = []
    for (a, b), outp in _MM_TABLE:
        strategies.append(Strategy((outp,), (broadcast_placement(outp, bias, out_shape), a, b)))
    return strategies


@register_rule(aten.baddbmm.default)
def baddbmm_rule(schema, mesh_size):
    bias = schema.tensor_args[0]
    out_shape = schema.outputs[0].shape
    return [
        Strategy((outp,), (broadcast_placement(outp, bias, out_shape), a, b))
        for (a, b), outp in einsum_strategies("bmk,bkn->bmn")
    ]
