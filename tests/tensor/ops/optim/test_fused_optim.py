"""Fused (and foreach) optimizer steps on DTensor parameters equal plain torch, with no collective when
gradients have their parameters' layouts; other layouts are moved and written back correctly."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from shardwise.testing import run_on_ranks, worker_mesh

KINDS = ["adamw", "adam", "sgd", "adagrad"]


def _optimizer(kind, params, impl):
    flags = {"fused": True} if impl == "fused" else {"foreach": True}
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=0.05, weight_decay=0.1, amsgrad=True, **flags)
    if kind == "adam":
        return torch.optim.Adam(params, lr=0.05, weight_decay=0.01, **flags)
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01, **flags)
    return torch.optim.Adagrad(params, lr=0.1, lr_decay=0.01, weight_decay=0.01, **flags)


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 9), nn.GELU(), nn.Linear(9, 7, bias=False), nn.Tanh(), nn.Linear(7, 5))


# column-wise over an uneven 9 rows, row-wise (a strided shard of dim 1), replicated; "mixed" also
# shards the last layer. The "aligned" run moves each gradient to its parameter's layout before the step
LAYOUTS = {"aligned": {"0.weight": "S0", "0.bias": "S0", "2.weight": "S1", "4.weight": "R", "4.bias": "R"},
           "mixed": {"0.weight": "S0", "0.bias": "R", "2.weight": "S1", "4.weight": "S0", "4.bias": "R"}}


def _shard(model, mesh, layout):
    from shardwise.tensor import Replicate, Shard, distribute_tensor

    for name, param in list(model.named_parameters()):
        mod_name, attr = name.rsplit(".", 1)
        code = LAYOUTS[layout][name]
        pl = Replicate() if code == "R" else Shard(int(code[1]))
        setattr(model.get_submodule(mod_name), attr, nn.Parameter(distribute_tensor(param.detach(), mesh, [pl])))


def train(rank, world, kind, impl, layout, steps):
    from shardwise.tensor import CollectiveCounter, Replicate, distribute_tensor

    mesh = worker_mesh((world,))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 12, generator=g), torch.randint(0, 5, (16,), generator=g)
    ref, model = _mlp(), _mlp()
    _shard(model, mesh, layout)
    ref_opt, opt = _optimizer(kind, ref.parameters(), impl), _optimizer(kind, model.parameters(), impl)
    dx, dy = distribute_tensor(x, mesh, [Replicate()]), distribute_tensor(y, mesh, [Replicate()])
    step_collectives = []
    for _ in range(steps):
        F.cross_entropy(ref(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
        F.cross_entropy(model(dx), dy).backward()
        if layout == "aligned":
            for p in model.parameters():
                p.grad = p.grad.redistribute(placements=p.placements)
        same = all(p.grad.placements == p.placements for p in model.parameters())
        with CollectiveCounter() as cc:
            opt.step()
        step_collectives.append((same, cc.total))
        opt.zero_grad()
    err = max((p.full_tensor() - q).abs().max().item() for p, q in zip(model.parameters(), ref.parameters()))
    return err, step_collectives


@pytest.mark.parametrize("impl", ["fused", "foreach"])
@pytest.mark.parametrize("kind", KINDS)
def test_optimizer_on_sharded_params_equals_plain_torch(kind, impl):
    for err, steps in run_on_ranks(train, 2, kind, impl, "aligned", 3):
        assert err < 1e-5, err
        assert all(same and n == 0 for same, n in steps), steps  # laid out as the params: no collective


@pytest.mark.parametrize("kind", KINDS)
def test_fused_step_with_gradients_in_other_layouts_equals_plain_torch(kind):
    for err, steps in run_on_ranks(train, 2, kind, "fused", "mixed", 3):
        assert err < 1e-5, err
        assert not any(same for same, _ in steps), steps  # some gradients were moved


def mismatched(rank, world):
    """A pending-sum gradient and a replicated momentum buffer of sharded/replicated parameters, with
    grad_scale: moved to the parameter's layout, the unscaled gradient and new state moved back."""
    from shardwise.tensor import CollectiveCounter, Partial, Replicate, Shard, distribute_tensor
    from shardwise.tensor import DTensor

    mesh = worker_mesh((world,))
    g = torch.Generator().manual_seed(5)
    w, grad, buf = torch.randn(6, 3, generator=g), torch.randn(6, 3, generator=g), torch.randn(6, 3, generator=g)
    ref = [w.clone(), grad.clone(), buf.clone()]
    scale, found = torch.tensor(4.0), torch.tensor(0.0)
    kw = dict(weight_decay=0.01, momentum=0.9, lr=0.1, dampening=0.0, nesterov=False, maximize=False,
              is_first_step=False, grad_scale=scale, found_inf=found)
    torch._fused_sgd_([ref[0]], [ref[1]], [ref[2]], **kw)
    dw = distribute_tensor(w, mesh, [Shard(0)])
    # the gradient as pending per-rank parts that sum to `grad`
    part = grad / world if rank else grad - grad / world * (world - 1)
    dg = DTensor.from_local(part, mesh, [Partial()], run_check=False)
    db = distribute_tensor(buf, mesh, [Replicate()])
    with CollectiveCounter() as cc:
        torch._fused_sgd_([dw], [dg], [db], **kw)
    out = [dw.full_tensor(), dg.full_tensor(), db.full_tensor()]
    return [(a - b).abs().max().item() for a, b in zip(out, ref)], [str(p) for t in (dw, dg, db)
                                                                   for p in t.placements], cc.total


def test_mismatched_grad_and_state_layouts_are_moved_and_written_back():
    for errs, placements, n in run_on_ranks(mismatched, 2):
        assert max(errs) < 1e-6, errs  # parameter, unscaled gradient, momentum buffer
        assert placements == ["S(0)", "P(sum)", "R"]
        assert n > 0  # moving a pending sum costs a collective (PyTorch's DTensor moves it too)


def bad_state_steps(rank, world):
    from shardwise.tensor import Shard, distribute_tensor

    mesh = worker_mesh((world,))
    p = distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)])
    steps = [distribute_tensor(torch.ones(2), mesh, [Shard(0)])]
    try:
        torch._fused_adagrad_([p], [p.clone()], [p.clone()], steps, lr=0.1, lr_decay=0.0, weight_decay=0.0,
                              eps=1e-10, maximize=False)
    except ValueError as e:
        return str(e), p.full_tensor().sum().item()
    return "no error", None


def test_non_scalar_state_steps_raise_before_updating():
    for msg, total in run_on_ranks(bad_state_steps, 2):
        assert "state_steps[0] must be a one-element scalar; got shape (2,)" in msg, msg
        assert total == 8.0
