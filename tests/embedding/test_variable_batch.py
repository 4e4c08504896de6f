"""Variable batch per feature (VBE, TorchRec's ``inverse_indices``) in the bag collections: the
output equals the same batch with every sample's bag written out, unsharded and sharded (every
sharding type), and training on VBE batches equals the unsharded module trained in plain PyTorch."""

from __future__ import annotations

import copy

import pytest
import torch

from shardwise.embedding import shard
from shardwise.sparse import KeyedJaggedTensor
from shardwise.testing import run_on_ranks, worker_mesh

from . import common

DIM = sum(d * len(f) for _, _, d, f, _ in common.TABLES)
ROWS = {f: v for _, v, _, fs, _ in common.TABLES for f in fs}


def make_vbe(seed: int, batch: int, weighted: bool, drop=()):
    """(a VBE batch: each feature its own number of deduplicated bags and inverse indices mapping the
    batch's samples to them; the same batch with every sample's bag written out, a plain KJT)."""
    g = torch.Generator().manual_seed(seed)
    keys = [f for f in common.all_features() if f not in drop]
    strides = [int(torch.randint(1, batch + 1, (1,), generator=g)) for _ in keys]
    bags = {k: [torch.randint(0, ROWS[k], (int(torch.randint(0, 4, (1,), generator=g)),), generator=g)
                for _ in range(s)] for k, s in zip(keys, strides)}
    wts = {k: [torch.rand(b.numel(), generator=g) + 0.5 for b in bags[k]] for k in keys}
    inverse = torch.stack([torch.randint(0, s, (batch,), generator=g) for s in strides])

    def kjt(per_key_bags, per_key_w, **kw):
        flat = [b for k in keys for b in per_key_bags[k]]
        values = torch.cat(flat + [torch.zeros(0, dtype=torch.int64)])
        weights = torch.cat([w for k in keys for w in per_key_w[k]] + [torch.zeros(0)]) if weighted else None
        return KeyedJaggedTensor(keys, values, weights=weights, lengths=torch.tensor([b.numel() for b in flat]), **kw)

    vbe = kjt(bags, wts, stride_per_key_per_rank=[[s] for s in strides], inverse_indices=(keys, inverse))
    plain = kjt({k: [bags[k][j] for j in inverse[i].tolist()] for i, k in enumerate(keys)},
                {k: [wts[k][j] for j in inverse[i].tolist()] for i, k in enumerate(keys)}, stride=batch)
    return vbe, plain


@pytest.mark.parametrize("weighted", [False, True])
def test_unsharded_vbe_equals_the_written_out_batch(weighted):
    ebc = common.make_ebc(seed=4, weighted=weighted)
    twin = copy.deepcopy(ebc)
    vbe, plain = make_vbe(11, 5, weighted, drop=("fb",))
    assert vbe.variable_stride_per_key() and not plain.variable_stride_per_key()
    out, want = ebc(vbe), twin(plain)
    assert out.values().shape == (5, DIM)
    torch.testing.assert_close(out.values(), want.values(), rtol=0, atol=1e-6)
    target = torch.randn(5, DIM, generator=torch.Generator().manual_seed(3))
    common.loss_fn(out, target).backward()
    common.loss_fn(want, target).backward()
    for n, *_ in common.TABLES:   # the samples that share a bag sum their gradients into it
        torch.testing.assert_close(ebc.embedding_bags[n].weight.grad, twin.embedding_bags[n].weight.grad,
                                   rtol=0, atol=1e-5)


def test_vbe_without_inverse_indices_is_refused():
    vbe, _ = make_vbe(1, 3, False)
    bare = KeyedJaggedTensor(vbe.keys(), vbe.values(), lengths=vbe.lengths(),
                             stride_per_key_per_rank=vbe.stride_per_key_per_rank())
    with pytest.raises(ValueError, match="inverse_indices"):
        common.make_ebc()(bare)


def _vbe_training(rank, world, plan_name, steps):
    ebc = common.make_ebc(seed=2)
    sharded = shard(copy.deepcopy(ebc), common.plans(world)[plan_name], mesh=worker_mesh((world,)),
                    optimizer=common.ADAGRAD)
    ref = copy.deepcopy(ebc)
    opt = common.ADAGRAD(ref.parameters())
    out_err = 0.0
    for step in range(steps):
        batches = [make_vbe(100 * step + r, 2 + (r + step) % 3, False, drop=("fb",) if (r + step) % 3 == 1 else ())
                   for r in range(world)]
        tgts = [torch.randn(p.stride(), DIM, generator=torch.Generator().manual_seed(7 * step + r))
                for r, (_, p) in enumerate(batches)]
        out = sharded(batches[rank][0])
        out_err = max(out_err, (out.values() - ref(batches[rank][1]).values()).abs().max().item())
        common.loss_fn(out, tgts[rank]).backward()
        opt.zero_grad()   # the reference: the mean of every rank's loss on the written-out batches
        (sum(common.loss_fn(ref(p), t) for (_, p), t in zip(batches, tgts)) / world).backward()
        opt.step()
    got = {k: v.full_tensor() for k, v in sharded.state_dict().items()}
    weight_err = max((got[f"embedding_bags.{n}.weight"] - ref.embedding_bags[n].weight).abs().max().item()
                     for n, *_ in common.TABLES)
    return out_err, weight_err


@pytest.mark.parametrize("plan_name", ["mixed", "mixed2"])
def test_sharded_vbe_trains_like_the_unsharded_module(plan_name):
    # mixed: row-, table-, column-wise and data-parallel; mixed2 adds table-row-wise
    for rank, (out_err, weight_err) in enumerate(run_on_ranks(_vbe_training, 2, plan_name, 3, timeout=120)):
        assert out_err <= 1e-5 and weight_err <= 1e-5, (rank, plan_name, out_err, weight_err)
