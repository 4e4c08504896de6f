"""The fused backward's per-row gradient sum against a dense scatter in plain PyTorch."""

import os

import pytest
import torch

from shardwise.embedding.sharding.store import summed_row_gradients


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


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("num_rows", [1000, 2 ** 40])   # int32 sort keys, int64 keys
def test_summed_row_gradients_matches_dense_scatter(weighted, num_rows):
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


def _vm_flags(addr: int) -> list:
    """The VmFlags of the mapping holding ``addr`` in /proc/self/smaps."""
    current = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                current = lo <= addr < hi
            elif current and line.startswith("VmFlags:"):
                return line.split()[1:]
    return []


@pytest.mark.skipif(not os.path.exists("/sys/kernel/mm/transparent_hugepage"),
                    reason="needs Linux with transparent huge pages (madvise, smaps)")
def test_store_buffers_are_advised_to_huge_pages():
    import functools

    from shardwise.embedding.optim.rules import resolve_optimizer
    from shardwise.embedding.plan.values import ShardBox
    from shardwise.embedding.sharding.store import ShardStore

    rule, hp = resolve_optimizer(functools.partial(torch.optim.Adagrad, lr=0.1))
    weight = torch.randn(40_000, 64)          # 10 MB: several huge pages
    store = ShardStore([ShardBox("t", 0, 0, 40_000, 0, 64)], 0, {"t": weight}, "cpu", rule=rule, hp=hp)
    for t in (store.buffers[0], store.states[0]["sum"]):
        assert "hg" in _vm_flags(t.data_ptr() + t.numel() * t.element_size() // 2)
    assert torch.equal(store.buffers[0], weight) and bool((store.states[0]["sum"] == 0).all())
    small = ShardStore([ShardBox("t", 0, 0, 10, 0, 4)], 0, {"t": torch.randn(10, 4)}, "cpu", rule=rule, hp=hp)
    assert small.buffers[0].shape == (10, 4)   # below two huge pages: left alone, still a buffer
