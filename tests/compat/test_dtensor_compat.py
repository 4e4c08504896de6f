"""shardwise.tensor used the way PyTorch DTensor users' code uses torch.distributed.tensor (4 gloo ranks).

implicit_replication, CommDebugMode, the mesh of a ``with mesh:`` block, ranks outside a mesh,
Partial("product") and the bitwise reductions, equal / bitwise_or_ / mul.out / new_empty_strided,
torch.load(weights_only=True) and run_check's requires_grad (per-thread state: test_dtensor_threads.py).
Each result is checked against plain PyTorch on full tensors (or PyTorch's own DTensor).
"""

from __future__ import annotations

import io
import threading

import torch

from shardwise.testing.harness import run_on_ranks, worker_mesh

_MESHES: dict = {}  # per worker: a mesh of ranks 0 and 1 only (building it is collective, once)


def _half_mesh():
    from torch.distributed.device_mesh import DeviceMesh

    if "half" not in _MESHES:
        _MESHES["half"] = DeviceMesh("cpu", [0, 1])
    return _MESHES["half"]


def _error(fn) -> str:
    try:
        fn()
        return "no error"
    except (ValueError, NotImplementedError) as e:
        return f"{type(e).__name__}: {e}"


# -- 1. implicit_replication ---------------------------------------------------------------------

def implicit_calls(rank, world):
    from shardwise.tensor import Shard, distribute_tensor
    from shardwise.tensor.experimental import implicit_replication

    mesh = worker_mesh((world,))
    x, v, w = torch.randn(8, 4, generator=torch.Generator().manual_seed(1)), torch.arange(4.0), torch.ones(8, 4)
    d = distribute_tensor(x, mesh, [Shard(0)])
    before = _error(lambda: d + v)
    with implicit_replication():
        sums = [(d + v).full_tensor() for _ in range(2)]  # the second call is a cache hit
        prod = (d * w).full_tensor()
        seen_by_thread = []
        t = threading.Thread(target=lambda: seen_by_thread.append(_error(lambda: d + v)))
        t.start()
        t.join(30)
    after = _error(lambda: d + v)  # the plan cached inside the block is refused here
    ok = all(torch.equal(s, x + v) for s in sums) and torch.equal(prod, x * w)
    return {"ok": ok, "before": before, "after": after, "thread": seen_by_thread}


def test_implicit_replication_treats_plain_tensors_as_replicate_inside_the_block_only():
    for r in run_on_ranks(implicit_calls, 4):
        assert r["ok"]
        for err in (r["before"], r["after"], r["thread"][0]):
            assert err.startswith("ValueError: aten.add.Tensor: a plain torch.Tensor of shape (4,)"), err
            assert "implicit_replication()" in err


# -- 2. CommDebugMode ----------------------------------------------------------------------------

def comm_mode_calls(rank, world):
    from torch.distributed.tensor.debug import CommDebugMode as TorchCommDebugMode

    from shardwise.tensor import Replicate, Shard, distribute_tensor
    from shardwise.tensor.debug import CommDebugMode

    mesh = worker_mesh((world,))
    funcol = torch.ops.c10d_functional
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(2), requires_grad=True)
    a = distribute_tensor(x, mesh, [Shard(0)])
    b = distribute_tensor(x.detach() * 2, mesh, [Shard(1)])
    ours = CommDebugMode()
    with ours:
        c = a + b  # one input moves inside op dispatch (S(1) -> S(0): an all-to-all)
        r = c.redistribute(mesh, [Replicate()])  # all-gather
        loss = c.sum().full_tensor()  # pending sum: all-reduce
        loss.backward()
    theirs = TorchCommDebugMode()
    with theirs:
        a + b  # PyTorch's mode is switched off while shardwise's dispatch runs
    with ours:
        a.redistribute(mesh, [Replicate()])
    return {"counts": {str(k): v for k, v in ours.get_comm_counts().items()},
            "gather": ours.get_comm_counts()[funcol.all_gather_into_tensor], "theirs": theirs.get_total_counts(),
            "right": torch.allclose(r.full_tensor(), x.detach() * 3)
            and torch.equal(a.grad.full_tensor(), torch.ones(8, 6)) and torch.allclose(loss, x.detach().sum() * 3)}


def test_comm_debug_mode_sees_collectives_inside_dispatch_keyed_like_torch():
    for r in run_on_ranks(comm_mode_calls, 4):
        assert r["right"]
        # the last block only: entering the mode clears it, as PyTorch's
        assert r["counts"] == {"c10d_functional.all_gather_into_tensor": 1} and r["gather"] == 1
        assert r["theirs"] == 0  # why shardwise.tensor.debug.CommDebugMode exists


def comm_mode_totals(rank, world):
    from shardwise.tensor import CollectiveCounter, Shard, distribute_tensor
    from shardwise.tensor.debug import CommDebugMode

    mesh = worker_mesh((world,))
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(2), requires_grad=True)
    a, b = distribute_tensor(x, mesh, [Shard(0)]), distribute_tensor(x.detach(), mesh, [Shard(1)])
    ours, counter = CommDebugMode(), CollectiveCounter()
    with ours, counter:
        c = a + b
        c.sum().full_tensor().backward()
    return {"counts": {str(k): v for k, v in ours.get_comm_counts().items()}, "counter": dict(counter.counts),
            "dtensor_ops": sum(len(v["operations_list"]) for v in ours.comm_module_operation_counts.values())}


def test_comm_debug_mode_counts_what_shardwise_issues():
    for r in run_on_ranks(comm_mode_totals, 4):
        # shardwise's own counter is the ground truth of what it issued
        assert r["counter"] == {"all_to_all": 1, "all_reduce": 1}, r["counter"]
        assert r["counts"] == {"c10d_functional.all_to_all_single": 1, "c10d_functional.all_reduce": 1}, r["counts"]
        assert r["dtensor_ops"] > 0


def noop_redistribute_grad(rank, world):
    from torch.distributed.tensor import DTensor as TorchDTensor, Partial as TorchPartial, \
        Replicate as TorchReplicate

    from shardwise.tensor import DTensor, Partial, Replicate
    from shardwise.tensor.debug import CommDebugMode

    mesh = worker_mesh((world,))
    local = torch.randn(6, 3, generator=torch.Generator().manual_seed(6))
    grads, counts = [], []
    for dt, R, P in ((DTensor, Replicate, Partial), (TorchDTensor, TorchReplicate, TorchPartial)):
        leaf = dt.from_local(local.clone(), mesh, [R()]).detach().requires_grad_()
        cm = CommDebugMode()  # shardwise's: it counts PyTorch's DTensor's collectives too
        with cm:
            out = leaf.redistribute(mesh, [R()]).to_local(grad_placements=[P()])
            out.backward(torch.full_like(out, float(rank + 1)))
        grads.append((tuple(str(p) for p in leaf.grad.placements), leaf.grad.to_local()))
        counts.append(cm.get_total_counts())
    return grads, counts


def test_a_redistribute_that_moves_nothing_still_brings_a_partial_gradient_home():
    for (ours, theirs), counts in run_on_ranks(noop_redistribute_grad, 4):
        assert ours[0] == ("R",) and theirs[0] == ("R",) and counts == [1, 1]  # both print Replicate as R
        torch.testing.assert_close(ours[1], torch.full((6, 3), 10.0))  # 1 + 2 + 3 + 4
        torch.testing.assert_close(ours[1], theirs[1])


# -- 3. the mesh of a `with mesh:` block --------------------------------------------------------

def with_mesh_calls(rank, world):
    from shardwise.tensor import DTensor, Shard, distribute_tensor

    mesh, mesh2 = worker_mesh((world,)), worker_mesh((2, 2))
    x = torch.arange(32.0).reshape(8, 4)
    with mesh:
        d = distribute_tensor(x, placements=[Shard(0)])
        f = DTensor.from_local(torch.ones(2, 4))  # placements default to Replicate
        with mesh2:
            inner = distribute_tensor(x)
        outer_again = distribute_tensor(x, placements=[Shard(1)])
    return {"d": d.device_mesh is mesh and torch.equal(d.full_tensor(), x) and d.placements == (Shard(0),),
            "f": f.device_mesh is mesh and tuple(f.shape) == (2, 4) and f.placements[0].is_replicate(),
            "nested": inner.device_mesh is mesh2 and outer_again.device_mesh is mesh,
            "outside": _error(lambda: distribute_tensor(x, placements=[Shard(0)])),
            "outside_from_local": _error(lambda: DTensor.from_local(torch.ones(2)))}


def test_device_mesh_from_a_with_block_like_torch():
    for r in run_on_ranks(with_mesh_calls, 4):
        assert r["d"] and r["f"] and r["nested"]
        assert "distribute_tensor: device_mesh=None and no `with mesh:` block" in r["outside"]
        assert "from_local: device_mesh=None" in r["outside_from_local"]


# -- 4. ranks outside a mesh ---------------------------------------------------------------------

def outside_calls(rank, world):
    from torch.distributed.tensor import Shard as TorchShard, distribute_tensor as torch_distribute

    from shardwise.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    from shardwise.tensor.debug import CommDebugMode

    mesh = _half_mesh()
    x = torch.arange(24.0).reshape(6, 4)
    theirs = torch_distribute(x, mesh, [TorchShard(0)]).to_local()
    cm = CommDebugMode()
    with cm:
        d = distribute_tensor(x, mesh, [Shard(0)])
        s = distribute_tensor(x, mesh, [Shard(1)])
        y = (d + s) * 2  # moves one input inside dispatch on the mesh's ranks
        total = y.sum()
        full = y.full_tensor()
        p = DTensor.from_local(torch.ones(3), mesh, [Partial()]).redistribute(mesh, [Replicate()])
        eq = torch.equal(d, s)
    return {"local": tuple(d.to_local().shape), "theirs": tuple(theirs.shape), "shape": tuple(y.shape),
            "total": (tuple(total.to_local().shape), total.placements), "full": full, "p": p.to_local(),
            "eq": eq, "comms": cm.get_total_counts(), "x": x}


def test_ranks_outside_a_mesh_hold_empty_pieces_and_run_no_collectives():
    res = run_on_ranks(outside_calls, 4)
    for rank, r in enumerate(res):
        assert r["local"] == r["theirs"]  # PyTorch's DTensor on the same mesh
        assert r["shape"] == (6, 4)  # the global shape is known everywhere
        if rank < 2:
            assert torch.equal(r["full"], r["x"] * 4) and torch.equal(r["p"], torch.full((3,), 2.0))
            assert r["eq"] is True and r["comms"] > 0
        else:
            assert r["local"] == (0,) and r["full"].numel() == 0 and r["p"].numel() == 0
            # the op returns None there, which torch.equal's binding turns into False (as with PyTorch's)
            assert r["total"][0] == () and r["eq"] is False and r["comms"] == 0


# -- 5. Partial reduce ops -----------------------------------------------------------------------

def partial_calls(rank, world):
    from torch.distributed.tensor import DTensor as TorchDTensor, Partial as TorchPartial

    from shardwise.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    mesh = worker_mesh((world,))
    g = torch.Generator().manual_seed(3)
    pieces = [torch.rand(4, 3, generator=g) + 0.5 for _ in range(world)]  # every rank's partial value
    ints = [torch.randint(0, 64, (5,), generator=g) for _ in range(world)]
    p = DTensor.from_local(pieces[rank], mesh, [Partial("product")])
    out = {"product": p.full_tensor(), "torch_product": TorchDTensor.from_local(
        pieces[rank], mesh, [TorchPartial("product")]).full_tensor(),
        "scatter": p.redistribute(mesh, [Shard(0)]).full_tensor(),
        "view": p.reshape(12).full_tensor(),  # a view keeps the pending product
        "expected": torch.stack(pieces).prod(0), "ints": ints}
    r = distribute_tensor(pieces[0], mesh, [Replicate()])
    for op in ("product", "band", "bor", "bxor", "max", "sum"):  # Replicate -> Partial -> Replicate is exact
        src = r if op in ("product", "max", "sum") else distribute_tensor(ints[0], mesh, [Replicate()])
        out[f"roundtrip_{op}"] = torch.equal(src.redistribute(mesh, [Partial(op)]).full_tensor(), src.to_local())
    for op in ("band", "bor", "bxor"):
        out[op] = DTensor.from_local(ints[rank], mesh, [Partial(op)]).full_tensor()
    out["bad"] = _error(lambda: Partial("mean"))
    return out


def test_partial_product_and_bitwise_reductions_match_torch():
    for r in run_on_ranks(partial_calls, 4):
        torch.testing.assert_close(r["product"], r["expected"])
        torch.testing.assert_close(r["product"], r["torch_product"])  # PyTorch's own DTensor
        torch.testing.assert_close(r["scatter"], r["expected"])
        torch.testing.assert_close(r["view"], r["expected"].reshape(12))
        a, b, c, d = r["ints"]
        assert torch.equal(r["band"], a & b & c & d) and torch.equal(r["bor"], a | b | c | d)
        assert torch.equal(r["bxor"], a ^ b ^ c ^ d)
        assert all(r[f"roundtrip_{op}"] for op in ("product", "band", "bor", "bxor", "max", "sum"))
        assert "reduce_op must be one of" in r["bad"] and "'product'" in r["bad"]


# -- 6. rules: equal, bitwise_or_, mul.out, new_empty_strided -----------------------------------

def rule_calls(rank, world):
    from shardwise.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    mesh = worker_mesh((world,))
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(7, 5, generator=g), torch.randn(7, 5, generator=g)
    a, a1 = distribute_tensor(x, mesh, [Shard(0)]), distribute_tensor(x, mesh, [Shard(1)])
    b = distribute_tensor(y, mesh, [Shard(0)])
    piece = a.to_local().clone()
    if rank == 3 and piece.numel():
        piece[0, 0] += 1  # only rank 3's piece differs: every rank must answer False
    odd = DTensor.from_local(piece, mesh, [Shard(0)], shape=x.shape, stride=x.stride())
    out = {"equal": [torch.equal(a, a1), torch.equal(a, b), torch.equal(a, odd),
                     torch.equal(a, distribute_tensor(x[:6], mesh, [Shard(0)]))]}
    i = torch.randint(0, 99, (6, 3), generator=g)
    j = torch.randint(0, 99, (3,), generator=g)
    di = distribute_tensor(i, mesh, [Shard(0)])
    same = di.bitwise_or_(distribute_tensor(j, mesh, [Replicate()]))
    out["bitwise_or_"] = (same is di, torch.equal(di.full_tensor(), i | j), di.placements)
    for pl in ([Shard(0)], [Shard(1)], [Replicate()], [Partial()]):
        o = distribute_tensor(torch.zeros(7, 5), mesh, pl)
        ret = torch.mul(a, b, out=o)
        out[f"mul.out {pl[0]}"] = (ret is o, o.placements == tuple(pl), torch.allclose(o.full_tensor(), x * y))
    n = a.new_empty_strided((3, 4), (1, 3), dtype=torch.float64)
    ref = x.new_empty_strided((3, 4), (1, 3), dtype=torch.float64)
    out["new_empty_strided"] = (n.shape == ref.shape, n.stride() == ref.stride(), n.dtype == ref.dtype,
                                n.to_local().stride() == ref.stride())
    return out


def test_equal_bitwise_or_mul_out_new_empty_strided_match_torch():
    for r in run_on_ranks(rule_calls, 4):
        assert r["equal"] == [True, False, False, False]
        assert r["bitwise_or_"][:2] == (True, True)
        for k, v in r.items():
            if k.startswith("mul.out"):
                assert v == (True, True, True), (k, v)
        assert all(r["new_empty_strided"])


# -- 7. torch.save / torch.load(weights_only=True) -----------------------------------------------

def save_load_calls(rank, world):
    from shardwise.tensor import DTensor, Partial, Shard, distribute_tensor

    mesh = worker_mesh((2, 2))
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(5))
    saved = {"w": distribute_tensor(x, mesh, [Shard(0), Shard(1)]),
             "p": DTensor.from_local(torch.ones(3), mesh, [Partial("max"), Partial()])}
    buf = io.BytesIO()
    torch.save(saved, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    w, p = loaded["w"], loaded["p"]
    return {"types": (type(w) is DTensor, type(p) is DTensor), "placements": (w.placements, p.placements),
            "local": torch.equal(w.to_local(), saved["w"].to_local()), "full": torch.equal(w.full_tensor(), x),
            "p": p.full_tensor(), "mesh": w.device_mesh == mesh}


def test_torch_load_weights_only_of_a_saved_dtensor():
    from shardwise.tensor import Partial, Shard

    for r in run_on_ranks(save_load_calls, 4):
        assert r["types"] == (True, True) and r["local"] and r["full"] and r["mesh"]
        assert r["placements"] == ((Shard(0), Shard(1)), (Partial("max"), Partial()))
        assert torch.equal(r["p"], torch.full((3,), 2.0))


# -- 8. run_check compares requires_grad ---------------------------------------------------------

def run_check_calls(rank, world):
    from shardwise.tensor import DTensor, Shard

    mesh = worker_mesh((world,))
    local = torch.ones(2, 3, requires_grad=rank == 1)
    return _error(lambda: DTensor.from_local(local, mesh, [Shard(0)], run_check=True))


def test_run_check_compares_requires_grad():
    errs = run_on_ranks(run_check_calls, 4)
    assert len(set(errs)) == 1, errs  # the same error on every rank
    assert "ranks disagree on the requires_grad" in errs[0] and "rank 1 has True" in errs[0]
