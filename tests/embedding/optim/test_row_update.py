"""The fused optimizers' default row update (compiled one-pass kernel on large calls) against the
dense torch optimizer on the unsharded table, through the store's pooled backward: duplicate ids,
empty bags, weighted bags, gradient division, two steps."""

import functools
import warnings

import pytest
import torch
import torch.nn.functional as F

from shardwise.embedding import RowWiseAdagrad
from shardwise.embedding.optim import row_update
from shardwise.embedding.optim.rules import resolve_optimizer
from shardwise.embedding.plan.values import ShardBox
from shardwise.embedding.sharding.store import ShardStore

ROWS, DIM, BAGS = 6000, 16, 800

FACTORIES = {"sgd": functools.partial(torch.optim.SGD, lr=0.3),
             "adagrad": functools.partial(torch.optim.Adagrad, lr=0.3, lr_decay=0.01, initial_accumulator_value=0.1),
             "adam": functools.partial(torch.optim.Adam, lr=0.05),
             "adamw": functools.partial(torch.optim.AdamW, lr=0.05, weight_decay=0.5),
             "row_wise_adagrad": functools.partial(RowWiseAdagrad, lr=0.3)}


def _batches(steps=2):
    g = torch.Generator().manual_seed(11)
    lengths = torch.randint(0, 12, (BAGS,), generator=g)
    lengths[::7] = 0                                            # empty bags
    offsets = torch.zeros(BAGS + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    # a quarter of the ids fall on 40 hot rows: many duplicates within a batch and within a bag
    ids = torch.randint(0, ROWS, (int(offsets[-1]),), generator=g)
    ids[::4] = torch.randint(0, 40, (ids[::4].numel(),), generator=g)
    psw = torch.rand(ids.numel(), generator=g) + 0.5
    return [(ids, offsets, psw, torch.randn(BAGS, DIM, generator=g)) for _ in range(steps)]


def _dense(factory, weight, batches, scale):
    """Ground truth: nn.functional.embedding_bag on the whole table and the dense torch optimizer."""
    param = torch.nn.Parameter(weight.clone())
    opt = factory([param])
    for ids, offsets, psw, grad in batches:
        opt.zero_grad()
        F.embedding_bag(ids, param, offsets, mode="sum", per_sample_weights=psw,
                        include_last_offset=True).backward(grad * scale)
        opt.step()
    return param.detach()


def _fused(factory, weight, batches, scale):
    rule, hp = resolve_optimizer(factory)
    store = ShardStore([ShardBox("t", 0, 0, ROWS, 0, DIM)], 0, {"t": weight}, "cpu", rule, hp, grad_scale=scale)
    for ids, offsets, psw, grad in batches:
        store.apply_bag_gradient(0, ids, offsets, psw, grad)
    return store.box_view(0), rule


@pytest.mark.parametrize("opt_name", list(FACTORIES))
def test_default_update_is_compiled_and_matches_dense_optimizer(opt_name):
    factory = FACTORIES[opt_name]
    weight = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(5))
    batches = _batches()
    touched = torch.zeros(ROWS, dtype=torch.bool)
    touched[batches[0][0]] = True
    assert int(touched.sum()) * DIM >= row_update.COMPILE_MIN_ELEMENTS   # large enough for the kernel
    got, rule = _fused(factory, weight, batches, 0.5)
    if opt_name == "sgd":   # linear: added straight from the occurrences (test_occurrence_sgd.py)
        assert rule.occurrence._kernels or rule.occurrence.native, "the default SGD update did not run its loop"
    else:
        assert rule.update._compiled is not None, "the default update did not run the compiled kernel"
    want = _dense(factory, weight, batches, 0.5)
    assert (want - weight).abs().max() > 1e-2
    if opt_name == "adamw":   # the fused AdamW (as FBGEMM's) decays the touched rows only
        assert torch.equal(got[~touched], weight[~touched])
        got, want = got[touched], want[touched]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_compiled_and_eager_update_agree_on_one_call():
    """The kernel and the eager update: the same step on the same rows (Adam: bias correction at step 3)."""
    rule, hp = resolve_optimizer(functools.partial(torch.optim.Adam, lr=0.01))
    g = torch.Generator().manual_seed(2)
    rows = torch.randperm(ROWS, generator=g)[:4000].sort().values
    grad = torch.randn(4000, DIM, generator=g)
    out = []
    for min_elements in (1, None):     # compiled from any size; never compiled
        upd = row_update.RowUpdate(rule.update.eager, rule.kernel, rule.coeffs, rule.state_shapes,
                                   compile_min_elements=min_elements)
        w = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(1))
        state = {"exp_avg": torch.full((ROWS, DIM), 0.1), "exp_avg_sq": torch.full((ROWS, DIM), 0.2), "step": 3}
        upd(w, state, rows, grad, hp, scale=0.5)
        assert (upd._compiled is not None) == (min_elements is not None)
        out.append((w, state["exp_avg"], state["exp_avg_sq"]))
    for a, b in zip(*out):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_failed_compile_warns_once_and_updates_eagerly(monkeypatch):
    def broken(fn, **kw):
        def run(*args):
            raise RuntimeError("no C++ compiler")
        return run

    monkeypatch.setattr(row_update.torch, "compile", broken)
    rule, hp = resolve_optimizer(functools.partial(torch.optim.SGD, lr=0.5))
    upd = row_update.RowUpdate(rule.update.eager, rule.kernel, rule.coeffs, {})
    w = torch.zeros(ROWS, DIM)
    rows, grad = torch.arange(0, ROWS, 2), torch.ones(ROWS // 2, DIM)
    with pytest.warns(RuntimeWarning, match="no C.. compiler"):
        upd(w, {"step": 1}, rows, grad, hp)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        upd(w, {"step": 2}, rows, grad, hp)    # no second warning, no second compile
    assert torch.equal(w[::2], torch.full((ROWS // 2, DIM), -1.0)) and torch.equal(w[1::2], torch.zeros(ROWS // 2, DIM))
