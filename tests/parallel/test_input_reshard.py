"""input_reshard: a checkpointed TP block keeps only its slice of the replicated input between forward
and backward, gathers it back in the backward, and trains exactly like the plain block."""

from __future__ import annotations

import copy
import importlib

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from shardwise.testing import run_on_ranks, worker_mesh


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(8, 12), nn.Linear(12, 8)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class Checkpointed(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return checkpoint(self.inner, x, use_reentrant=False)


def _record(saved, packed):
    saved.append(tuple(getattr(packed, "local", packed).shape))  # a plain tensor's piece, or a tensor
    return packed


def reshard(rank, world, dim, rows):
    from shardwise.parallel import ColwiseParallel, RowwiseParallel, input_reshard, parallelize_module
    from shardwise.tensor import CollectiveCounter

    mesh = worker_mesh((world,))
    torch.manual_seed(0)
    ref = MLP()
    mlp = parallelize_module(copy.deepcopy(ref), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    model = input_reshard(Checkpointed(mlp), mesh, dim)
    x = torch.randn(rows, 3, 8, generator=torch.Generator().manual_seed(1))  # the same on every TP rank
    saved = []
    impl = importlib.import_module("shardwise.parallel.input_reshard")
    pack = impl._pack
    impl._pack = lambda mesh, d, t: _record(saved, pack(mesh, d, t))
    try:
        model(x.clone().requires_grad_())
    finally:
        impl._pack = pack
    xr = x.clone().requires_grad_()
    ref(xr).sum().backward()
    xs = x.clone().requires_grad_()
    out = model(xs)
    with CollectiveCounter() as c:
        out.sum().backward()
    err = max((xs.grad - xr.grad).abs().max().item(), (out - ref(x)).abs().max().item(),
              *((p.grad.full_tensor() - q.grad).abs().max().item() for p, q in zip(mlp.parameters(), ref.parameters())))
    return err, c.counts, saved


@pytest.mark.parametrize("rows", [4, 5])  # 5 rows: uneven pieces over 2 ranks
def test_input_reshard_checkpointed_block_trains_like_plain(rows):
    for rank, (err, counts, saved) in enumerate(run_on_ranks(reshard, 2, 0, rows)):
        assert err < 1e-6, err
        assert saved == [((rows + 1) // 2 if rank == 0 else rows // 2, 3, 8)], saved  # only this rank's rows
        assert counts.get("all_gather", 0) == 1, counts  # the input gathered back for the recomputation


def test_input_reshard_none_and_bad_mesh():
    from shardwise.parallel import input_reshard

    m = nn.Linear(2, 2)
    assert input_reshard(m, None, None) is m
    with pytest.raises(TypeError, match="input_reshard_dim='0'"):
        input_reshard(m, None, "0")
