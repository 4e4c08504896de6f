"""Choose a layout for one op call: apply the op's one-mesh-dim rule to every mesh dimension and pick,
per dimension, the valid strategy whose input redistributions cost least."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..placements import MaskPartial, Partial, Placement, Replicate
from ..redistribute import transition_cost
from .registry import RuleEntry
from .schema import OpSchema, Strategy

__all__ = ["Decision", "choose_layout", "op_mutates_first_arg"]


@dataclass
class Decision:
    """Full-mesh layout: per tensor arg the placements it must have (None: leave as is), per output
    the placements it will have (None: not a tensor)."""

    inputs: list[Optional[tuple[Placement, ...]]]
    outputs: list[Optional[tuple[Placement, ...]]]


def op_mutates_first_arg(op) -> bool:
    args = op._schema.arguments
    return bool(args) and args[0].alias_info is not None and args[0].alias_info.is_write


def _renumbers(op) -> bool:
    return torch.Tag.inplace_view in op.tags


def _nbytes(t) -> float:
    n = 1
    for s in t.shape:
        n *= s
    return float(n * t.dtype.itemsize)


def _strategy_cost(schema: OpSchema, st: Strategy, mdim: int, n: int, inplace: bool) -> Optional[float]:
    """Cost of ``st`` on mesh dim ``mdim``; None when it is not valid for these inputs."""
    if len(st.inputs) != len(schema.tensor_args):
        raise AssertionError(f"rule for {schema.op} gave {len(st.inputs)} inputs, op has {len(schema.tensor_args)}")
    total = 0.0
    for ta, req in zip(schema.tensor_args, st.inputs):
        if req is None:
            continue
        if ta.placements is None:  # a plain scalar tensor is replicated by definition
            if type(req) is not Replicate:
                return None
            continue
        cur = ta.placements[mdim]
        if inplace and ta.index == 0 and cur != req and not (isinstance(cur, MaskPartial) and req == Partial()):
            return None
        total += transition_cost(cur, req, _nbytes(ta), n)
    # an in-place view op (squeeze_, t_) renumbers its argument's dims: its placements may follow
    if inplace and schema.tensor_args and schema.tensor_args[0].placements is not None and not _renumbers(schema.op):
        if st.outputs and st.outputs[0] is not None and st.outputs[0] != schema.tensor_args[0].placements[mdim]:
            if not (isinstance(schema.tensor_args[0].placements[mdim], MaskPartial) and st.outputs[0] == Partial()):
                return None
    return total


def choose_layout(schema: OpSchema, entry: RuleEntry, mesh_shape: tuple[int, ...], inplace: bool) -> Decision:
    if entry.whole_mesh:
        return entry.rule(schema, mesh_shape)
    chosen: list[Strategy] = []
    by_size: dict[int, list[Strategy]] = {}
    for mdim, n in enumerate(mesh_shape):
        if n not in by_size:
            by_size[n] = entry.rule(schema, n)
        best, best_cost = None, None
        for st in by_size[n]:
            cost = _strategy_cost(schema, st, mdim, n, inplace)
            if cost is not None and (best_cost is None or cost < best_cost):
                best, best_cost = st, cost
        if best is None:
            placements = [None if t.placements is None else str(t.placements[mdim]) for t in schema.tensor_args]
            hint = " (an in-place op keeps its first argument's placement)" if inplace else ""
            raise NotImplementedError(
                f"{schema.op}: no sharding strategy for input placements {placements} on mesh dim {mdim}"
                f"{hint}; redistribute the inputs (e.g. to Replicate()) first"
            )
        chosen.append(best)
    n_in, n_out = len(schema.tensor_args), schema.num_outputs
    inputs: list = []
    for a in range(n_in):
        ta = schema.tensor_args[a]
        if ta.placements is None:
            inputs.append(None)
            continue
        req = tuple(ta.placements[m] if chosen[m].inputs[a] is None else chosen[m].inputs[a] for m in range(len(chosen)))
        inputs.append(None if req == ta.placements else req)
    outputs = [
        None if schema.outputs[o] is None else tuple(chosen[m].outputs[o] for m in range(len(chosen)))
        for o in range(n_out)
    ]
    return Decision(inputs, outputs)
