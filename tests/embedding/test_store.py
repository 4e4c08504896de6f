"""The fused backward's per-row gradient sum against a dense scatter in plain PyTorch."""

import pytest
import torch

from shardwise.embedding.sharding import store
from shardwise.embedding.sharding.store import advise_huge_pages, group_by_row, summed_row_gradients


def _dense_sum(ids, offsets, psw, grad, rows):
    """Ground truth: one gradient row per occurrence, weighted, added into a dense table."""
    lengths = offsets[1:] - offsets[:-1]
    bag = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
    per_occurrence = grad.index_select(0, bag)
    if psw is not None:
        per_occurrence = per_occurrence * psw.unsqueeze(1)
    dense = torch.zeros(rows, grad.shape[1], dtype=torch.float64)
    dense.index_add_(0, ids, per_occurrence.double())
    touched = torch.unique(ids)
    return touched, dense.index_select(0, touched)


@pytest.mark.parametrize("grouping", ["numba", "sort"])   # CPU: one numba radix loop; elsewhere torch.sort
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("num_rows", [1000, 100_000, 2 ** 40])   # int16, int32, int64 sort keys
def test_summed_row_gradients_matches_dense_scatter(weighted, num_rows, grouping, monkeypatch):
    if grouping == "sort":
        monkeypatch.setattr(store, "native_group_by_row", lambda: None)
    g = torch.Generator().manual_seed(7)
    lengths = torch.randint(0, 9, (300,), generator=g)   # empty bags included
    offsets = torch.zeros(301, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    ids = torch.randint(0, 1000, (int(offsets[-1]),), generator=g)   # many repeats per row
    psw = torch.rand(ids.numel(), generator=g) if weighted else None
    grad = torch.randn(300, 8, generator=g)
    rows, summed = summed_row_gradients(ids, offsets, psw, grad, num_rows)
    want_rows, want = _dense_sum(ids, offsets, psw, grad, 1000)
    assert rows.dtype == torch.int64 and torch.equal(rows, want_rows)   # unique, sorted
    torch.testing.assert_close(summed.double(), want, rtol=1e-6, atol=1e-6)


def test_the_numba_grouping_is_the_stable_sorts(monkeypatch):
    """Rows, segments, the bag of each occurrence and the weights in the same order as the stable sort
    (so the summed gradients are the same bit for bit), for ids of up to 40 bits (four radix digits),
    empty inputs and offsets that leave ids before the first bag."""
    g = torch.Generator().manual_seed(3)
    for trial in range(200):
        n = int(torch.randint(0, 80, (1,), generator=g))
        num_rows = int(torch.randint(1, 1 << int(torch.randint(1, 41, (1,), generator=g)), (1,), generator=g))
        ids = torch.randint(0, num_rows, (n,), generator=g)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.randint(0, 4, (n + 2,), generator=g).cumsum(0)])
        offsets = offsets.clamp(max=n)
        offsets[0], offsets[-1] = int(trial % 3 == 0 and n > 0), n
        psw = torch.rand(n, generator=g)
        fast = group_by_row(ids, offsets, psw, num_rows)
        with monkeypatch.context() as m:
            m.setattr(store, "native_group_by_row", lambda: None)
            slow = group_by_row(ids, offsets, psw, num_rows)
        for a, b in zip(fast, slow):
            assert a.dtype == b.dtype and torch.equal(a, b), trial
    assert store.native_group_by_row()(torch.tensor([3, -1]), torch.tensor([0, 2])) is None   # the sort takes them



def _dense_reference(opt_factory, weight, batches, scale):
    """Ground truth: plain PyTorch, the dense optimizer on the whole table after each pooled backward."""
    import torch.nn.functional as F

    param = torch.nn.Parameter(weight.clone())
    opt = opt_factory([param])
    for ids, offsets, psw, grad in batches:
        opt.zero_grad()
        out = F.embedding_bag(ids, param, offsets, mode="sum", per_sample_weights=psw, include_last_offset=True)
        out.backward(grad * scale)
        opt.step()
    return param.detach()


@pytest.mark.parametrize("opt_name", ["sgd", "adagrad", "adam", "adamw", "row_wise_adagrad"])
@pytest.mark.parametrize("compiled", [False, True])
def test_blocked_backward_update_matches_dense_optimizer(opt_name, compiled, monkeypatch):
    """The fused backward's update over blocks of touched rows (here 7 rows a block, ragged last)
    equals the dense torch optimizer on the unsharded table, and the one-block update bit for bit;
    two steps, so Adam's bias correction shows the step counted once per backward, not per block."""
    import functools

    from shardwise.embedding import RowWiseAdagrad
    from shardwise.embedding.optim.rules import resolve_optimizer
    from shardwise.embedding.plan.values import ShardBox
    from shardwise.embedding.sharding import store as store_mod

    factory = {"sgd": functools.partial(torch.optim.SGD, lr=0.3),
               "adagrad": functools.partial(torch.optim.Adagrad, lr=0.3),
               "adam": functools.partial(torch.optim.Adam, lr=0.05),
               "adamw": functools.partial(torch.optim.AdamW, lr=0.05, weight_decay=0.5),
               "row_wise_adagrad": functools.partial(RowWiseAdagrad, lr=0.3)}[opt_name]
    g = torch.Generator().manual_seed(3)
    weight = torch.randn(60, 8, generator=g)
    lengths = torch.randint(0, 6, (40,), generator=g)
    offsets = torch.zeros(41, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    ids = torch.randint(0, 60, (int(offsets[-1]),), generator=g)   # the same rows both steps (dense Adam
    psw = torch.rand(ids.numel(), generator=g) + 0.5                # would move rows touched once only)
    batches = [(ids, offsets, psw, torch.randn(40, 8, generator=g)) for _ in range(2)]
    rule, hp = resolve_optimizer(factory)

    def run(block_rows):
        monkeypatch.setattr(store_mod, "_BLOCK_ROWS", block_rows)
        st = store_mod.ShardStore([ShardBox("t", 0, 0, 60, 0, 8)], 0, {"t": weight}, "cpu", rule, hp,
                                  compiled=compiled, grad_scale=0.5)
        for b_ids, b_off, b_psw, grad in batches:
            st.apply_bag_gradient(0, b_ids, b_off, b_psw, grad)
        assert st.steps == [2]
        return st.box_view(0)

    blocked, whole = run(7), run(10 ** 6)
    assert torch.equal(blocked, whole)
    want = _dense_reference(factory, weight, batches, 0.5)
    assert (want - weight).abs().max() > 1e-2   # the update moved the table
    if opt_name == "adamw":   # dense AdamW decays every row; the fused one (as FBGEMM's) the touched rows only
        touched = torch.zeros(60, dtype=torch.bool)
        touched[ids] = True
        assert torch.equal(blocked[~touched], weight[~touched]) and not torch.equal(want[~touched], weight[~touched])
        blocked, want = blocked[touched], want[touched]
    torch.testing.assert_close(blocked, want, rtol=1e-5, atol=1e-6)


def test_huge_page_hint_keeps_the_tensor_and_its_values():
    big = torch.arange(3 << 20, dtype=torch.float32)          # 12 MiB: whole 2 MiB pages inside it
    assert advise_huge_pages(big) is big and torch.equal(big, torch.arange(3 << 20, dtype=torch.float32))
    small, meta = torch.ones(10), torch.empty(1 << 22, device="meta")
    assert advise_huge_pages(small) is small and advise_huge_pages(meta) is meta
