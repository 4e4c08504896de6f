"""The validator's per-rank inputs: random pieces of a pending reduction reduce to the full value."""

from __future__ import annotations

import pytest
import torch

from shardwise.tensor.validate.per_rank import partial_pieces


_PIECE_CASES = [(op, dt) for op in ("sum", "avg", "max", "min") for dt in (torch.float32, torch.int64, torch.bool)
                if not (dt == torch.bool and op in ("sum", "avg"))]  # a bool cannot hold a pending sum


@pytest.mark.parametrize("op,dtype", _PIECE_CASES)
def test_partial_pieces_reduce_to_the_full_value(op, dtype):
    gen = torch.Generator().manual_seed(1)
    full = (torch.randn(4, 5) * 4).to(dtype)
    pieces = partial_pieces(full, op, 3, gen)
    st = torch.stack(pieces)
    got = {"sum": lambda: st.sum(0), "avg": lambda: st.sum(0) / 3, "max": lambda: st.amax(0),
           "min": lambda: st.amin(0)}[op]().to(dtype)
    assert torch.allclose(got.double(), full.double(), atol=1e-5)
    if op in ("max", "min") and dtype != torch.bool:
        assert not all(torch.equal(p, full) for p in pieces)  # not the trivial split
