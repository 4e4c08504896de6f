"""The cached dispatch paths (the torch-function fast path, the dispatcher's quick map) give what the
full path and plain PyTorch give: forward values and placements, gradients and their placements,
requires_grad, views and in-place ops, version-counter errors; with and without autograd."""

from __future__ import annotations

import torch

from shardwise.testing import run_on_ranks, worker_mesh


def _ops():
    def inplace(a, b):
        c = a * 1.5
        c.add_(b)
        return c.mul_(b)  # (relu_ has no rule on Partial: an in-place op keeps its placement)

    return {
        "add": lambda a, b: a + b,
        "mm": lambda a, b: a @ b,
        "relu": lambda a, b: torch.relu(a),
        "sum": lambda a, b: a.sum(0),
        "views": lambda a, b: a.t().unsqueeze(0) * 2,
        "inplace": inplace,
    }


def _placements():
    from shardwise.tensor import Partial, Replicate, Shard

    return {"R": Replicate(), "S(0)": Shard(0), "S(1)": Shard(1), "P": Partial()}


def _run(fn, full_a, full_b, pa, mesh, grad):
    """Forward and (with ``grad``) backward of ``fn`` on fresh leaves; global values and placements."""
    from shardwise.tensor import Replicate, distribute_tensor

    a = distribute_tensor(full_a.detach().requires_grad_(grad), mesh, [pa])
    b = distribute_tensor(full_b.detach().requires_grad_(grad), mesh, [Replicate()])
    out = fn(a, b)
    res = {"out": out.full_tensor().detach(), "out_pl": out.placements, "requires_grad": out.requires_grad,
           "grad_fn": type(out.grad_fn).__name__}
    if grad:
        weight = torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape) / out.numel()
        # autograd.grad, not .backward(): accumulating a grad that must be copied to the leaf's
        # strides calls aten.new_empty_strided, which has no sharding rule yet (the same on every path)
        grads = torch.autograd.grad((out.full_tensor() * weight).sum(), (a, b), allow_unused=True)
        for name, g in zip("ab", grads):
            res[name + "_grad"] = None if g is None else (g.full_tensor(), g.placements)
    return res


def _plain(fn, full_a, full_b, grad):
    a, b = full_a.detach().requires_grad_(grad), full_b.detach().requires_grad_(grad)
    out = fn(a, b)
    res = {"out": out.detach()}
    if grad:
        weight = torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape) / out.numel()
        res["a_grad"], res["b_grad"] = torch.autograd.grad((out * weight).sum(), (a, b), allow_unused=True)
    return res


def _same(x, y, what):
    if isinstance(x, torch.Tensor):
        torch.testing.assert_close(x, y, msg=lambda m: f"{what}: {m}")
    elif isinstance(x, tuple) and x and isinstance(x[0], torch.Tensor):
        _same(x[0], y[0], what + " value")
        assert x[1] == y[1], f"{what} placements: {x[1]} vs {y[1]}"
    else:
        assert x == y, f"{what}: {x} vs {y}"


def compare_paths(rank, world):
    from shardwise.tensor import fast_path, propagation_cache

    mesh = worker_mesh((world,))
    cache = propagation_cache()
    g = torch.Generator().manual_seed(3)
    full_a, full_b = torch.randn(8, 8, generator=g), torch.randn(8, 8, generator=g)
    checked = 0
    for grad in (False, True):
        for pname, pa in _placements().items():
            for oname, fn in _ops().items():
                where = f"{oname} on {pname}, {'autograd' if grad else 'no_grad'}"
                with fast_path(False):
                    full = _run(fn, full_a, full_b, pa, mesh, grad)
                first = _run(fn, full_a, full_b, pa, mesh, grad)  # learns (fast path, quick map)
                misses = cache.misses
                second = _run(fn, full_a, full_b, pa, mesh, grad)  # hits only
                assert cache.misses == misses, f"{where}: the second call missed the plan cache"
                plain = _plain(fn, full_a, full_b, grad)
                for key, value in full.items():
                    _same(first[key], value, f"{where}, first call, {key}")
                    _same(second[key], value, f"{where}, second call, {key}")
                for key, value in plain.items():
                    got = full[key]
                    _same(got if key == "out" or got is None else got[0], value, f"{where}, vs plain torch, {key}")
                checked += 1
    return checked, len(cache.quick)


def test_cached_paths_match_the_full_path_and_plain_torch():
    for checked, quick in run_on_ranks(compare_paths, 2):
        assert checked == 2 * 4 * 6 and quick > 0


def quick_hits(rank, world):
    import torch.nn.functional as F

    from shardwise.tensor import Replicate, Shard, distribute_tensor, fast_path, propagation_cache

    mesh = worker_mesh((world,))
    cache = propagation_cache()
    x = distribute_tensor(torch.randn(8, 4), mesh, [Shard(0)])
    w = distribute_tensor(torch.randn(4, 4).requires_grad_(), mesh, [Replicate()])
    F.relu(x @ w)
    hits, misses = cache.hits, cache.misses
    y = F.relu(x @ w)  # mm, relu and the detach relu saves: three quick hits
    in_quick = (torch.ops.aten.mm.default, x._spec, w._spec) in cache.quick
    counted = (cache.hits - hits, cache.misses - misses)
    with fast_path(False):  # bypasses the quick map: the same counts through the full keys
        hits = cache.hits
        F.relu(x @ w)
        full_hits = cache.hits - hits
    # a version-counter error is still raised: relu saved its result, which is then changed in place
    y.add_(1.0)
    try:
        y.full_tensor().sum().backward()
        version_error = None
    except RuntimeError as e:
        version_error = "modified by an inplace operation" in str(e)
    return in_quick, counted, full_hits, version_error


def test_autograd_calls_hit_the_quick_map_and_keep_version_checks():
    for in_quick, counted, full_hits, version_error in run_on_ranks(quick_hits, 2):
        assert in_quick and counted == (3, 0) and full_hits == 3
        assert version_error is True


def scalar_keys(rank, world):
    from shardwise.tensor import Replicate, distribute_tensor, propagation_cache

    mesh = worker_mesh((world,))
    ints = distribute_tensor(torch.arange(6).reshape(2, 3), mesh, [Replicate()])
    flags = distribute_tensor(torch.tensor([True, False]), mesh, [Replicate()])
    mul = torch.ops.aten.mul.Tensor
    out = []
    with torch._C.DisableTorchFunctionSubclass():  # straight to the dispatcher, as autograd's calls go
        for t, s in ((ints, 2), (ints, 2.0), (ints, 2), (flags, True), (flags, 1), (flags, True)):
            r = mul(t, s)
            out.append((r.dtype, r._local_tensor.tolist()))
    keys = [k for k in propagation_cache().quick if k[0] is mul and k[1] in (ints._spec, flags._spec)]
    return out, len(keys)


def test_scalar_type_is_part_of_the_quick_key():
    # 2 == 2.0 == True as dict keys, but the outputs' dtypes differ: each gets its own entry
    expected = [(torch.int64, [[0, 2, 4], [6, 8, 10]]), (torch.float32, [[0.0, 2.0, 4.0], [6.0, 8.0, 10.0]]),
                (torch.int64, [[0, 2, 4], [6, 8, 10]]), (torch.bool, [True, False]), (torch.int64, [1, 0]),
                (torch.bool, [True, False])]
    for got, n_keys in run_on_ranks(scalar_keys, 2):
        assert got == expected and n_keys == 4


def scalar_third_args(rank, world):
    from shardwise.tensor import Shard, distribute_tensor
    from shardwise.tensor.dispatch import OpDispatcher

    mesh = worker_mesh((world,))
    g = torch.Generator().manual_seed(4)
    full_grad, full_out = torch.randn(8, 4, generator=g), torch.randn(8, 4, generator=g)
    grad, out = (distribute_tensor(t, mesh, [Shard(0)]) for t in (full_grad, full_out))
    thr = torch.ops.aten.threshold_backward.default
    entered, orig = [], OpDispatcher.__call__

    def counting(self, op, args, kwargs):
        entered.append((str(op), args[-1]))
        return orig(self, op, args, kwargs)

    got = []
    with torch._C.DisableTorchFunctionSubclass():  # straight to the dispatcher, as autograd's calls go
        thr(grad, out, 0.5)                        # learns the plan
        OpDispatcher.__call__ = counting
        try:
            for t in (0.5, 0, 0, 0.5):             # 0 is another key: the dispatcher sees it once
                r = thr(grad, out, t)
                got.append((r.placements, r.full_tensor()))
        finally:
            OpDispatcher.__call__ = orig
    want = [thr(full_grad, full_out, t) for t in (0.5, 0, 0, 0.5)]
    return entered, [p for p, _ in got], all(torch.equal(v, w) for (_, v), w in zip(got, want))


def test_a_trailing_scalar_runs_inline_from_the_quick_map():
    # relu's backward, threshold_backward(grad, result, 0), is (DTensor, DTensor, scalar): after one
    # call per threshold value, the entry runs it without entering the dispatcher
    from shardwise.tensor import Shard

    for entered, placements, same in run_on_ranks(scalar_third_args, 2):
        assert entered == [("aten.threshold_backward.default", 0)], entered
        assert placements == [(Shard(0),)] * 4 and same


def wrappers(rank, world):
    import warnings

    from shardwise.tensor import DTensor, Shard, distribute_tensor
    from shardwise.tensor.callpath.wrapping import wrap, wrap_fresh, wrap_generic

    mesh = worker_mesh((world,))
    spec_of = {}
    for name, full in {"float": torch.randn(4, 6), "transposed": torch.randn(6, 4).t(),
                       "int": torch.arange(24).reshape(4, 6), "complex": torch.randn(4, 6, dtype=torch.cfloat)}.items():
        spec_of[name] = distribute_tensor(full, mesh, [Shard(0)])._spec
    base = torch.randn(2, 6, dtype=torch.cfloat)
    locals_ = {"float": torch.randn(2, 6), "transposed": torch.randn(6, 2).t(), "int": torch.arange(12).reshape(2, 6),
               "requires_grad": torch.randn(2, 6, requires_grad=True), "conj": base.conj(), "neg": base.conj().imag,
               "meta": torch.empty(2, 6, device="meta")}
    specs = {"requires_grad": spec_of["float"], "conj": spec_of["complex"], "neg": spec_of["float"],
             "meta": spec_of["float"]}

    def seen(d):
        return (type(d), d.shape, d.stride(), d.dtype, d.device, d.layout, d.requires_grad, d.is_conj(), d.is_neg(),
                d._spec, d._local_tensor)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the C++ constructor warns for a local that requires grad
        for name, local in locals_.items():
            spec = specs.get(name) or spec_of[name]
            generic = seen(wrap_generic(DTensor, local, spec))
            assert seen(wrap(DTensor, local, spec)) == generic, name
            if name not in ("conj", "neg"):  # wrap_fresh: results of ops, never views
                assert seen(wrap_fresh(DTensor, local, spec)) == generic, name
    return True


def test_both_constructors_make_the_same_dtensor():
    assert all(run_on_ranks(wrappers, 2))
