"""Scaled dot-product attention sharded over batch or heads, forward and backward.

``F.scaled_dot_product_attention`` reaches dispatch as one fused op per backend: on CPU
``_scaled_dot_product_flash_attention_for_cpu`` (and its ``_backward``), on CUDA the flash, efficient
and cuDNN kernels. Attention mixes positions within one (batch, head) pair only, so q, k, v, the
output, its gradient and the log-sum-exp may all be sharded on the batch dim (0) or the head dim
(1) and every rank runs the kernel on its own pairs; gradients come out with the same placement, and
no collective runs. PyTorch's DTensor has rules for the CUDA kernels only.

* A mask / bias broadcast to ``(B, H, L, S)`` follows the sharded dim when it has that dim at full
  size, else stays replicated (a ``(L, S)`` causal mask, a ``(B, 1, L, S)`` padding mask under head
  sharding). On CPU the mask is a keyword argument, which the dispatcher does not move; the local
  kernel moves it (see ``_mask_local``).
* Grouped-query attention (fewer k/v heads): head sharding needs the k/v head count divisible by the
  mesh size, so each rank's query heads map onto its own k/v heads.
* ``dropout_p > 0`` runs replicated: a fused kernel's dropout cannot draw the slice of the unsharded
  call's random numbers. (On CPU a dropout call does not reach these ops at all: it decomposes into
  matmul/softmax/dropout, each with its own rule.)

>>> import torch, torch.nn.functional as F
>>> from shardwise.tensor import Shard, distribute_tensor, init_device_mesh
>>> q = torch.randn(2, 4, 8, 16)
>>> dq = distribute_tensor(q, init_device_mesh("cpu", (1,)), [Shard(1)])
>>> out = F.scaled_dot_product_attention(dq, dq, dq, is_causal=True)
>>> out.placements, torch.allclose(out.full_tensor(), F.scaled_dot_product_attention(q, q, q, is_causal=True))
((Shard(dim=1),), True)
"""

from __future__ import annotations

import torch
from torch.ops import aten

from ...placements import Replicate, Shard
from ...propagation.registry import register_rule
from ...propagation.schema import LocalPlan, Strategy, TensorArg
from ...redistribute import execute_plan, plan_redistribute
from ..common import R, broadcast_placement, replicate_strategy

__all__ = ["attention_rule", "ATTENTION_OPS", "CUDA_ATTENTION_OPS"]

# tensors laid out (B, H, L, E) or (B, H, L): sharded with the attention dim
_ACTIVATIONS = frozenset({"query", "key", "value", "grad_out", "grad_out_", "out", "logsumexp"})
# broadcast to (B, H, L, S): follow the sharded dim where they have it at full size
_BIASES = frozenset({"attn_mask", "attn_bias"})

ATTENTION_OPS = [
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_flash_attention_backward.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_efficient_attention_backward.default,
    aten._scaled_dot_product_cudnn_attention.default,
    aten._scaled_dot_product_cudnn_attention_backward.default,
]
CUDA_ATTENTION_OPS = ATTENTION_OPS[2:]


def _named_args(schema) -> dict:
    """The op's arguments by schema name (positional or keyword)."""
    named = {}
    for i, a in enumerate(schema.op._schema.arguments):
        named[a.name] = schema.args[i] if i < len(schema.args) else schema.kwargs.get(a.name, a.default_value)
    return named


def _heads_line_up(q: TensorArg, k: TensorArg, n: int) -> bool:
    # torch.chunk of equal head counts lines up; with grouped k/v heads each rank's query heads must
    # map onto its own k/v heads, which needs whole groups per rank
    return q.shape[1] == k.shape[1] or k.shape[1] % n == 0


def _sharded(schema, named: dict, d: int):
    """The strategy sharding dim ``d`` (0 batch, 1 heads), or None where the inputs do not allow it."""
    q = named["query"]
    size = q.shape[d]
    ins = []
    for ta in schema.tensor_args:
        name = next(k for k, v in named.items() if v is ta)
        if name in _ACTIVATIONS:
            if d == 0 and ta.shape[0] != size:
                return None
            ins.append(Shard(d))
        elif name in _BIASES:
            # None: the CPU mask is a keyword argument the local kernel moves (see _mask_local)
            ins.append(broadcast_placement(Shard(d), ta, (*q.shape[:3], ta.shape[-1])) if name == "attn_bias" else None)
        else:  # rng state, cumulative sequence lengths: the same on every rank
            ins.append(R)
    outs = []
    for meta in schema.outputs:
        if meta is None:
            outs.append(None)
        elif meta.ndim >= 3 and meta.shape[d] > 0:
            if meta.ndim == 4 and meta.shape[d] != size and meta.shape[d] != named["key"].shape[d]:
                return None  # a bias gradient broadcast over the sharded dim would be a pending sum
            outs.append(Shard(d))
        else:
            outs.append(R)
    return Strategy(tuple(outs), tuple(ins))


def attention_rule(schema, mesh_size):
    named = _named_args(schema)
    strategies = [replicate_strategy(schema)]
    if (named.get("dropout_p") or 0.0) > 0.0:
        return strategies
    for d in (0, 1):
        if d == 1 and not _heads_line_up(named["query"], named["key"], mesh_size):
            continue
        st = _sharded(schema, named, d)
        if st is not None:
            strategies.append(st)
    return strategies


def _attention_local(schema, decision, out_specs, mesh, coord):
    """Move a keyword mask to the layout the query's needs (``_mask_steps``), and on a rank whose piece
    holds no (batch, head) pair return empty outputs: torch's CPU kernel divides by the head count. That
    rank still joins the mask's collectives."""
    if coord is None:
        return None
    mask = _mask_steps(schema, decision, mesh)
    empty = any(s is not None and 0 in s.local_shape(coord) for s in out_specs)
    if mask is None and not empty:
        return None
    shapes = [None if s is None else (s.local_shape(coord), s.dtype) for s in out_specs]

    def kernel(op, args, kwargs):
        if mask is not None:  # the dispatcher unwraps positional arguments only
            steps, shape, current = mask
            local = getattr(kwargs["attn_mask"], "_local_tensor", kwargs["attn_mask"])
            local = execute_plan(local, steps, mesh, shape, current, coord) if steps else local
            kwargs = {**kwargs, "attn_mask": local}
        if not empty:
            return op(*args, **kwargs)
        dev = args[0].device
        return tuple(0 if s is None else torch.empty(s[0], dtype=s[1], device=dev) for s in shapes)

    return LocalPlan(kernel=kernel)


def _mask_steps(schema, decision, mesh):
    """(steps, global shape, current placements) moving a keyword mask where the layout needs it: each mesh
    dim sharding dim d of the query shards the mask's matching dim when the mask has it at full size;
    otherwise the mask is replicated. None: a plain mask that stays whole."""
    mask = schema.kwargs.get("attn_mask")
    if not isinstance(mask, TensorArg):
        return None
    q = schema.tensor_args[0]
    q_pl = decision.inputs[0] or q.placements
    current = mask.placements or tuple(Replicate() for _ in q_pl)
    full_shape = (*q.shape[:3], mask.shape[-1])
    want = tuple(broadcast_placement(p, mask, full_shape) if type(p) is Shard else R for p in q_pl)
    steps = plan_redistribute(current, want, tuple(mesh.shape), mask.ndim)
    return (steps, mask.shape, current) if steps or mask.placements is not None else None


register_rule(*ATTENTION_OPS, local=_attention_local)(attention_rule)
