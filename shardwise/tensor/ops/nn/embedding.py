"""Embedding lookups (forward, dense backward, max-norm renorm) on sharded tables.

Layouts, per mesh dimension (weight, ids -> output):

* ``Shard(0), Replicate -> MaskPartial``: row-wise. Each rank rebases the ids to its own row block,
  looks up the ids it owns and writes zero rows for the others, so the output is an ordinary pending
  sum (one all-reduce or reduce-scatter when reduced). No mask is kept anywhere.
* ``Shard(1), Replicate -> Shard(-1)``: column-wise, no communication.
* ``Replicate, Shard(d) -> Shard(d)``: ids (batch) sharded, no communication.

The dense backward mirrors them: a row-wise table's gradient is ``Shard(0)`` computed locally from the
replicated ids and output gradient (no full-size table gradient, no communication). Ids are checked
against ``num_embeddings`` on every rank from data all ranks share, so all ranks raise together;
:func:`embedding_index_check` switches the check off for speed.

>>> import torch.nn.functional as F; from shardwise.tensor import Replicate, Shard, distribute_tensor, init_device_mesh
>>> mesh = init_device_mesh("cpu", (1,))
>>> w = distribute_tensor(torch.randn(10, 4), mesh, [Shard(0)])
>>> ids = distribute_tensor(torch.tensor([1, 9, 1]), mesh, [Replicate()])
>>> out = F.embedding(ids, w)             # MaskPartial: no communication yet
>>> out.placements
(MaskPartial(num_embeddings=10, mesh_dim=0),)
>>> torch.equal(out.full_tensor(), F.embedding(ids.full_tensor(), w.full_tensor()))   # one all-reduce
True
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.ops import aten

from ..._switch import Switch
from ...collectives import all_reduce
from ...placements import MaskPartial, Partial, Shard
from ...propagation.propagator import Decision, choose_layout
from ...propagation.registry import RuleEntry, register_rule
from ...propagation.schema import LocalPlan, Strategy
from ...spec import local_shape_and_offset
from ..common import LINEAR_PARTIALS, PSUM, R

__all__ = ["EmbeddingIndexError", "embedding_index_check", "rowwise_lookup", "rowwise_grad"]

_get_dispatch_mode = torch._C._get_dispatch_mode
_PROXY = torch._C._TorchDispatchModeKey.PROXY
_FAKE = torch._C._TorchDispatchModeKey.FAKE


class EmbeddingIndexError(IndexError, ValueError):
    """An id outside ``[0, num_embeddings)``; an IndexError like unsharded ``F.embedding``'s.

    Example: see :func:`embedding_index_check`'s.
    """


_CHECK = Switch("embedding_index_check", True)


def embedding_index_check(enabled: bool):
    """Turn the id range check of sharded lookups on or off inside a ``with`` block (in this thread or
    task only: other threads keep their own setting, on by default).

    The check costs a min/max over the ids (plus a one-element all-reduce when the ids are sharded).
    Without it an out-of-range id of a row-wise table silently reads a zero row. A compiled step
    (``DTensorExpandMode``) keeps the check in its graph, as it was set when the step was traced.

    >>> import torch.nn.functional as F; from shardwise.tensor import Replicate, Shard, distribute_tensor, init_device_mesh
    >>> mesh = init_device_mesh("cpu", (1,))
    >>> w = distribute_tensor(torch.ones(10, 2), mesh, [Shard(0)])
    >>> ids = distribute_tensor(torch.tensor([3, 10]), mesh, [Replicate()])
    >>> F.embedding(ids, w)
    Traceback (most recent call last):
    shardwise.tensor.ops.nn.embedding.EmbeddingIndexError: ...
    >>> with embedding_index_check(False):
    ...     out = F.embedding(ids, w)
    >>> out.full_tensor()                      # id 10 read a zero row, unnoticed
    tensor([[1., 1.],
            [0., 0.]])
    """
    return _CHECK.set(enabled)


def _check_ids(ids: torch.Tensor, num_embeddings: int, mesh, sharded_dims) -> torch.Tensor:
    """Raise EmbeddingIndexError on every rank when any id (on any rank) is out of range; returns the ids
    to look up. While a graph is recorded (``DTensorExpandMode``) the verdict cannot be read, so the
    check is recorded as an op that raises when the graph runs, and the lookup reads its output."""
    recording = _recording(ids)
    if ids.numel():
        lo, hi = torch.aminmax(ids)
        if not sharded_dims and not recording:
            # every rank holds the same ids, so the same verdict: two reads, nothing to combine
            _raise_if_out_of_range(-lo.item(), hi.item(), num_embeddings)
            return ids
        bounds = torch.stack((-lo, hi))  # both as maxima, so one max-reduce combines ranks
    else:
        bounds = torch.tensor([0, -1], device=ids.device)
    for m in sharded_dims:  # ranks holding different ids agree on the verdict
        bounds = all_reduce(bounds, "max", mesh, m)
    if recording:
        return torch.ops.shardwise.checked_embedding_ids(ids, bounds, num_embeddings)
    _raise_if_out_of_range(*bounds.tolist(), num_embeddings)
    return ids


def _raise_if_out_of_range(neg_lo: int, hi: int, num_embeddings: int) -> None:
    neg, over = max(neg_lo, 0), max(hi - (num_embeddings - 1), 0)
    if neg or over:
        value = -neg if neg else num_embeddings - 1 + over
        raise EmbeddingIndexError(
            f"embedding: id {value} is out of range for a table of num_embeddings={num_embeddings}; "
            f"ids must lie in [0, {num_embeddings - 1}]. Fix the ids (or the table size); "
            "nothing was looked up or modified"
        )


def _recording(ids: torch.Tensor) -> bool:
    # make_fx records the local kernels (its proxy mode is active); fake tensors hold no values; under
    # torch.compile the ids reach this kernel as functional wrappers of fake tensors, with the fake
    # mode active (AOT autograd), so their values cannot be read either
    return (isinstance(ids, FakeTensor) or _get_dispatch_mode(_PROXY) is not None
            or _get_dispatch_mode(_FAKE) is not None or torch.compiler.is_compiling())


@torch.library.custom_op("shardwise::checked_embedding_ids", mutates_args=())
def _checked_ids(ids: torch.Tensor, bounds: torch.Tensor, num_embeddings: int) -> torch.Tensor:
    """The id range check as one op of a recorded graph: it raises when the graph runs, as eager does.
    Returns a copy of the ids (an op may not return its input) that the lookup then reads, so nothing
    can drop the check or move the lookup before it."""
    _raise_if_out_of_range(*bounds.tolist(), num_embeddings)
    return ids.clone()


@_checked_ids.register_fake
def _checked_ids_fake(ids, bounds, num_embeddings):
    return torch.empty_like(ids)


def rowwise_lookup(weight: torch.Tensor, ids: torch.Tensor, offset: int) -> torch.Tensor:
    """Look up global ``ids`` in a row block ``weight`` holding rows ``[offset, offset + len)``; ids
    owned elsewhere give zero rows.

    Floating tables use one fused pass: a sum-mode embedding_bag of one id per bag weighted by the
    0/1 ownership mask (about 1.5x faster than a lookup then a mask multiply, 10x faster than
    ``masked_fill_``).

    >>> rowwise_lookup(torch.ones(2, 3), torch.tensor([0, 5, 6]), 5)[:, 0]
    tensor([0., 1., 1.])
    """
    rows, dim = weight.shape
    if rows == 0 or dim == 0:  # an empty row block, or an empty column block of a 2-D-sharded table
        return weight.new_zeros((*ids.shape, dim))
    local = ((ids - offset) if offset else ids).reshape(-1)
    flat = local.clamp(0, rows - 1)
    owned = flat == local  # clamping moved exactly the ids of other blocks
    if weight.is_floating_point():
        bags = torch.arange(flat.numel(), dtype=flat.dtype, device=flat.device)
        out = torch.embedding_bag(weight, flat, bags, False, 0, False, owned.to(weight.dtype))[0]
        return out.view(*ids.shape, dim)
    out = aten.embedding.default(weight, flat).mul_(owned.unsqueeze(1))
    return out.view(*ids.shape, dim)


# --- forward ----------------------------------------------------------------------------------

def _embedding_strategies(schema, mesh_size) -> list[Strategy]:
    weight, ids = schema.tensor_args[0], schema.tensor_args[1]
    v = weight.shape[0]
    st = [
        Strategy((R,), (R, R)),
        Strategy((MaskPartial(v, 0),), (Shard(0), R)),
        Strategy((Shard(ids.ndim),), (Shard(1), R)),
    ]
    st += [Strategy((Shard(d),), (R, Shard(d))) for d in range(ids.ndim)]
    st += [Strategy((p,), (p, R)) for p in LINEAR_PARTIALS]
    return st


def _validate_options(schema) -> None:
    # scale_grad_by_freq needs no check: the backward rule keeps every id where frequencies are counted
    if schema.arg(4, "sparse", False):
        raise ValueError(
            "embedding(sparse=True) is not supported on a DTensor table (sharded tables keep dense, "
            "locally computed gradients); use sparse=False"
        )
    if schema.tensor_args[0].ndim != 2:
        raise ValueError(
            f"embedding: weight of shape {tuple(schema.tensor_args[0].shape)} is not a 2-D "
            "(num_embeddings, dim) table; pass a 2-D weight"
        )


def embedding_rule(schema, mesh_shape) -> Decision:
    """Whole-mesh rule: per-dim strategies, then MaskPartial names the mesh dim it sums over."""
    _validate_options(schema)
    d = choose_layout(schema, RuleEntry(_embedding_strategies), mesh_shape, False)
    d.outputs = [
        None if o is None else tuple(
            MaskPartial(p.num_embeddings, m) if isinstance(p, MaskPartial) else p for m, p in enumerate(o)
        )
        for o in d.outputs
    ]
    return d


def _layout(schema, decision, i):
    return decision.inputs[i] or schema.tensor_args[i].placements


def _row_block(shape, mesh, coord, placements) -> tuple[int, bool]:
    """(first global row, whether any mesh dim splits rows) of this rank's block."""
    _, offset = local_shape_and_offset(shape, tuple(mesh.shape), coord, placements)
    return offset[0], any(type(p) is Shard and p.dim == 0 for p in placements)


def _embedding_local(schema, decision, out_specs, mesh, coord) -> Optional[LocalPlan]:
    w_pl, ids_pl = _layout(schema, decision, 0), _layout(schema, decision, 1)
    v = schema.tensor_args[0].shape[0]
    offset, rowwise = _row_block(schema.tensor_args[0].shape, mesh, coord, w_pl)
    sharded = tuple(m for m, p in enumerate(ids_pl) if type(p) is Shard)

    def kernel(op, args, kwargs):
        weight, ids = args[0], args[1]
        if _CHECK.get():
            ids = _check_ids(ids, v, mesh, sharded)
        if rowwise:
            return rowwise_lookup(weight, ids, offset)
        return op(weight, ids, *args[2:], **kwargs)

    return LocalPlan(kernel=kernel)


register_rule(aten.embedding.default, local=_embedding_local, whole_mesh=True)(embedding_rule)


# --- backward ---------------------------------------------------------------------------------

def _backward_strategies(schema, mesh_size) -> list[Strategy]:
    grad, ids = schema.tensor_args[0], schema.tensor_args[1]
    scale = schema.arg(4, "scale_grad_by_freq", False)
    # row-wise first: with replicated ids and gradient it ties with Replicate, and a sharded table's
    # gradient must stay sharded (a replicated table still gets a correct, sharded gradient)
    st = [
        Strategy((Shard(0),), (R, R)),
        Strategy((R,), (R, R)),
        Strategy((Shard(1),), (Shard(grad.ndim - 1), R)),
    ]
    if not scale:  # frequencies need every id: sharded ids would count only a local share
        st += [Strategy((PSUM,), (Shard(d), Shard(d))) for d in range(ids.ndim)]
    return st


def embedding_backward_rule(schema, mesh_shape) -> Decision:
    """(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq) -> grad_weight.

    A pending (Partial) output gradient is reduced first, then handled like a replicated one: an
    all-reduce of ``ids x dim`` values beats leaving a pending ``num_embeddings x dim`` gradient."""
    grad = schema.tensor_args[0]
    pending = grad.placements is not None and any(isinstance(p, Partial) for p in grad.placements)
    if not pending:
        return choose_layout(schema, RuleEntry(_backward_strategies), mesh_shape, False)
    reduced = tuple(R if isinstance(p, Partial) else p for p in grad.placements)
    as_reduced = replace(schema, tensor_args=[replace(grad, placements=reduced)] + schema.tensor_args[1:])
    d = choose_layout(as_reduced, RuleEntry(_backward_strategies), mesh_shape, False)
    if d.inputs[0] is None:
        d.inputs[0] = reduced
    return d


def rowwise_grad(grad: torch.Tensor, ids: torch.Tensor, offset: int, rows: int, padding_idx: int = -1,
                 scale_grad_by_freq: bool = False) -> torch.Tensor:
    """The ``(rows, dim)`` gradient of the row block ``[offset, offset + rows)`` of a table looked up
    with global ``ids``; ``padding_idx`` is global (-1: none).

    >>> rowwise_grad(torch.ones(3, 2), torch.tensor([0, 5, 5]), 4, 2)
    tensor([[0., 0.],
            [2., 2.]])
    """
    # ids owned elsewhere become the kernel's padding id, which it skips without touching the gradient
    # (adding their rows and dropping them costs as much as the owned ones, on every rank): the
    # block's own padding row when it holds the global padding_idx (that row's gradient stays zero
    # anyway, and frequencies only scale the other ids), else one extra scratch row, dropped after
    if rows == 0:
        return grad.new_zeros((0, grad.shape[-1]))
    local = (ids - offset) if offset else ids
    pad = padding_idx - offset if padding_idx >= 0 and offset <= padding_idx < offset + rows else rows
    local = torch.where(local.clamp(0, rows - 1) == local, local, pad)
    if pad < rows:
        return aten.embedding_dense_backward.default(grad, local, rows, pad, scale_grad_by_freq)
    return aten.embedding_dense_backward.default(grad, local, rows + 1, pad, scale_grad_by_freq)[:rows]


def _backward_local(schema, decision, out_specs, mesh, coord) -> Optional[LocalPlan]:
    spec = out_specs[0]
    offset, rowwise = _row_block(spec.shape, mesh, coord, spec.placements)
    if not rowwise:
        return None
    rows = spec.local_shape(coord)[0]

    def kernel(op, args, kwargs):
        grad, ids, _, pad, scale = args[:5]
        return rowwise_grad(grad, ids, offset, rows, pad, scale)

    return LocalPlan(kernel=kernel)


register_rule(aten.embedding_dense_backward.default, local=_backward_local, whole_mesh=True)(embedding_backward_rule)


# --- max_norm ---------------------------------------------------------------------------------

def _renorm_rule(schema, mesh_size):
    # (weight!, ids, max_norm, norm_type): a row's norm needs the whole row, so no column sharding
    if any(type(p) is Shard and p.dim == 1 for p in schema.tensor_args[0].placements or ()):
        raise ValueError(
            "embedding(max_norm=...) on a column-wise (Shard(1)) table: a row's norm spans every rank's "
            "columns; use max_norm=None or shard the table row-wise (Shard(0))"
        )
    return [Strategy((Shard(0),), (Shard(0), R)), Strategy((R,), (R, R))]


def _renorm_local(schema, decision, out_specs, mesh, coord) -> Optional[LocalPlan]:
    w = schema.tensor_args[0]
    v = w.shape[0]
    offset, rowwise = _row_block(w.shape, mesh, coord, w.placements)
    rows = out_specs[0].local_shape(coord)[0]

    def kernel(op, args, kwargs):
        weight, ids = args[0], args[1]
        if _CHECK.get():
            ids = _check_ids(ids, v, mesh, ())
        if rowwise:
            local = ids - offset
            ids = local[(local >= 0) & (local < rows)]
        return op(weight, ids, *args[2:], **kwargs)

    return LocalPlan(kernel=kernel)


register_rule(aten.embedding_renorm_.default, local=_renorm_local)(_renorm_rule)
