"""Tensor-parallel styles against single-process training, uneven world sizes included."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from shardwise.parallel import (
    ColwiseParallel, EmbeddingIndexError, PrepareModuleInput, RowwiseParallel, parallelize_module,
)
from shardwise.tensor import DTensor, Replicate, Shard
from shardwise.testing import run_on_ranks, worker_mesh


class Net(nn.Module):
    def __init__(self, vocab=11, dim=8, hidden=10, out=5, padding_idx=None):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim, padding_idx=padding_idx)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, out)

    def forward(self, ids):
        return self.fc2(torch.relu(self.fc1(self.emb(ids))))


def _data(steps, vocab, gen):
    return [(torch.randint(0, vocab, (4, 3), generator=gen), torch.randn(4, 3, 5, generator=gen))
            for _ in range(steps)]


def _train(model, data, to_input=lambda x: x):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for ids, target in data:
        loss = F.mse_loss(model(to_input(ids)), target)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _full_params(model):
    return {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach() for n, p in model.named_parameters()}


class _Full(nn.Module):
    """Gathers a DTensor output (the loss needs a plain tensor when styles keep DTensors)."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, ids):
        return self.net(ids).full_tensor()


def _mlp(rank, world, emb_out, local_out=True, uneven=False):
    mesh = worker_mesh((world,))
    torch.manual_seed(0)
    ref = Net(padding_idx=3)
    model = Net(padding_idx=3)
    model.load_state_dict(ref.state_dict())
    plan = {"emb": RowwiseParallel(output_layouts=emb_out, use_local_output=local_out),
            "fc1": ColwiseParallel(input_layouts=emb_out, use_local_output=local_out, uneven_shards=uneven),
            "fc2": RowwiseParallel(use_local_output=local_out)}
    parallelize_module(model, mesh, plan)
    data = _data(5, 11, torch.Generator().manual_seed(1))
    ref_losses = _train(ref, data)
    losses = _train(model if local_out else _Full(model), data)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses))
    want = {n: p.detach() for n, p in ref.named_parameters()}
    torch.testing.assert_close(_full_params(model), want)
    placements = {n: p.placements for n, p in model.named_parameters()}
    assert placements["emb.weight"] == (Shard(0),) and placements["fc1.weight"] == (Shard(0),)
    assert placements["fc2.weight"] == (Shard(1),) and placements["fc2.bias"] == (Replicate(),)
    return model.emb.weight.to_local().shape[0]


@pytest.mark.parametrize("world", [2, 3, 4])
def test_embedding_mlp_training_matches_single_process(world):
    rows = run_on_ranks(_mlp, world, Replicate())
    assert sum(rows) == 11 and len(rows) == world


def test_dtensor_outputs_between_styles():
    # use_local_output=False: DTensors flow from module to module (uneven on 3 ranks)
    assert sum(run_on_ranks(_mlp, 3, Replicate(), False)) == 11


def test_sequence_sharded_embedding_output():
    # the row-wise embedding's pending sum reduce-scattered over the sequence dim (3 on 2 ranks): the
    # local pieces fc1 gets are uneven, so it opts in to learning their global size
    assert sum(run_on_ranks(_mlp, 2, Shard(1), True, True)) == 11


def _colwise_embedding_and_prepare(rank, world):
    mesh = worker_mesh((world,))
    torch.manual_seed(2)
    ref = Net(vocab=7, dim=5)
    model = Net(vocab=7, dim=5)
    model.load_state_dict(ref.state_dict())
    plan = {
        "": PrepareModuleInput(input_layouts=Shard(0), desired_input_layouts=Replicate()),
        "emb": ColwiseParallel(output_layouts=Replicate()),
        "fc1": ColwiseParallel(), "fc2": RowwiseParallel(),
    }
    parallelize_module(model, mesh, plan)
    data = _data(3, 7, torch.Generator().manual_seed(3))
    lo, hi = (0, 2) if rank == 0 else (2, 4)  # each rank passes its own rows of the batch
    losses = _train(model, data, lambda ids: ids[lo:hi])
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(_train(ref, data)))
    torch.testing.assert_close(_full_params(model), {n: p.detach() for n, p in ref.named_parameters()})
    return model.emb.weight.placements


def test_colwise_embedding_and_prepare_module_input():
    assert run_on_ranks(_colwise_embedding_and_prepare, 2) == [(Shard(1),)] * 2


def _bad_ids(rank, world):
    mesh = worker_mesh((world,))
    torch.manual_seed(0)
    model = parallelize_module(Net(), mesh, {"emb": RowwiseParallel(), "fc1": ColwiseParallel(),
                                             "fc2": RowwiseParallel()})
    before = _full_params(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    err = None
    try:
        model(torch.tensor([[1, 11, 2]])).sum().backward()
        opt.step()
    except EmbeddingIndexError as e:
        err = str(e)
    after = _full_params(model)
    assert all(torch.equal(before[n], after[n]) for n in before), "weights changed"
    return err


def test_out_of_range_ids_raise_on_every_rank_and_leave_weights():
    errs = run_on_ranks(_bad_ids, 2)
    assert errs[0] == errs[1] and "id 11" in errs[0] and "num_embeddings=11" in errs[0]


def _plan_errors(rank, world):
    mesh = worker_mesh((world,))
    out = {}
    for key, plan in [("missing", {"nope": ColwiseParallel()}), ("type", {"": ColwiseParallel()}),
                      ("style", {"fc1": "colwise"}),
                      ("twice", {"fc*": ColwiseParallel(), "fc1": RowwiseParallel()})]:
        model = Net()
        before = {n: type(p) for n, p in model.named_parameters()}
        try:
            parallelize_module(model, mesh, plan)
        except (TypeError, ValueError) as e:
            out[key] = (type(e).__name__, str(e))
        assert {n: type(p) for n, p in model.named_parameters()} == before, "model changed"
    model = parallelize_module(Net(), mesh, {"fc*": ColwiseParallel(output_layouts=Replicate())})
    out["glob"] = [n for n, p in model.named_parameters() if isinstance(p, DTensor)]
    try:
        parallelize_module(model, mesh, {"fc1": ColwiseParallel()})
    except ValueError as e:
        out["again"] = str(e)
    return out


def test_plan_validation_and_globs():
    out = run_on_ranks(_plan_errors, 2)[0]
    assert out["missing"][0] == "ValueError" and "'nope'" in out["missing"][1]
    assert out["type"][0] == "TypeError" and "Net" in out["type"][1]
    assert out["style"][0] == "TypeError" and "ParallelStyle" in out["style"][1]
    assert out["glob"] == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert out["twice"][0] == "ValueError" and "two parameter-sharding styles" in out["twice"][1]
    assert "already has DTensor parameters" in out["again"]


class _Echo(nn.Module):
    def forward(self, x, bias=None):
        return x, bias


def _prepare_kwargs(rank, world):
    mesh = worker_mesh((world,))
    style = PrepareModuleInput(input_layouts=Shard(0), desired_input_layouts=Replicate(),
                               input_kwarg_layouts={"bias": Shard(0)}, desired_input_kwarg_layouts={"bias": Replicate()},
                               use_local_output=True, uneven_shards=True)
    echo = parallelize_module(_Echo(), mesh, style)
    full_x, full_b = torch.arange(15.0).view(5, 3), torch.arange(3.0)
    lo, n = (0, 3) if rank == 0 else (3, 2)  # uneven: 5 rows on 2 ranks
    x, b = echo(full_x[lo:lo + n], bias=full_b[rank * 2:rank * 2 + 2])
    torch.testing.assert_close(x, full_x)
    torch.testing.assert_close(b, full_b)
    return type(x).__name__


def test_prepare_module_input_kwargs_uneven():
    assert run_on_ranks(_prepare_kwargs, 2) == ["Tensor", "Tensor"]


def test_style_argument_errors():
    with pytest.raises(ValueError, match="desired_input_layouts has 1"):
        PrepareModuleInput(input_layouts=(Shard(0), None), desired_input_layouts=(Replicate(),))
    with pytest.raises(ValueError, match=r"\['y'\]"):
        PrepareModuleInput(input_kwarg_layouts={"x": Shard(0)}, desired_input_kwarg_layouts={"y": Replicate()})
    with pytest.raises(TypeError, match="input_layouts=0"):
        ColwiseParallel(input_layouts=0)
    with pytest.raises(TypeError, match="use_local_output"):
        RowwiseParallel(use_local_output="yes")
