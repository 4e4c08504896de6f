"""Bad input gets a clear error on every rank; interop with torch.distributed.tensor; cache behaviour."""

from __future__ import annotations

import pytest
import torch

from shardwise.testing import run_on_ranks, worker_mesh


def test_placements_are_small_frozen_values():
    from shardwise.tensor import MaskPartial, Partial, Replicate, Shard

    assert [str(p) for p in (Shard(0), Replicate(), Partial(), Partial("max"))] == ["S(0)", "R", "P(sum)", "P(max)"]
    assert repr(Shard(1)) == "Shard(dim=1)" and repr(Partial()) == "Partial(reduce_op='sum')"
    assert Shard(0) == Shard(0) and hash(Shard(0)) == hash(Shard(0)) and Shard(0) != Shard(1)
    mp = MaskPartial(10, 0)
    assert isinstance(mp, Partial) and mp != Partial() and hash(mp) == hash(MaskPartial(10, 0))
    with pytest.raises(AttributeError):
        Shard(0).dim = 1
    with pytest.raises(ValueError, match="reduce_op must be one of"):
        Partial("prod")
    with pytest.raises(TypeError, match="dim must be an int"):
        Shard("0")


def _catch(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test inspects the type and message
        return type(e).__name__, str(e)
    return None


def bad_inputs(rank, world):
    from shardwise.tensor import DTensor, Replicate, Shard, distribute_tensor, init_device_mesh

    mesh = worker_mesh((world,))
    mesh2 = worker_mesh((world // 2, 2))
    x = torch.randn(4, 6)
    d = distribute_tensor(x, mesh, [Shard(0)])
    e = distribute_tensor(x, mesh2, [Replicate(), Shard(1)])
    uneven_local = torch.randn(3 if rank == 0 else 2, 6)
    cases = {
        "shard_dim": lambda: distribute_tensor(x, mesh, [Shard(2)]),
        "count": lambda: distribute_tensor(x, mesh, [Shard(0), Replicate()]),
        "not_placement": lambda: distribute_tensor(x, mesh, ["S0"]),
        "meshes": lambda: d + e,
        "plain_tensor": lambda: d + torch.ones(4, 6),
        "run_check": lambda: DTensor.from_local(uneven_local, mesh, [Shard(0)], run_check=True),
        "no_rule": lambda: torch.poisson(d.abs()),  # random values: no rule
    }
    out = {k: _catch(f) for k, f in cases.items()}
    out["scalar_ok"] = _catch(lambda: (d + torch.tensor(2.0)).full_tensor())
    return out


def test_bad_inputs_raise_clear_errors_on_every_rank():
    results = run_on_ranks(bad_inputs, 4)
    for r in results:
        assert r == results[0], "every rank must raise the same error"
    r = results[0]
    assert r["shard_dim"][0] == "ValueError" and "S(2) on a 2-D tensor" in r["shard_dim"][1]
    assert r["count"][0] == "ValueError" and "mesh has 1 dimension" in r["count"][1]
    assert r["not_placement"][0] == "TypeError"
    assert r["meshes"][0] == "ValueError" and "different meshes" in r["meshes"][1]
    assert r["plain_tensor"][0] == "ValueError" and "plain torch.Tensor of shape (4, 6)" in r["plain_tensor"][1]
    assert r["run_check"][0] == "ValueError" and "rank 1 has (2, 6), expected (3, 6)" in r["run_check"][1]
    assert r["no_rule"][0] == "NotImplementedError" and "aten.poisson" in r["no_rule"][1]
    assert r["scalar_ok"] is None


def interop(rank, world):
    import torch.distributed.tensor as tdt

    from shardwise.tensor import DTensor, Shard, distribute_tensor

    mesh = worker_mesh((world,))
    x = torch.randn(5, 3)
    ours = distribute_tensor(x, mesh, [Shard(0)], src_data_rank=None).requires_grad_()
    theirs = ours.to_torch()
    shared = theirs.to_local().data_ptr() == ours._local_tensor.data_ptr()
    placement_ok = theirs.placements == (tdt.Shard(0),) and theirs.shape == x.shape
    (theirs.full_tensor() * 3).sum().backward()
    grad_ok = torch.allclose(ours.grad.full_tensor(), torch.full_like(x, 3.0))
    t = tdt.distribute_tensor(x, mesh, [tdt.Shard(1)])
    back = DTensor.from_torch(t)
    back_ok = back.placements == (Shard(1),) and torch.equal(back.full_tensor(), t.full_tensor())
    return shared, placement_ok, grad_ok, back_ok


def test_interop_with_torch_dtensor_shares_data_and_gradients():
    for res in run_on_ranks(interop, 3):
        assert res == (True, True, True, True)


def caching(rank, world):
    from shardwise.tensor import Shard, distribute_tensor, fast_path, gather_fallback, propagation_cache
    from shardwise.tensor.dtensor import _FASTPATH

    mesh = worker_mesh((world,))
    a = distribute_tensor(torch.randn(6, 4), mesh, [Shard(0)])
    cache = propagation_cache()
    with fast_path(False):  # count the per-op cache itself
        (a * 2.0).relu()
        hits, misses = cache.hits, cache.misses
        for scale in (3.0, 4.0, 5.0):  # new scalar values reuse the plan (pointwise keys hold scalar types)
            (a * scale).relu()
        extra_misses = cache.misses - misses
        extra_hits = cache.hits - hits
    (a * 2.0).relu()
    n_fast = len(_FASTPATH.plans)
    for scale in (3.0, 4.0, 5.0):  # and the fast path learns scalar-insensitive functions too
        (a * scale).relu()
    extra_misses += len(_FASTPATH.plans) - n_fast
    with gather_fallback():
        with pytest.warns(UserWarning, match="no sharding strategy"):
            # an op no family covers (weight norm's fused kernel)
            n = torch.ops.aten._weight_norm_interface(a, a.sum(1, keepdim=True), 0)[0]
        full = a.full_tensor()
        want = torch.ops.aten._weight_norm_interface(full, full.sum(1, keepdim=True), 0)[0]
        fallback_ok = torch.allclose(n.full_tensor(), want, atol=1e-5)
    return extra_misses, extra_hits, fallback_ok


def test_cache_hits_for_new_scalars_and_opt_in_fallback():
    for misses, hits, fallback_ok in run_on_ranks(caching, 2):
        assert misses == 0 and hits == 6 and fallback_ok


def indexing(rank, world):
    from shardwise.tensor import Shard, distribute_tensor, propagation_cache

    mesh = worker_mesh((world,))
    full = torch.arange(12.0).reshape(4, 3)
    d = distribute_tensor(full, mesh, [Shard(1)])
    out = {}
    with torch.no_grad():  # the fast path must not choke on unhashable indices (slices)
        out["slice"] = torch.equal(d[0:2].full_tensor(), full[0:2])
        out["select"] = torch.equal(d[1].full_tensor(), full[1])
        d[0:1] = 5.0
        expect = full.clone()
        expect[0:1] = 5.0
        out["setitem"] = torch.equal(d.full_tensor(), expect)
    e = distribute_tensor(full, mesh, [Shard(1)]).requires_grad_()
    e[1:3].sum().backward()
    g = torch.zeros(4, 3)
    g[1:3] = 1
    out["grad"] = torch.equal(e.grad.full_tensor(), g)
    before = len(propagation_cache().plans)
    for _ in range(3):  # tensors inside list arguments must not enter cache keys by identity
        try:
            d[torch.tensor([0, 2])]
        except ValueError as e:  # a plain index tensor must be made a DTensor first
            out["index_error"] = "plain torch.Tensor of shape (2,)" in str(e)
    out["bounded"] = len(propagation_cache().plans) - before <= 1
    return out


def test_indexing_with_and_without_autograd():
    for res in run_on_ranks(indexing, 2):
        assert all(res.values()), res
