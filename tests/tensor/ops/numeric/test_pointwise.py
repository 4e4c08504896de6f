"""Pointwise ops read from torch's tags: every tagged aten op has a rule, and the ops run on gloo ranks
(a pending sum is reduced first for a non-linear op) with the full-tensor values."""

from __future__ import annotations

import torch
from torch.ops import aten

from shardwise.testing import run_on_ranks, worker_mesh


def test_every_op_torch_tags_pointwise_has_a_rule():
    from shardwise.tensor.ops.numeric.pointwise import tagged_pointwise_ops
    from shardwise.tensor.propagation import lookup_rule

    assert tagged_pointwise_ops() == []  # all taken at import
    for op in (aten.hardswish.default, aten.mish.default, aten.xlogy.Tensor, aten.isinf.default,
               aten.softplus.default, aten.elu_backward.default, aten.acos.default, aten.logit.default):
        assert lookup_rule(op) is not None, op


def pointwise_on_ranks(rank, world):
    import torch.nn.functional as F

    from shardwise.tensor import DTensor, Partial, Shard, distribute_tensor

    mesh = worker_mesh((world,))
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))
    fns = [F.hardswish, F.mish, F.softplus, torch.isinf, torch.acos, torch.special.erfcx,
           lambda v: torch.xlogy(v, v.abs() + 1), lambda v: torch.maximum(v, v * 0.5)]
    bad = []
    for pl in (Shard(0), Shard(1), Partial("sum")):
        # a pending sum: each rank holds x / world
        d = DTensor.from_local(x / world, mesh, [pl], run_check=False) if pl.is_partial() else \
            distribute_tensor(x, mesh, [pl])
        for i, fn in enumerate(fns):
            want, got = fn(x), fn(d).full_tensor()
            if not torch.allclose(got, want, atol=1e-5, equal_nan=True):
                bad.append((i, str(pl)))
    return bad


def test_tagged_pointwise_ops_match_full_tensor_ops_on_two_ranks():
    assert run_on_ranks(pointwise_on_ranks, 2) == [[], []]
