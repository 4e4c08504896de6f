"""Fused SGD added straight from a pooled lookup's occurrences (no grouping by row), against
nn.functional.embedding_bag + torch.optim.SGD on the whole table: duplicate ids (within a bag and
across bags), empty bags, weighted and unweighted bags, gradient division, two steps; and the same
result bit for bit on a second run with two threads."""

import functools

import pytest
import torch

from shardwise.embedding.optim import row_update
from shardwise.embedding.optim.occurrence_sgd import OccurrenceSGD
from shardwise.embedding.optim.rules import resolve_optimizer
from shardwise.embedding.plan.values import ShardBox
from shardwise.embedding.sharding import store as store_module
from shardwise.embedding.sharding.store import ShardStore
from tests.embedding.optim.test_row_update import _dense

ROWS, DIM, BAGS, LR = 3000, 16, 700, 0.3


def _batches(weighted: bool, steps: int = 2):
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(steps):
        lengths = torch.randint(0, 10, (BAGS,), generator=g)
        lengths[::5] = 0                                             # empty bags
        offsets = torch.zeros(BAGS + 1, dtype=torch.int64)
        torch.cumsum(lengths, 0, out=offsets[1:])
        ids = torch.randint(0, ROWS, (int(offsets[-1]),), generator=g)
        ids[::3] = torch.randint(0, 25, (ids[::3].numel(),), generator=g)   # hot rows: many duplicates
        psw = torch.rand(ids.numel(), generator=g) + 0.5 if weighted else None
        out.append((ids, offsets, psw, torch.randn(BAGS, DIM, generator=g)))
    return out


def _fused_sgd(weight, batches, scale):
    rule, hp = resolve_optimizer(functools.partial(torch.optim.SGD, lr=LR))
    store = ShardStore([ShardBox("t", 0, 0, ROWS, 0, DIM)], 0, {"t": weight}, "cpu", rule, hp, grad_scale=scale)
    for ids, offsets, psw, grad in batches:
        store.apply_bag_gradient(0, ids, offsets, psw, grad)
    return store.box_view(0).clone(), store


@pytest.mark.parametrize("weighted", [False, True])
def test_sgd_from_occurrences_matches_dense_sgd_without_grouping(weighted, monkeypatch):
    def no_grouping(*args, **kwargs):
        raise AssertionError("the SGD update grouped the ids by row")

    monkeypatch.setattr(store_module, "group_by_row", no_grouping)
    weight = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(1))
    batches = _batches(weighted)
    assert batches[0][0].numel() * DIM >= row_update.COMPILE_MIN_ELEMENTS
    got, store = _fused_sgd(weight, batches, 0.5)
    want = _dense(functools.partial(torch.optim.SGD, lr=LR), weight, batches, 0.5)
    assert (want - weight).abs().max() > 1e-2 and store.steps == [2]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_sgd_from_occurrences_repeats_bit_for_bit_with_two_threads():
    weight = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(2))
    batches = _batches(weighted=True)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        runs = [_fused_sgd(weight, batches, 1.0)[0] for _ in range(3)]
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(runs[0], r) for r in runs[1:])


def test_compiled_scatter_equals_its_eager_arithmetic():
    ids, offsets, psw, grad = _batches(weighted=True, steps=1)[0]
    sgd = OccurrenceSGD()
    for w in (None, psw):
        a = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(4))
        b = a.clone()
        assert sgd.applies(a, ids, grad, w is not None)
        sgd(a, ids, offsets, w, grad, -LR)
        OccurrenceSGD.eager(b, ids, offsets, w, grad, -LR)
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_numba_loop_equals_the_inductor_loop_bit_for_bit():
    pytest.importorskip("numba")
    ids, offsets, psw, grad = _batches(weighted=True, steps=1)[0]
    native, inductor = OccurrenceSGD(), OccurrenceSGD()
    inductor.native = None   # as if numba were missing: the inductor loop
    for w in (None, psw):
        a = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(4))
        b = a.clone()
        assert native.applies(a, ids, grad, w is not None) and inductor.applies(b, ids, grad, w is not None)
        native(a, ids, offsets, w, grad, -LR)
        inductor(b, ids, offsets, w, grad, -LR)
        assert native.native is not None and not native._kernels and inductor._kernels
        assert torch.equal(a, b)


def test_small_calls_and_half_precision_take_the_grouped_update():
    sgd = OccurrenceSGD()
    ids = torch.arange(10)
    assert not sgd.applies(torch.zeros(10, 4), ids, torch.zeros(2, 4), False)     # below the size bound
    big = torch.zeros(100_000, dtype=torch.int64)
    assert not sgd.applies(torch.zeros(10, 4, dtype=torch.float16), big, torch.zeros(2, 4), False)
