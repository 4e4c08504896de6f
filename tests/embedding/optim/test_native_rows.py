"""The one-loop native row updates (numba) against the inductor kernels they stand in for (bit for
bit: replicas that take different paths must not diverge) and, through a store, the dense optimizer."""

import functools

import pytest
import torch

from shardwise.embedding.optim import native_rows, row_update
from shardwise.embedding.optim.rules import resolve_optimizer

pytest.importorskip("numba")

ROWS, DIM = 3000, 24
FACTORIES = {"sgd": functools.partial(torch.optim.SGD, lr=0.3),
             "adagrad": functools.partial(torch.optim.Adagrad, lr=0.3, lr_decay=0.01, initial_accumulator_value=0.1),
             "adam": functools.partial(torch.optim.Adam, lr=0.05),
             "adamw": functools.partial(torch.optim.AdamW, lr=0.05, weight_decay=0.5)}


def _call(kernel, rule, hp, seed=3):
    """One update of 1000 unique rows at step 3, gradient scale 0.5; returns weight and state."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(ROWS, DIM, generator=g)
    state = [torch.rand(ROWS, DIM, generator=g) + 0.05 for _ in rule.state_shapes]
    rows = torch.randperm(ROWS, generator=g)[:1000].sort().values
    grad = torch.randn(1000, DIM, generator=g)
    coeffs = torch.tensor(rule.coeffs(hp, 3) + [0.5], dtype=torch.float32)
    kernel(w, *state, rows, grad, coeffs)
    return [w, *state]


@pytest.mark.parametrize("name", list(FACTORIES))
def test_native_loop_equals_the_kernel_bit_for_bit(name):
    rule, hp = resolve_optimizer(FACTORIES[name])
    got = _call(native_rows.native_kernel(name), rule, hp)
    assert not torch.equal(got[0], _call(lambda *a: None, rule, hp)[0])   # it did update
    # inductor's compiled loops: the same bits (ATen's uncompiled ops may differ by an ulp: a division
    # there rounds otherwise)
    compiled = _call(torch.compile(rule.kernel, dynamic=True), rule, hp)
    assert all(torch.equal(a, b) for a, b in zip(got, compiled))
    for a, b in zip(got, _call(rule.kernel, rule, hp)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_one_thread_runs_the_native_loop_without_compiling(monkeypatch):
    rule, hp = resolve_optimizer(FACTORIES["adagrad"])
    upd = row_update.RowUpdate(rule.update.eager, rule.kernel, rule.coeffs, rule.state_shapes, native="adagrad")
    calls = []
    real = native_rows.native_kernel
    monkeypatch.setattr(native_rows, "native_kernel", lambda n: (calls.append(n), real(n))[1])
    g = torch.Generator().manual_seed(4)
    rows = torch.randperm(ROWS, generator=g)[:2000].sort().values
    grad = torch.randn(2000, DIM, generator=g)
    assert grad.numel() >= row_update.COMPILE_MIN_ELEMENTS
    out, threads = [], torch.get_num_threads()
    for n in (1, None):   # one intra-op thread: native; eager reference (never compiled)
        u = upd if n else row_update.RowUpdate(rule.update.eager, rule.kernel, rule.coeffs, rule.state_shapes,
                                               compile_min_elements=None)
        w, acc = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(1)), torch.full((ROWS, DIM), 0.1)
        torch.set_num_threads(1)
        try:
            u(w, {"sum": acc, "step": 2}, rows, grad, hp, scale=0.5)
        finally:
            torch.set_num_threads(threads)
        out.append((w, acc))
    assert calls == ["adagrad"] and upd._compiled is None, "the native loop did not run (or inductor compiled)"
    for a, b in zip(*out):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_native_refuses_what_it_cannot_take():
    w = torch.zeros(4, 2)
    assert native_rows.native_applies(w, torch.tensor([0, 1]), torch.ones(2, 2))
    assert not native_rows.native_applies(w.half(), torch.tensor([0, 1]), torch.ones(2, 2))   # float32 only
    assert not native_rows.native_applies(torch.zeros(2, 4).t(), torch.tensor([0, 1]), torch.ones(2, 2))
    assert native_rows.native_kernel("row_wise_adagrad") is None   # its row mean sums in another order
