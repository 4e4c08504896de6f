"""OpInfo sweep: every op in torch's ``op_db`` on DTensors of a 4-rank mesh, against the single-tensor op.

Each op runs in float32 on its first ``--samples`` sample inputs; every tensor argument is tried as
Replicate and as Shard(d) on each dim whose size the world size divides (bool tensors replicated),
every combination of those (at most ``--combos`` per sample: all-Replicate first, then a fixed
pseudo-random choice). The forward values (``full_tensor()``) are compared with the op on plain
tensors; where the op supports autograd, so are the input gradients of a fixed projection of the
outputs. Default settings: no gather fallback, no implicit replication. The same driver runs
PyTorch's own DTensor (``torch.distributed.tensor``) for comparison.

Ranks are threads on PyTorch's threaded process group (one process, real collectives between
threads). A case that fails on one rank only can leave the others inside a collective: the ranks
meet at a barrier after each case, and on its timeout the op is recorded as a hang and the ranks
restart from the next op.

usage: python benchmarks/opinfo_sweep.py [--impl ours|torch|both] [--ops NAME,...] [--samples 3]
       [--combos 8] [--world 4] [--no-backward] [--out FILE]

Prints one JSON line per op and impl ({"impl", "op", "fwd", "bwd", "error"}), a count line per impl
and, with --impl both, the comparison (ops only PyTorch's DTensor passes are listed).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_flatten, tree_unflatten

# their values depend on the random stream (or are uninitialised): a sharded call draws other values
_RANDOM = {"cauchy", "exponential", "geometric", "log_normal", "normal", "normal.in_place", "normal.number_mean",
           "uniform", "nn.functional.rrelu", "empty_like", "randn", "randn_like", "rand_like", "randint",
           "randint_like", "new_empty", "new_empty_strided", "empty_strided", "empty", "empty_permuted",
           "multinomial", "bernoulli"}
_RANDOM_PREFIXES = ("nn.functional.dropout", "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout")
_TIMEOUT = 60.0


def _impl(name):
    if name == "torch":
        from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    else:
        from shardwise.tensor import DTensor, Replicate, Shard, distribute_tensor
    return DTensor, Replicate, Shard, distribute_tensor


def _op_name(op) -> str:
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def _selected_ops(names):
    from torch.testing._internal.common_methods_invocations import op_db

    out = []
    for op in op_db:
        name = _op_name(op)
        if names and name not in names and op.name not in names:
            continue
        if torch.float32 not in op.supported_dtypes("cpu"):
            continue
        out.append(op)
    return out


class _Samples:
    """Sample inputs made once per op in one thread (their generator is torch's global RNG)."""

    def __init__(self, n):
        self.n, self.cache, self.lock = n, {}, threading.Lock()

    def get(self, op, grad: bool):
        with self.lock:
            key = (_op_name(op), grad)
            if key not in self.cache:
                torch.manual_seed(0)
                try:
                    it = op.sample_inputs("cpu", torch.float32, requires_grad=grad)
                    self.cache[key] = list(itertools.islice(it, self.n))
                except Exception as e:  # an op whose samples need something missing here
                    self.cache[key] = e
            return self.cache[key]


def _combos(tensors, world, cap, seed):
    choices = []
    for t in tensors:
        ch = [("R",)]
        if t.dtype != torch.bool:
            ch += [("S", d) for d, s in enumerate(t.shape) if s > 1 and s % world == 0]
        choices.append(ch)
    allc = list(itertools.product(*choices))
    first, rest = allc[:1], allc[1:]
    random.Random(seed).shuffle(rest)
    return first + rest[: max(cap - 1, 0)]


def _close(got, want) -> bool:
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
            return False
        try:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, equal_nan=True)
            return True
        except AssertionError:
            return False
    if isinstance(want, (list, tuple)):
        return isinstance(got, (list, tuple)) and len(got) == len(want) and all(map(_close, got, want))
    if isinstance(want, float):
        return isinstance(got, (int, float)) and (got == want or abs(got - want) <= 1e-5 + 1e-4 * abs(want))
    return got == want


def _project(outs, proj):
    """A real scalar of the outputs (the real part of a complex one) whose gradient is compared."""
    total = 0
    for o, p in zip(outs, proj):
        s = (o * p).sum()
        total = total + (s.real if s.is_complex() else s)
    return total


class _Rank:
    """One thread-rank's sweep state; cases meet at ``barrier`` and share their status."""

    def __init__(self, rank, world, impl, shared):
        self.rank, self.world, self.shared = rank, world, shared
        self.DTensor, self.R, self.S, self.distribute = _impl(impl)
        self.mesh = None

    def sync(self, err):
        """Every rank's error of this case (None where it ran); raises BrokenBarrierError on a hang."""
        self.shared["status"][self.rank] = err
        self.shared["barrier"].wait(_TIMEOUT)
        errs = [e for e in self.shared["status"] if e]
        self.shared["barrier"].wait(_TIMEOUT)
        return errs[0] if errs else None

    def _to_dist(self, t, p):
        pl = self.R() if p[0] == "R" else self.S(p[1])
        d = self.distribute(t.detach().clone(), self.mesh, [pl])
        return d.requires_grad_() if t.requires_grad else d

    def _full(self, x):
        if isinstance(x, self.DTensor):
            return x.full_tensor()
        if isinstance(x, (list, tuple)):
            return type(x)(self._full(y) for y in x)
        return x

    def case(self, op, sample, combo, backward):
        args, kwargs = (sample.input, *sample.args), sample.kwargs
        flat, spec = tree_flatten((args, kwargs))
        idx = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]
        plain = [x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x
                 for x in flat]
        want = op.op(*tree_unflatten(plain, spec)[0], **tree_unflatten(plain, spec)[1])
        dflat = list(flat)
        for i, p in zip(idx, combo):
            dflat[i] = self._to_dist(flat[i], p)
        dargs, dkwargs = tree_unflatten(dflat, spec)
        got = self._full(op.op(*dargs, **dkwargs))
        if not _close(got, want):
            return "wrong values"
        if not backward:
            return None
        wouts = [w for w in tree_flatten(want)[0] if isinstance(w, torch.Tensor) and w.requires_grad]
        gouts = [g for g, w in zip(tree_flatten(got)[0], tree_flatten(want)[0])
                 if isinstance(w, torch.Tensor) and w.requires_grad]
        wins = [plain[i] for i in idx if plain[i].requires_grad]
        dins = [dflat[i] for i in idx if flat[i].requires_grad]
        if not wouts or not wins:
            return None
        gen = torch.Generator().manual_seed(1)
        proj = [torch.randn(w.shape, generator=gen) for w in wouts]
        try:
            wg = torch.autograd.grad(_project(wouts, proj), wins, allow_unused=True)
        except RuntimeError:  # the op's backward refuses this projection (eig's phase): nothing to compare
            return None
        try:
            dg = [self._full(g) for g in torch.autograd.grad(_project(gouts, proj), dins, allow_unused=True)]
        except Exception as e:  # noqa: BLE001
            return f"wrong gradients: {type(e).__name__}: {str(e).splitlines()[0][:140] if str(e) else ''}"
        ok = all((a is None and b is None) or (a is not None and b is not None and _close(b, a))
                 for a, b in zip(wg, dg))
        return None if ok else "wrong gradients"


def _worker(rank, world, impl, ops, start, shared, args):
    try:
        dist.init_process_group("threaded", rank=rank, world_size=world, store=shared["store"])
        from torch.distributed.device_mesh import DeviceMesh

        me = _Rank(rank, world, impl, shared)
        me.mesh = DeviceMesh("cpu", list(range(world)))
        for i in range(start, len(ops)):
            if rank == 0:
                shared["progress"] = i
            _sweep_op(me, ops[i], shared, args)
    except threading.BrokenBarrierError:
        if rank == 0 or shared["results"].get(_op_name(ops[shared["progress"]])) is None:
            shared["results"][_op_name(ops[shared["progress"]])] = {"fwd": False, "bwd": None, "error": "hang"}
        from torch.testing._internal.distributed.multi_threaded_pg import ProcessLocalGroup

        ProcessLocalGroup.exception_handle(None)  # wakes the ranks waiting inside a collective
    except SystemExit:  # the threaded group's termination after a hang
        pass
    except BaseException as e:
        print(f"rank {rank}: {type(e).__name__}: {e}", file=sys.stderr)
        shared["barrier"].abort()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _sweep_op(me, op, shared, args):
    name = _op_name(op)
    if name in _RANDOM or name.startswith(_RANDOM_PREFIXES):
        if me.rank == 0:
            shared["results"][name] = {"fwd": None, "bwd": None, "error": "skipped: random or uninitialised values"}
        return
    grad = op.supports_autograd and not args.no_backward
    samples = shared["samples"].get(op, grad)
    if isinstance(samples, Exception) or not samples:
        if me.rank == 0:
            shared["results"][name] = {"fwd": None, "bwd": None, "error": f"no samples: {samples!r}"[:200]}
        return
    fwd_err = bwd_err = None
    for k, sample in enumerate(samples):
        tensors = [x for x in tree_flatten(((sample.input, *sample.args), sample.kwargs))[0]
                   if isinstance(x, torch.Tensor)]
        for combo in _combos(tensors, me.world, args.combos, hash((name, k)) & 0xFFFF):
            try:
                err = me.case(op, sample, combo, grad)
            except Exception as e:
                err = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            err = me.sync(err)
            if err:
                bad = f"[{', '.join(''.join(map(str, p)) for p in combo)}] {err}"
                if err.startswith("wrong gradients"):
                    bwd_err = bwd_err or bad
                else:
                    fwd_err = fwd_err or bad
        if fwd_err:
            break
    if me.rank == 0:
        shared["results"][name] = {"fwd": fwd_err is None, "bwd": None if not grad or fwd_err else bwd_err is None,
                                   "error": fwd_err or bwd_err}


def sweep(impl, ops, args):
    from torch.testing._internal.distributed.multi_threaded_pg import ProcessLocalGroup, _install_threaded_pg

    _install_threaded_pg()
    torch._C._distributed_c10d._set_thread_isolation_mode(True)  # group names per thread, as torch's harness
    shared = {"results": {}, "samples": _Samples(args.samples), "progress": 0}
    start = 0
    while start < len(ops):
        ProcessLocalGroup.reset()
        shared.update(store=dist.HashStore(), barrier=threading.Barrier(args.world), status=[None] * args.world)
        threads = [threading.Thread(target=_worker, args=(r, args.world, impl, ops, start, shared, args), daemon=True)
                   for r in range(args.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        done = _op_name(ops[-1]) in shared["results"]
        start = len(ops) if done else shared["progress"] + 1
    return shared["results"]


def _counts(res):
    ran = [r for r in res.values() if r["fwd"] is not None]
    return {"ops": len(res), "ran": len(ran), "fwd_pass": sum(bool(r["fwd"]) for r in ran),
            "bwd_checked": sum(r["bwd"] is not None for r in ran), "bwd_pass": sum(bool(r["bwd"]) for r in ran)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impl", choices=["ours", "torch", "both"], default="both")
    p.add_argument("--ops", default="")
    p.add_argument("--samples", type=int, default=3)
    p.add_argument("--combos", type=int, default=8)
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--no-backward", action="store_true")
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    ops = _selected_ops(set(filter(None, args.ops.split(","))))
    torch.set_num_threads(1)
    results, seconds = {}, {}
    for impl in (["ours", "torch"] if args.impl == "both" else [args.impl]):
        t0 = time.perf_counter()
        results[impl] = sweep(impl, ops, args)
        seconds[impl] = round(time.perf_counter() - t0, 1)
        for name, r in results[impl].items():
            print(json.dumps({"impl": impl, "op": name, **r}), flush=True)
    for impl, res in results.items():
        print(json.dumps({"impl": impl, "count": _counts(res), "seconds": seconds[impl]}), flush=True)
    if len(results) == 2:
        ours, theirs = results["ours"], results["torch"]
        names = sorted(set(ours) & set(theirs))
        fw = lambda r, n: bool(r[n]["fwd"])  # noqa: E731
        bw = lambda r, n: r[n]["bwd"] is not False  # noqa: E731
        summary = {
            "both_fwd": sum(fw(ours, n) and fw(theirs, n) for n in names),
            "only_torch_fwd": [n for n in names if fw(theirs, n) and not fw(ours, n)],
            "only_ours_fwd": sum(fw(ours, n) and not fw(theirs, n) for n in names),
            "only_torch_bwd": [n for n in names if fw(theirs, n) and fw(ours, n) and theirs[n]["bwd"] and not bw(ours, n)],
        }
        print(json.dumps({"comparison": summary}), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
