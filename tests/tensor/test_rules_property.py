"""Property tests: on random shapes and mesh sizes, every strategy of the binary pointwise, view and
reduction rules agrees with the op on full tensors (checked by the rule validator on simulated ranks)."""

from __future__ import annotations

from math import prod

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.ops import aten

from shardwise.tensor.validate import Sample, validate_rules

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# 1-D meshes, and 2-D ones where shards of one dim nest
mesh_sizes = st.one_of(st.integers(2, 4), st.tuples(st.integers(2, 3), st.integers(2, 3)))
dims = st.integers(1, 6)
seeds = st.integers(0, 2**16)


def _check(op, sample: Sample, n: int) -> None:
    rep = validate_rules([op], world_sizes=(n,), samples={op: [sample]})
    assert rep.ok, "\n".join(str(f) for f in rep.failures)
    assert rep.ops[str(op)].checked > 0


def _randn(shape, seed: int, positive: bool = False) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    t = torch.randn(tuple(shape), generator=gen)
    return t.abs() + 0.5 if positive else t


# --- binary pointwise with broadcasting ------------------------------------------------------------

@st.composite
def broadcast_shapes(draw):
    """An output shape and two operand shapes broadcasting to (a suffix of) it."""
    out = draw(st.lists(dims, min_size=1, max_size=3))

    def operand():
        kept = out[len(out) - draw(st.integers(0, len(out))):]
        return [1 if draw(st.booleans()) and draw(st.booleans()) else d for d in kept]

    return operand(), operand()


_BINARY = [aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor, aten.maximum.default,
           aten.atan2.default, aten.eq.Tensor, aten.lt.Tensor, aten.pow.Tensor_Tensor, aten.rsub.Tensor]


@SETTINGS
@given(st.sampled_from(_BINARY), broadcast_shapes(), mesh_sizes, seeds)
def test_binary_pointwise_strategies_agree(op, shapes, n, seed):
    positive = op in (aten.div.Tensor, aten.pow.Tensor_Tensor)
    a, b = shapes
    x, y = _randn(a, seed, positive), _randn(b, seed + 1, positive)
    if op in (aten.eq.Tensor, aten.lt.Tensor):  # integer-valued floats so ties occur
        x, y = x.round(), y.round()
    _check(op, Sample((x, y)), n)


@SETTINGS
@given(st.sampled_from([aten.add_.Tensor, aten.mul_.Tensor, aten.div_.Tensor]), broadcast_shapes(), mesh_sizes,
       seeds)
def test_inplace_binary_strategies_agree(op, shapes, n, seed):
    a, b = shapes
    out = list(torch.broadcast_shapes(tuple(a), tuple(b)))
    _check(op, Sample((_randn(out, seed), _randn(b, seed + 1, positive=True))), n)


# --- views --------------------------------------------------------------------------------------------

def _prime_factors(n: int) -> list:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


@st.composite
def reshape_pairs(draw):
    """A shape and another with the same number of elements: its prime factors regrouped (in order, so
    dims merge and split as real reshapes do, or shuffled), with size-1 dims sprinkled in."""
    shape = draw(st.lists(dims, min_size=1, max_size=4))
    factors = _prime_factors(prod(shape))
    if draw(st.booleans()):
        factors = draw(st.permutations(factors))
    out = []
    for f in factors:
        if out and draw(st.booleans()):
            out[-1] *= f
        else:
            out.append(f)
    for _ in range(draw(st.integers(0, 2))):
        out.insert(draw(st.integers(0, len(out))), 1)
    if not out:
        out = [1]
    if draw(st.booleans()):
        out[draw(st.integers(0, len(out) - 1))] = -1
    return shape, out


@SETTINGS
@given(st.sampled_from([aten.view.default, aten.reshape.default, aten._unsafe_view.default]), reshape_pairs(),
       mesh_sizes, seeds)
def test_view_strategies_agree(op, pair, n, seed):
    shape, out = pair
    _check(op, Sample((_randn(shape, seed), out)), n)


# --- reductions ---------------------------------------------------------------------------------------

@st.composite
def reductions(draw):
    shape = draw(st.lists(dims, min_size=1, max_size=3))
    chosen = draw(st.lists(st.integers(0, len(shape) - 1), unique=True, max_size=len(shape)))
    signed = [d - len(shape) if draw(st.booleans()) else d for d in chosen]
    return shape, signed, draw(st.booleans())


@SETTINGS
@given(st.sampled_from([aten.sum.dim_IntList, aten.mean.dim, aten.amax.default, aten.amin.default]), reductions(),
       mesh_sizes, seeds)
def test_reduction_strategies_agree(op, case, n, seed):
    shape, dims_, keepdim = case
    if op is aten.mean.dim and not dims_:
        dims_ = None  # mean.dim needs an explicit (possibly None) dim list
    x = _randn(shape, seed)
    if op in (aten.amax.default, aten.amin.default):
        x = x.round()  # ties between ranks
    _check(op, Sample((x, dims_, keepdim)), n)
