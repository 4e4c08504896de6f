"""F.scaled_dot_product_attention on DTensors sharded over heads or batch: forward output and the
gradients of q, k, v equal the single-process call, with no collective (a rank holding no head
included). On CPU this is the flash kernel for CPU; under `make test-gpu` the same cases run the CUDA
kernels (flash / efficient / cuDNN, as torch picks them for the dtype)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from shardwise.testing import pool_device_type, run_on_ranks, worker_device, worker_mesh

# (name, q heads, k/v heads, placement dim, mask form)
CASES = [
    ("heads-causal", 4, 4, 1, None),
    ("heads-uneven", 3, 3, 1, "LS"),
    ("one-head-on-two-ranks", 1, 1, 1, None),  # rank 1 holds no head: empty outputs, no kernel call
    ("heads-mask-per-head", 4, 4, 1, "BHLS"),
    ("heads-gqa", 4, 2, 1, None),
    ("batch-padding-mask", 4, 4, 0, "B1LS"),
]


def _inputs(hq: int, hkv: int, mask_form, device, dtype):
    g = torch.Generator().manual_seed(hq * 10 + hkv)
    b, lq, lk, e = 3, 6, 6, 8
    # laid out as a model's q/k/v are: (B, L, H, E) memory seen through .transpose(1, 2), the layout
    # the kernel gives the gradients in
    heads = lambda h, length: torch.randn(b, length, h, e, generator=g).transpose(1, 2)  # noqa: E731
    q, k, v = heads(hq, lq), heads(hkv, lk), heads(hkv, lk)
    mask = {None: None, "LS": (lq, lk), "BHLS": (b, hq, lq, lk), "B1LS": (b, 1, lq, lk)}[mask_form]
    mask = None if mask is None else torch.randn(*mask, generator=g)
    to = lambda t: None if t is None else t.to(device, dtype)  # noqa: E731
    return to(q), to(k), to(v), to(mask), to(torch.randn(b, hq, lq, e, generator=g))


def attention_case(rank, world, hq, hkv, dim, mask_form, dtype_name):
    from shardwise.tensor import CollectiveCounter, Replicate, Shard, distribute_tensor

    mesh = worker_mesh((world,))
    dtype = getattr(torch, dtype_name)
    q, k, v, mask, grad = _inputs(hq, hkv, mask_form, worker_device(), dtype)
    kw = {"is_causal": mask is None, "enable_gqa": hq != hkv}
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*leaves, attn_mask=mask, **kw)
    ref.backward(grad)

    # leaves (B, L, H, E) as a model's projections are, seen as (B, H, L, E) through a transpose
    lay = {1: 2, 0: 0}[dim]
    dist = [distribute_tensor(t.transpose(1, 2), mesh, [Shard(lay)]).requires_grad_() for t in (q, k, v)]
    # a replicated mask: the rule keeps it whole where it broadcasts, else each rank slices its part
    dmask = None if mask is None else distribute_tensor(mask, mesh, [Replicate()])
    dgrad = distribute_tensor(grad, mesh, [Shard(dim)])
    with CollectiveCounter() as counter:
        out = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in dist), attn_mask=dmask, **kw)
        out.backward(dgrad)
    assert out.placements == (Shard(dim),), out.placements
    assert all(t.grad.placements == (Shard(lay),) for t in dist), [t.grad.placements for t in dist]
    errs = [(out.full_tensor() - ref).abs().max().item()]
    errs += [(d.grad.full_tensor().transpose(1, 2) - r.grad).abs().max().item() for d, r in zip(dist, leaves)]
    return max(errs), counter.counts


@pytest.mark.gpu
@pytest.mark.parametrize("name,hq,hkv,dim,mask_form", CASES, ids=[c[0] for c in CASES])
def test_sdpa_sharded_equals_single_process(name, hq, hkv, dim, mask_form):
    # float32 on CPU; half precision on CUDA, where the flash and efficient kernels run
    dtype, tol = ("float32", 1e-5) if pool_device_type() == "cpu" else ("float16", 2e-3)
    for err, counts in run_on_ranks(attention_case, 2, hq, hkv, dim, mask_form, dtype):
        assert err < tol, (name, err)
        assert counts == {}, counts  # attention is local to each (batch, head) pair


def gqa_heads_not_divisible(rank, world):
    from shardwise.tensor import Replicate, Shard, distribute_tensor

    mesh = worker_mesh((world,))
    q, k, v, _, _ = _inputs(6, 3, None, worker_device(), torch.float32)
    dq, dk, dv = (distribute_tensor(t, mesh, [Shard(1)]) for t in (q, k, v))
    out = F.scaled_dot_product_attention(dq, dk, dv, enable_gqa=True)
    ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    heads_not_sharded = out.placements in ((Replicate(),), (Shard(0),))
    return heads_not_sharded, (out.full_tensor() - ref).abs().max().item()


def test_gqa_with_kv_heads_not_divisible_does_not_shard_heads():
    # 3 k/v heads on 2 ranks would give rank 0 query heads of k/v head 1 and 2: heads are not sharded
    for moved, err in run_on_ranks(gqa_heads_not_divisible, 2):
        assert moved and err < 1e-5, (moved, err)
