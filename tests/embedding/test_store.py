"""The fused backward's per-row gradient sum against a dense scatter in plain PyTorch."""

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

