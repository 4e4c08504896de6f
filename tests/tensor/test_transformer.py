"""A transformer block (attention, layer norm, MLP) with DTensor parameters trains like one process:
Megatron-style heads (q/k/v column-wise, output row-wise) and batch-sharded data parallel."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from shardwise.testing import run_on_ranks, worker_mesh

DIM, HEADS, HIDDEN = 16, 4, 24


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        # no key bias: softmax is invariant to it, so its true gradient is 0 and Adam would amplify
        # rounding noise (~1e-9) into full-size steps in any two implementations
        self.q, self.k, self.v = nn.Linear(DIM, DIM), nn.Linear(DIM, DIM, bias=False), nn.Linear(DIM, DIM)
        self.o = nn.Linear(DIM, DIM)
        self.fc1, self.fc2 = nn.Linear(DIM, HIDDEN), nn.Linear(HIDDEN, DIM)
        self.head = nn.Linear(DIM, 7)

    def forward(self, x):
        b, s, _ = x.shape
        h = self.ln1(x)
        heads = lambda t: t.view(b, s, HEADS, -1).transpose(1, 2)  # noqa: E731
        q, k, v = heads(self.q(h)), heads(self.k(h)), heads(self.v(h))
        att = torch.softmax(q @ k.transpose(-2, -1) / (DIM // HEADS) ** 0.5, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, s, -1)
        x = x + self.o(y)
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return self.head(x).mean(dim=1)


def _shard(model, mesh, megatron):
    from shardwise.tensor import Replicate, Shard, distribute_tensor

    col = {"q", "k", "v", "fc1"}
    row = {"o", "fc2"}
    for name, mod in model.named_children():
        for attr, p in list(mod.named_parameters(recurse=False)):
            pl = Replicate()
            if megatron and name in col:
                pl = Shard(0)
            elif megatron and name in row and attr == "weight":
                pl = Shard(1)
            setattr(mod, attr, nn.Parameter(distribute_tensor(p.detach(), mesh, [pl])))


def train_block(rank, world, megatron, steps):
    from shardwise.tensor import Replicate, Shard, distribute_tensor

    mesh = worker_mesh((world,))
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(6, 5, DIM, generator=g), torch.randint(0, 7, (6,), generator=g)
    torch.manual_seed(0)
    ref = Block()
    torch.manual_seed(0)
    model = Block()
    _shard(model, mesh, megatron)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=0.01)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, foreach=True)
    in_pl = Replicate() if megatron else Shard(0)
    dx, dy = distribute_tensor(x, mesh, [in_pl]), distribute_tensor(y, mesh, [in_pl])
    for _ in range(steps):
        for m, o, a, b in ((ref, opt_ref, x, y), (model, opt, dx, dy)):
            F.cross_entropy(m(a), b).backward()
            o.step()
            o.zero_grad()
    return max((p.full_tensor() - q).abs().max().item() for p, q in zip(model.parameters(), ref.parameters()))


@pytest.mark.parametrize("megatron", [True, False], ids=["megatron-heads", "batch-sharded"])
def test_transformer_block_trains_like_single_process(megatron):
    for err in run_on_ranks(train_block, 2, megatron, 3):
        assert err < 1e-5, err
