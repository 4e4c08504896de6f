"""Keyed optimizers (TorchRec's torchrec.optim.keyed shape), compared with the plain torch optimizers
they wrap: names, state dicts, loading, LR schedulers over a CombinedOptimizer."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.distributed.optim import _apply_optimizer_in_backward as apply_optimizer_in_backward

from shardwise.optim import (
    CombinedOptimizer, KeyedOptimizer, KeyedOptimizerWrapper, RowWiseAdagrad, in_backward_optimizer_filter,
)


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))


def _step(model, opt, x):
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()


def test_combined_optimizer_and_scheduler_train_like_plain_torch():
    model, ref = _model(), _model()
    first = KeyedOptimizerWrapper(dict(model[0].named_parameters()), lambda ps: torch.optim.Adam(ps, lr=0.01))
    last = KeyedOptimizerWrapper(dict(model[2].named_parameters()), lambda ps: torch.optim.SGD(ps, lr=0.1))
    opt = CombinedOptimizer([("0", first), ("2", last)])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 ** s)
    ref_a, ref_b = torch.optim.Adam(ref[0].parameters(), lr=0.01), torch.optim.SGD(ref[2].parameters(), lr=0.1)
    ref_sa = torch.optim.lr_scheduler.LambdaLR(ref_a, lambda s: 0.5 ** s)
    ref_sb = torch.optim.lr_scheduler.LambdaLR(ref_b, lambda s: 0.5 ** s)
    g = torch.Generator().manual_seed(1)
    for _ in range(4):
        x = torch.randn(5, 3, generator=g)
        _step(model, opt, x)
        sched.step()
        ref_a.zero_grad(); ref_b.zero_grad()
        ref(x).pow(2).mean().backward()
        ref_a.step(); ref_b.step(); ref_sa.step(); ref_sb.step()
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert [gr["lr"] for gr in opt.param_groups] == [ref_a.param_groups[0]["lr"], ref_b.param_groups[0]["lr"]]
    sd = opt.state_dict()
    assert sorted(sd["state"]) == ["0.bias", "0.weight"] and sorted(sd["state"]["0.weight"]) == \
        ["exp_avg", "exp_avg_sq", "step"] and "param_groups" not in sd       # TorchRec's default
    assert sorted(opt.params) == ["0.bias", "0.weight", "2.bias", "2.weight"]


def test_load_state_dict_copies_in_place_and_refuses_other_parameters():
    model = _model()
    opt = KeyedOptimizerWrapper(dict(model.named_parameters()), lambda ps: torch.optim.Adam(ps, lr=0.01))
    _step(model, opt, torch.ones(2, 3))
    saved = copy.deepcopy(opt.state_dict())
    before = opt.state_dict()["state"]["0.weight"]["exp_avg"]
    _step(model, opt, torch.full((2, 3), 2.0))
    assert not torch.equal(before, saved["state"]["0.weight"]["exp_avg"])
    opt.load_state_dict(saved)
    assert torch.equal(opt.state_dict()["state"]["0.weight"]["exp_avg"], saved["state"]["0.weight"]["exp_avg"])
    assert opt.state_dict()["state"]["0.weight"]["exp_avg"] is before          # the same tensor, filled in place
    with pytest.raises(ValueError, match=r"holds parameters \['0.weight'\]"):
        opt.load_state_dict({"state": {"0.weight": saved["state"]["0.weight"]}})


def test_save_param_groups_round_trip():
    model = _model()
    opt = KeyedOptimizerWrapper(dict(model.named_parameters()), lambda ps: torch.optim.SGD(ps, lr=0.1))
    opt.save_param_groups(True)
    sd = opt.state_dict()
    assert sd["param_groups"][0]["params"] == sorted(dict(model.named_parameters())) and sd["param_groups"][0]["lr"] == 0.1
    sd["param_groups"][0]["lr"] = 0.3
    opt.load_state_dict(sd)
    assert opt.param_groups[0]["lr"] == 0.3


def test_duplicate_names_and_bad_members_are_refused():
    model = _model()
    a = KeyedOptimizerWrapper(dict(model.named_parameters()), lambda ps: torch.optim.SGD(ps, lr=0.1))
    b = KeyedOptimizerWrapper(dict(model.named_parameters()), lambda ps: torch.optim.SGD(ps, lr=0.1))
    with pytest.raises(ValueError, match="duplicate parameter name '0.weight'"):
        CombinedOptimizer([a, b])
    with pytest.raises(TypeError, match="KeyedOptimizerWrapper"):
        CombinedOptimizer([torch.optim.SGD(model.parameters(), lr=0.1)])
    with pytest.raises(NotImplementedError, match="CombinedOptimizer"):
        a.add_param_group({"params": []})
    w = torch.nn.Parameter(torch.ones(1))
    with pytest.raises(ValueError, match="every state key must be one of the params"):
        KeyedOptimizer({}, {w: {}}, [])


def test_in_backward_optimizer_filter_splits_on_torch_marker():
    model = _model()
    apply_optimizer_in_backward(RowWiseAdagrad, [model[0].weight], {"lr": 0.1})
    assert [n for n, _ in in_backward_optimizer_filter(model.named_parameters())] == ["0.bias", "2.weight", "2.bias"]
    assert [n for n, _ in in_backward_optimizer_filter(model.named_parameters(), include=True)] == ["0.weight"]


def test_row_wise_adagrad_refuses_what_it_does_not_implement():
    w = torch.nn.Parameter(torch.ones(2, 2))
    with pytest.raises(ValueError, match="weight_decay"):
        RowWiseAdagrad([w], lr=0.1, weight_decay=0.1)
    RowWiseAdagrad([w], lr=0.1, weight_decay=0.0)     # TorchRec's signature, defaults accepted
