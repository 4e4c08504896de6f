"""The styles' torch semantics: plain inputs are even pieces (no collective to learn their size) unless
``uneven_shards=True``; SequenceParallel, PrepareModuleOutput, ``src_data_rank``; checked against plain
PyTorch and by counting the collectives each forward issues."""

import pytest
import torch
from torch import nn

from shardwise.parallel import (
    ColwiseParallel, PrepareModuleInput, PrepareModuleOutput, RowwiseParallel, SequenceParallel,
    parallelize_module,
)
from shardwise.tensor import CollectiveCounter, DTensor, Partial, Replicate, Shard, distribute_tensor
from shardwise.testing import run_on_ranks, worker_mesh


def _forward_counts(rank, world):
    mesh = worker_mesh((world,))
    torch.manual_seed(0)
    out = {}
    x = torch.randn(4, 3, 5)
    col, row = nn.Linear(5, 6), nn.Linear(5, 6)  # 5 input features on 2 ranks: uneven 3 + 2
    want_col, want_row = col(x), row(x)
    parallelize_module(col, mesh, ColwiseParallel(output_layouts=Replicate()))
    parallelize_module(row, mesh, RowwiseParallel())
    with CollectiveCounter() as c:
        y = col(x)  # replicated input: nothing to learn
    out["colwise"] = c.counts
    torch.testing.assert_close(y, want_col)
    with CollectiveCounter() as c:
        y = row(x.tensor_split(world, -1)[rank])  # the module knows in_features: no size all-reduce
    out["rowwise_uneven_features"] = c.counts
    torch.testing.assert_close(y, want_row)
    return out


def test_default_forward_issues_no_extra_collectives():
    out = run_on_ranks(_forward_counts, 2)[0]
    assert out["colwise"] == {"all_gather": 1}  # only the requested Shard(-1) -> Replicate output
    assert out["rowwise_uneven_features"] == {"all_reduce": 1}  # only the partial sum


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def _sequence_parallel(rank, world, seq, uneven):
    mesh = worker_mesh((world,))
    torch.manual_seed(0)
    out = {}
    x = torch.randn(2, seq, 4)
    for name, ref in [("layernorm", nn.LayerNorm(4)), ("rmsnorm", RMSNorm(4))]:
        model = parallelize_module(type(ref)(4), mesh, SequenceParallel(uneven_shards=uneven))  # same init
        want = ref(x)
        want.sum().backward()
        with CollectiveCounter() as c:
            y = model(x.tensor_split(world, 1)[rank])
        out[name] = c.counts
        assert isinstance(y, DTensor) and y.placements == (Shard(1),), y
        torch.testing.assert_close(y.full_tensor(), want)
        y.sum().backward()
        assert model.weight.grad.placements == (Partial(),), model.weight.grad.placements
        torch.testing.assert_close(model.weight.grad.full_tensor(), ref.weight.grad)
    # a DTensor input sharded elsewhere is moved to the sequence dim
    model = parallelize_module(RMSNorm(4), mesh, SequenceParallel(use_local_output=True))
    y = model(distribute_tensor(x, mesh, [Shard(0)]))
    torch.testing.assert_close(y, RMSNorm(4)(x).tensor_split(world, 1)[rank])
    return out


def test_sequence_parallel_even_pieces_without_communication():
    out = run_on_ranks(_sequence_parallel, 2, 4, False)[0]
    assert out == {"layernorm": {}, "rmsnorm": {}}


def test_sequence_parallel_uneven_pieces_opt_in():
    # 3 positions on 2 ranks: one size all-reduce per forward, which is what the opt-in costs
    out = run_on_ranks(_sequence_parallel, 2, 3, True)[0]
    assert out == {"layernorm": {"all_reduce": 1}, "rmsnorm": {"all_reduce": 1}}


class _Pair(nn.Module):
    def forward(self, x):
        return x * 2, "tag", x + 1


def _prepare_output(rank, world):
    mesh = worker_mesh((world,))
    out = {}
    full = torch.arange(12.0).view(4, 3)
    style = PrepareModuleOutput(output_layouts=(Replicate(), None, Shard(0)),
                                desired_output_layouts=(Shard(0), None, Replicate()))
    mod = parallelize_module(_Pair(), mesh, style)
    with CollectiveCounter() as c:
        a, tag, b = mod(full)
    out["counts"] = c.counts
    torch.testing.assert_close(a, (full * 2).tensor_split(world)[rank])  # replicated -> a local slice
    torch.testing.assert_close(b, torch.cat([full + 1] * world))  # every rank's piece, gathered
    out["tag"] = tag
    bad = parallelize_module(nn.Identity(), mesh, PrepareModuleOutput(output_layouts=(Replicate(), None),
                                                                      desired_output_layouts=(Shard(0), None)))
    try:
        bad(full)
    except ValueError as e:
        out["mismatch"] = str(e)
    return out


def test_prepare_module_output_tuples():
    out = run_on_ranks(_prepare_output, 2)[0]
    assert out["counts"] == {"all_gather": 1} and out["tag"] == "tag"
    assert "returned 1 outputs but output_layouts has 2 entries" in out["mismatch"]


def _src_data_rank(rank, world):
    mesh = worker_mesh((world,))
    torch.manual_seed(rank)  # different values on each rank
    lin = nn.Linear(4, 4)
    mine = lin.weight.detach().clone()
    parallelize_module(lin, mesh, ColwiseParallel(), src_data_rank=None)
    kept = torch.equal(lin.weight.to_local(), mine.tensor_split(world)[rank])  # no broadcast happened
    torch.manual_seed(rank)
    lin = parallelize_module(nn.Linear(4, 4), mesh, ColwiseParallel())  # default: rank 0's values
    torch.manual_seed(0)
    from_rank0 = torch.equal(lin.weight.full_tensor(), nn.Linear(4, 4).weight.detach())
    return kept, from_rank0


def test_src_data_rank_none_keeps_local_values():
    assert run_on_ranks(_src_data_rank, 2) == [(True, True)] * 2


def test_style_arguments_follow_torch():
    with pytest.raises(ValueError, match="input_layouts has 1 entries but desired_input_layouts has 2"):
        PrepareModuleInput(input_layouts=Shard(0), desired_input_layouts=(Replicate(), None))
    with pytest.raises(ValueError, match="desired_input_layouts has None"):
        PrepareModuleInput(input_layouts=Shard(0))
    with pytest.raises(TypeError, match="uneven_shards='no'"):
        ColwiseParallel(uneven_shards="no")
    with pytest.raises(TypeError, match="sequence_dim=1.5"):
        SequenceParallel(sequence_dim=1.5)
    with pytest.raises(ValueError, match="output_layouts is required"):
        PrepareModuleOutput(output_layouts=None, desired_output_layouts=Shard(0))
    assert repr(SequenceParallel()) == "SequenceParallel(sequence_sharding=(Shard(dim=1),), use_local_output=False, " \
                                       "uneven_shards=False)"
