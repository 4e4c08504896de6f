"""Tracing the step and classifying nodes by provenance (single process, fake tensors)."""
from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from shardwise.compile.classify import kind_counts, param_derived
from shardwise.compile.tracing import trace_joint
from tests.compile.models import make_case


def _trace(model, step, batch):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fm = FakeTensorMode()
    params = {n: fm.from_tensor(p.detach()) for n, p in model.named_parameters()}
    buffers = {n: fm.from_tensor(b) for n, b in model.named_buffers()}
    return trace_joint(step, model, opt, params, buffers, tuple(fm.from_tensor(t) for t in batch))


@pytest.mark.parametrize("name", ["mlp", "block"])
def test_joint_graph_matches_autograd(name):
    model, step, batches = make_case(name, 4)
    x, y = batches[0]
    joint = _trace(model, step, (x, y))
    params = [p.detach() for p in model.parameters()]
    outs = joint.gm(params, [], [x, y])
    ref = copy.deepcopy(model)
    ref_loss = _loss_only(name, ref, x, y)
    ref_loss.backward()
    torch.testing.assert_close(outs[0], ref_loss.detach())
    for got, p in zip(outs[1:], ref.parameters()):
        torch.testing.assert_close(got, p.grad, atol=1e-6, rtol=1e-6)


def _loss_only(name, model, x, y):
    if name == "mlp":
        return F.mse_loss(model(x), y)
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten())


def test_nodes_tagged_by_provenance():
    model, step, batches = make_case("block", 4)
    joint = _trace(model, step, batches[0])
    counts = kind_counts(joint.gm)
    n_params = len(list(model.parameters()))
    assert counts["param"] == n_params and counts["grad"] == n_params and counts["input"] == 2
    nodes = list(joint.gm.graph.nodes)
    fqns = {n.meta["sw_fqn"] for n in nodes if n.meta.get("sw_kind") == "grad"}
    assert fqns == {n for n, _ in model.named_parameters()}
    regions = [n.meta["sw_region"] for n in nodes if n.op == "call_function"]
    assert "forward" in regions and "backward" in regions
    # the first backward node is the gradient seed; every gradient comes from the backward
    assert all(n.meta["sw_region"] == "backward" for n in nodes if n.meta.get("sw_kind") == "grad")


def test_param_derived_stops_at_activations():
    model, step, batches = make_case("mlp", 4)
    joint = _trace(model, step, batches[0])
    w = next(n for n in joint.gm.graph.nodes if n.meta.get("sw_fqn") == "layers.0.weight" and n.op == "placeholder")
    derived = param_derived(joint.gm.graph, w)
    assert len(derived) > 1  # detach / transpose of the weight
    assert all(str(n.target) not in ("aten.addmm.default", "aten.mm.default") for n in derived)


def _no_step(model, optimizer, x, y):
    F.mse_loss(model(x), y).backward()
    return None


def _twice(model, optimizer, x, y):
    F.mse_loss(model(x), y).backward()
    F.mse_loss(model(x), y).backward()
    optimizer.step()


@pytest.mark.parametrize("fn,text", [(_no_step, "step called: False"), (_twice, "backward() was called twice")])
def test_step_shape_errors(fn, text):
    model, _, batches = make_case("mlp", 4)
    with pytest.raises(ValueError, match=re.escape(text)):
        _trace(model, fn, batches[0])


@pytest.mark.parametrize("style", ["replicate", "fully_shard"])
def test_per_rank_graph_is_tagged(style):
    from shardwise.testing.harness import run_on_ranks
    from tests.compile import dp_cases

    r = run_on_ranks(dp_cases.graph_kinds, 2, style)[0]
    # agreement: the ranks' agreement bits, carried by a gradient bucket (compile/agreement.py)
    assert r["placeholders"] == [("agreement", False), ("hparam", False), ("input", False), ("opt_state", True),
                                 ("param", True)]
    assert set(r["regions"]) == {"forward", "backward", "optimizer"}
    assert r["grad_fqns"] == sorted(r["names"])
    # the optimizer writes every parameter and its three Adam state tensors in place
    assert {f for k, f in r["writes"] if k == "param"} == set(r["names"])
    assert len([1 for k, _ in r["writes"] if k == "opt_state"]) == len(r["names"])
    assert {"activation", "grad", "param", "opt_state", "input", "hparam"} <= set(r["kinds"])
