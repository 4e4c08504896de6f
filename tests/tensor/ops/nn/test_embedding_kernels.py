"""The row-wise local kernels on every rank's block, summed/concatenated, equal unsharded F.embedding
(no processes: each rank's block is a slice of the table)."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from shardwise.tensor.ops.nn.embedding import rowwise_grad, rowwise_lookup
from shardwise.tensor.spec import chunk_range


@settings(max_examples=60, deadline=None)
@given(
    v=st.integers(1, 13), world=st.integers(1, 5), dim=st.integers(1, 4),
    shape=st.lists(st.integers(0, 4), min_size=0, max_size=2), pad=st.integers(-1, 12),
    scale=st.booleans(), dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_rowwise_kernels_match_unsharded(v, world, dim, shape, pad, scale, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    table = torch.randn(v, dim, generator=gen).to(dtype)
    ids = torch.randint(0, v, shape, generator=gen)
    grad = torch.randn(*shape, dim, generator=gen).to(dtype)
    pad = pad if pad < v else -1
    blocks = [chunk_range(v, world, r) for r in range(world)]
    out = sum(rowwise_lookup(table[o:o + n], ids, o) for o, n in blocks)
    assert out.shape == (*shape, dim) and out.dtype == dtype
    torch.testing.assert_close(out, F.embedding(ids, table), rtol=0, atol=0)
    got = torch.cat([rowwise_grad(grad, ids, o, n, pad, scale) for o, n in blocks])
    want = torch.ops.aten.embedding_dense_backward(grad, ids, v, pad, scale)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("pad", [-1, 1, 4])
@pytest.mark.parametrize("scale", [False, True])
def test_rowwise_grad_skips_other_blocks_ids_on_either_padding_row(pad, scale):
    # block [0, 3) of a 6-row table: ids of the other block become the kernel's padding id, the block's
    # own padding row (pad=1) or a dropped scratch row (pad=-1, or pad=4 held by the other block);
    # repeated ids on both sides so frequency scaling sees counts above one
    ids = torch.tensor([[0, 4, 1, 5], [4, 2, 0, 3]])
    grad = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    want = torch.ops.aten.embedding_dense_backward(grad, ids, 6, pad, scale)
    got = rowwise_grad(grad, ids, 0, 3, pad, scale)
    assert got.shape == (3, 3) and got.is_contiguous()
    torch.testing.assert_close(got, want[:3], rtol=0, atol=0)
    torch.testing.assert_close(rowwise_grad(grad, ids, 3, 3, pad, scale), want[3:], rtol=0, atol=0)
    assert rowwise_grad(grad, ids, 6, 0, pad, scale).shape == (0, 3)  # an empty block
