"""Functional SGD/Adam/AdamW against torch.optim (single process)."""
from __future__ import annotations

import pytest
import torch

from shardwise.compile.optim import functional_update, init_state, optim_spec

CONFIGS = [
    (torch.optim.SGD, dict(lr=0.1)),
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.2, maximize=True)),
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True)),
    (torch.optim.Adam, dict(lr=1e-2)),
    (torch.optim.Adam, dict(lr=1e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.05)),
    (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
    (torch.optim.AdamW, dict(lr=3e-3, weight_decay=0.0, maximize=True)),
]


@pytest.mark.parametrize("grad_scale", [None, 2])
@pytest.mark.parametrize("fused", [None, True, False])
@pytest.mark.parametrize("cls,kw", CONFIGS, ids=[f"{c.__name__}-{i}" for i, (c, _) in enumerate(CONFIGS)])
def test_functional_update_matches_torch(cls, kw, fused, grad_scale):
    """Against eager torch.optim with the same ``fused`` flag (None: torch's default, the for-loop on CPU),
    and, for our fused kernel, bit for bit against torch's own ``fused=True``; ``grad_scale=2``: the update
    gets twice the gradients (a sum over two ranks) and must apply their average, exactly."""
    g = torch.Generator().manual_seed(0)
    shapes = [(7, 3), (5,), (33, 17)]
    params = [torch.randn(s, generator=g) for s in shapes]
    ref = [p.clone().requires_grad_() for p in params]
    ref_fused = [p.clone().requires_grad_() for p in params]
    opt = cls(ref, **kw, fused=fused)
    opt_fused = cls(ref_fused, **kw, fused=True)
    group = optim_spec(opt).groups[0]
    assert group.fused == (fused is not False)
    states = [init_state(group, p, has_state=False) for p in params]
    for step in range(4):
        grads = [torch.randn(s, generator=g) for s in shapes]
        for r, rf, gr in zip(ref, ref_fused, grads):
            r.grad, rf.grad = gr.clone(), gr.clone()
        opt.step()
        opt_fused.step()
        lr = torch.tensor(opt.param_groups[0]["lr"], dtype=torch.float64)
        given = [gr * (grad_scale or 1) for gr in grads]
        params, states = functional_update(group, params, given, states, lr, grad_scale=grad_scale)
        for p, r, rf in zip(params, ref, ref_fused):
            torch.testing.assert_close(p, r.detach(), atol=1e-6, rtol=1e-6)
            if group.fused:
                assert torch.equal(p, rf.detach()), (p - rf).abs().max()
        for s, p_ref in zip(states, ref):
            for k, v in s.items():
                torch.testing.assert_close(v.float(), opt.state[p_ref][k].float(), atol=1e-6, rtol=1e-6)


def test_lr_is_an_input_not_a_constant():
    p, gr = torch.ones(3), torch.ones(3)
    group = optim_spec(torch.optim.SGD([p.clone().requires_grad_()], lr=1.0)).groups[0]
    a, _ = functional_update(group, [p.clone()], [gr], [{}], torch.tensor(0.5, dtype=torch.float64))
    b, _ = functional_update(group, [p.clone()], [gr], [{}], torch.tensor(0.25, dtype=torch.float64))
    assert torch.equal(a[0], torch.full((3,), 0.5)) and torch.equal(b[0], torch.full((3,), 0.75))


def test_spec_guards_hyper_parameters_but_not_lr():
    p = [torch.ones(2, requires_grad=True)]
    a = optim_spec(torch.optim.Adam(p, lr=1e-3))
    assert a == optim_spec(torch.optim.Adam(p, lr=5e-1))
    assert a != optim_spec(torch.optim.Adam(p, lr=1e-3, betas=(0.5, 0.9)))


@pytest.mark.parametrize("make,err,text", [
    (lambda p: torch.optim.RMSprop(p), TypeError, "RMSprop"),
    (lambda p: torch.optim.Adam(p, amsgrad=True), ValueError, "amsgrad"),
    (lambda p: torch.optim.Adam(p, differentiable=True), ValueError, "differentiable"),
    (lambda p: "sgd", TypeError, "torch.optim.Optimizer"),
])
def test_rejected_optimizers(make, err, text):
    with pytest.raises(err, match=text):
        optim_spec(make([torch.ones(2, requires_grad=True)]))


@pytest.mark.parametrize("fused,kernels", [(None, 1), (True, 1), (False, 0)])
def test_fused_groups_trace_to_one_kernel_call(fused, kernels):
    """The default (fused=None) traces one fused call for all parameters of a group instead of ~10 ops each."""
    from torch.fx.experimental.proxy_tensor import make_fx

    params = [torch.randn(4, 3), torch.randn(3), torch.randn(2, 2)]
    group = optim_spec(torch.optim.Adam([p.clone().requires_grad_() for p in params], fused=fused)).groups[0]
    states = [init_state(group, p, has_state=False) for p in params]

    def update(ps, gs, ss, lr):
        functional_update(group, ps, gs, [dict(zip(("exp_avg", "exp_avg_sq", "step"), s)) for s in ss], lr)
        return ps

    gm = make_fx(update)(params, [torch.randn_like(p) for p in params],
                         [[s["exp_avg"], s["exp_avg_sq"], s["step"]] for s in states], torch.tensor(0.1, dtype=torch.float64))
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert sum("_fused_adam_" in t for t in targets) == kernels, targets
    if kernels:
        assert len(targets) <= 2 + len(params), targets  # the step counts' increments, the lr, one kernel
