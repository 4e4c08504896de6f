"""Check every registered sharding rule against plain PyTorch, on simulated ranks in one process.

For each op with sample inputs (``_samples.py``), each sample, each 1-D mesh size and each strategy
its rule offers, the validator builds every rank's local inputs from the full sample tensors (torch.chunk
pieces, copies, or random pieces whose reduction is the full value for pending reductions), plans the
call the way the dispatcher does (decision, output specs, the rule's ``local`` hook), runs the op on
every rank, assembles the global result from the claimed output placements and compares it with the
op on the full tensors. Local kernels that issue collectives cannot run on simulated ranks; those
combinations are listed as needing real ranks.

>>> from torch.ops import aten
>>> report = validate_rules(ops=[aten.mm.default], world_sizes=(2, 3))
>>> report.ok, report.ops["aten.mm.default"].checked > 0
(True, True)
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from . import ops as _ops  # noqa: F401  (registers the rules)
from ._samples import Plain, Sample, sample_inputs
from ._simcomm import run_ranks
from ._validation_report import Failure, OpReport, ValidationReport
from .dispatch import _meta_outputs
from .placements import MaskPartial, Partial, Placement, Replicate, Shard
from .propagation.propagator import Decision, op_mutates_first_arg
from .propagation.registry import lookup_rule, registered_ops
from .propagation.schema import OpSchema, TensorArg
from .spec import DTensorSpec, normalize_placements

__all__ = ["validate_rules", "ValidationReport", "OpReport", "Failure", "NeedsRealRanks", "Sample", "Plain", "main"]

R = Replicate()
_CANDIDATES = (R, "first", "last", Partial("sum"), Partial("avg"), Partial("max"), Partial("min"))


class NeedsRealRanks(RuntimeError):
    """A local kernel touched the process group (a collective): it cannot run on simulated ranks."""


class _SimMesh:
    """A 1-D stand-in for DeviceMesh: specs only need its shape; anything else (``get_group`` for a
    collective) means the kernel needs real ranks."""

    def __init__(self, size: int):
        self.shape = (size,)
        self.ndim = 1

    def size(self, dim: Optional[int] = None) -> int:
        return self.shape[0]

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise NeedsRealRanks(f"the local kernel uses mesh.{name} (a process group: a collective)")


class _NoDTensor:  # no value is an instance: ``_meta_outputs`` treats every tensor as a plain one
    pass


# --- building inputs ---------------------------------------------------------------------------

def _leaves(args, kwargs) -> list:
    """Tensor leaves in the dispatcher's order: args (lists flattened), then tensor kwargs."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(x for x in a if isinstance(x, torch.Tensor))
    out.extend(v for v in kwargs.values() if isinstance(v, torch.Tensor))
    return out


def _rebuild(args, kwargs, leaves: Sequence) -> tuple[list, dict]:
    """``args``/``kwargs`` with tensor leaves replaced in order (lists of tensors become lists)."""
    it = iter(leaves)
    new_args = []
    for a in args:
        if isinstance(a, torch.Tensor):
            new_args.append(next(it))
        elif isinstance(a, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in a):
            new_args.append([next(it) if isinstance(x, torch.Tensor) else x for x in a])
        else:
            new_args.append(a)
    new_kwargs = {k: next(it) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    return new_args, new_kwargs


def _schema(op, sample: Sample, placements: Sequence, outputs, n: int) -> OpSchema:
    """The OpSchema the dispatcher would build when leaf ``i`` has ``placements[i]`` (None: plain)."""
    leaves = _leaves(sample.args, sample.kwargs)
    tas = [TensorArg(i, t.shape, t.dtype, None if p is None else (p,)) for i, (t, p) in
           enumerate(zip(leaves, placements))]
    sargs, skw = _rebuild(sample.args, sample.kwargs, tas)
    return OpSchema(op, tuple(sargs), skw, tas, outputs, (n,))


def _partial_pieces(full: torch.Tensor, op: str, n: int, gen) -> list:
    """``n`` random pieces whose ``op`` reduction is ``full`` (max/min: each element exact on one
    random rank, strictly smaller/larger elsewhere)."""
    shape, dt = full.shape, full.dtype
    if op in ("sum", "avg"):
        target = full * n if op == "avg" else full
        if dt.is_floating_point:
            noise = torch.randn((n - 1, *shape), generator=gen).to(dt)
        else:
            noise = torch.randint(-3, 4, (n - 1, *shape), generator=gen).to(dt)
        return [*noise.unbind(0), target - noise.sum(0)]
    owner = torch.randint(0, n, tuple(shape), generator=gen)
    pieces = []
    for r in range(n):
        if dt == torch.bool:
            coin = torch.rand(tuple(shape), generator=gen) < 0.5
            other = (full & coin) if op == "max" else (full | coin)
        else:
            if dt.is_floating_point:
                delta = (torch.rand(tuple(shape), generator=gen) + 0.25).to(dt)
            else:
                delta = torch.randint(1, 4, tuple(shape), generator=gen).to(dt)
            other = full - delta if op == "max" else full + delta
        pieces.append(torch.where(owner == r, full, other))
    return pieces


def _distribute(full: torch.Tensor, p: Optional[Placement], n: int, gen) -> list:
    if p is None or type(p) is Replicate:
        return [full.clone() for _ in range(n)]
    if type(p) is Shard:
        return _shard(full, p.dim, n)
    return _partial_pieces(full, p.reduce_op, n, gen)


def _shard(full: torch.Tensor, dim: int, n: int) -> list:
    if full.dim() == 0:
        raise ValueError("Shard on a 0-d tensor")
    size = full.shape[dim]
    chunk = -(-size // n)
    sizes = [max(0, min(chunk, size - r * chunk)) for r in range(n)]
    return [t.clone() for t in torch.split(full, sizes, dim=dim)]


# --- cases: one layout of the inputs and outputs to check ----------------------------------------

@dataclass
class _Case:
    label: str
    current: list  # per leaf: the placement the input holds (None: plain tensor)
    target: list  # per leaf: the placement the local op sees
    outputs: list  # per checked output: its claimed placement
    skip: str = ""  # why the dispatcher never runs this case
    error: str = ""  # a malformed rule answer


def _fmt(ps) -> str:
    return ", ".join("-" if p is None else str(p) for p in ps)


def _norm(p, ndim: int):
    return Shard(p.dim + ndim) if type(p) is Shard and p.dim < 0 else p


def _inplace_list(op, sample: Sample) -> bool:
    return op_mutates_first_arg(op) and bool(sample.args) and isinstance(sample.args[0], (list, tuple))


def _skip_reason(op, leaves, plain, target, outputs) -> str:
    for i, (t, p) in enumerate(zip(leaves, target)):
        if i in plain and p is not None and type(p) is not Replicate:
            return "a plain tensor must stay replicated"
        if isinstance(p, Partial) and t.dtype == torch.bool and p.reduce_op in ("sum", "avg"):
            return "a bool tensor cannot hold a pending sum"
    if op_mutates_first_arg(op) and outputs and outputs[0] is not None and target and target[0] != outputs[0]:
        return "an in-place op keeps its argument's layout"
    return ""


def _per_dim_cases(op, entry, sample: Sample, metas, n: int, rep: OpReport) -> list:
    leaves = _leaves(sample.args, sample.kwargs)
    base = [None if i in sample.plain else R for i in range(len(leaves))]
    cases = []
    for st in entry.rule(_schema(op, sample, base, metas, n), n):
        if len(st.inputs) != len(leaves) or len(st.outputs) != len(metas):
            msg = (f"strategy has {len(st.inputs)} inputs/{len(st.outputs)} outputs, the op has {len(leaves)} "
                   f"tensor args/{len(metas)} outputs")
            cases.append(_Case(str(st), base, base, [], error=msg))
            continue
        reqs = [_norm(p, t.ndim) for p, t in zip(st.inputs, leaves)]
        free = [i for i, p in enumerate(reqs) if p is None and base[i] is not None]
        # an input without requirement keeps whatever layout it has: try replicated and sharded
        fills = [R, Partial()] + ([Shard(0)] if any(leaves[i].ndim for i in free) else []) if free else [R]
        for fill in fills:
            current = [base[i] if i in sample.plain else reqs[i] if reqs[i] is not None
                       else _place(fill, leaves[i], False) for i in range(len(leaves))]
            target = [reqs[i] if i in sample.plain else current[i] for i in range(len(leaves))]
            outs = [_norm(p, m.ndim) if m is not None else p for p, m in zip(st.outputs, metas)]
            label = str(st) if len(fills) == 1 else f"{st} with free inputs {fill}"
            skip = _skip_reason(op, leaves, sample.plain, target, outs)
            cases.append(_Case(label, current, [None if i in sample.plain else t for i, t in enumerate(target)],
                               outs, skip))
    return cases


def _place(kind, t: torch.Tensor, plain: bool):
    if plain:
        return None
    if kind in ("first", "last") or type(kind) is Shard:
        return R if t.ndim == 0 else Shard(t.ndim - 1 if kind == "last" else 0)
    if isinstance(kind, Partial) and t.dtype == torch.bool and kind.reduce_op in ("sum", "avg"):
        return R
    return kind


def _candidate_layouts(leaves, plain) -> list:
    """Input layouts to offer a whole-mesh rule: all leaves alike, and two mixes."""
    k = len(_CANDIDATES)
    picks = [[c] * len(leaves) for c in _CANDIDATES]
    picks += [[_CANDIDATES[i % k] for i in range(len(leaves))], [_CANDIDATES[(i + 3) % k] for i in range(len(leaves))]]
    seen, out = set(), []
    for pick in picks:
        layout = tuple(_place(c, t, i in plain) for i, (c, t) in enumerate(zip(pick, leaves)))
        if layout not in seen:
            seen.add(layout)
            out.append(list(layout))
    return out


def _whole_mesh_cases(op, entry, sample: Sample, metas, n: int, rep: OpReport) -> list:
    leaves = _leaves(sample.args, sample.kwargs)
    n_self = len(sample.args[0]) if _inplace_list(op, sample) else 0
    cases = []
    for current in _candidate_layouts(leaves, sample.plain):
        try:
            dec = entry.rule(_schema(op, sample, current, metas, n), (n,))
        except NotImplementedError:
            rep.refused += 1
            continue
        target = [None if c is None else _norm((d or (c,))[0], t.ndim)
                  for c, d, t in zip(current, dec.inputs, leaves)]
        outs = [None if o is None else _norm(o[0], m.ndim) for o, m in zip(dec.outputs, metas)]
        label = f"({_fmt(current)}) => ({_fmt(target)}) -> ({_fmt(outs)})"
        case = _Case(label, current, target, outs)
        if len(dec.inputs) != len(leaves) or len(dec.outputs) != len(metas):
            case.error = f"decision has {len(dec.inputs)} inputs/{len(dec.outputs)} outputs"
        if n_self:
            # the DTensors updated in place keep their layout; a redistributed copy's update is lost
            case.outputs = current[:n_self]
            if target[:n_self] != current[:n_self]:
                case.error = "in-place update of a redistributed element would be lost"
        case.skip = _skip_reason(op, leaves, sample.plain, target, [])
        cases.append(case)
    return cases


# --- running a case ------------------------------------------------------------------------------

class _Mismatch(Exception):
    def __init__(self, message: str, err: float = float("nan")):
        super().__init__(message)
        self.err = err


@dataclass
class _Raw:  # a non-tensor result (``_local_scalar_dense``)
    value: object


def _flatten(op, out, args) -> list:
    if op_mutates_first_arg(op) and len(op._schema.returns) <= 1:
        out = args[0]
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [o if isinstance(o, torch.Tensor) else None for o in out]
    return [_Raw(out)]


def _expected(op, sample: Sample) -> list:
    args, kwargs = _rebuild(sample.args, sample.kwargs, [t.clone() for t in _leaves(sample.args, sample.kwargs)])
    if sample.random:
        torch.manual_seed(sample.seed)
    return _flatten(op, op(*args, **kwargs), args)


def _call(op, args: list, kwargs: dict, plan, sample: Sample) -> list:
    if plan is not None:
        for i, v in plan.arg_subs.items():
            args[i] = v
        if plan.kwarg_subs:
            kwargs = {**kwargs, **plan.kwarg_subs}
    if sample.random:
        torch.manual_seed(sample.seed)
    out = plan.kernel(op, args, kwargs) if plan is not None and plan.kernel else op(*args, **kwargs)
    return _flatten(op, out, args)


_TOL = {torch.float64: (1e-7, 1e-9), torch.float16: (2e-2, 2e-2), torch.bfloat16: (2e-2, 2e-2)}


def _tolerance(dtypes) -> tuple[float, float]:
    """(rtol, atol) of the least precise floating dtype involved: float32 pieces summed in float64
    carry float32 rounding."""
    tols = [_TOL.get(d, (1e-4, 1e-5)) for d in dtypes if d.is_floating_point or d.is_complex]
    return max(tols, default=(0.0, 0.0))


def _max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape or a.numel() == 0:
        return 0.0 if a.shape == b.shape else float("inf")
    a, b = a.double(), b.double()
    diff = (a - b).abs()
    diff = torch.where(torch.isnan(a) & torch.isnan(b), torch.zeros_like(diff), diff)
    return float(diff.nan_to_num(nan=float("inf")).max())


def _close(a: torch.Tensor, b: torch.Tensor, tol=None) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if b.dtype.is_floating_point or b.dtype.is_complex:
        rtol, atol = tol or _tolerance([b.dtype])
        return torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
    return torch.equal(a, b)


def _assemble(pieces: list, p: Placement, n: int, tol, undefined: bool) -> torch.Tensor:
    if type(p) is Shard:
        return torch.cat(pieces, p.dim)
    if type(p) is Replicate:
        for r, t in enumerate(pieces[1:], 1):
            if not undefined and not _close(t, pieces[0], tol):
                raise _Mismatch(f"replicated output differs between rank 0 and rank {r}", _max_err(t, pieces[0]))
        return pieces[0]
    stacked, dt = torch.stack(pieces), pieces[0].dtype
    op = "sum" if isinstance(p, MaskPartial) else p.reduce_op
    if op == "max":
        return stacked.amax(0)
    if op == "min":
        return stacked.amin(0)
    total = stacked.sum(0).to(dt)
    if op == "sum":
        return total
    return total / n if dt.is_floating_point else torch.div(total, n, rounding_mode="floor")


def _compare_output(o: int, exp, pieces: list, spec, n: int, undefined: bool, tol) -> float:
    if exp is None:
        if any(p is not None for p in pieces):
            raise _Mismatch(f"output {o}: a rank returned a tensor where the op returns none")
        return 0.0
    if isinstance(exp, _Raw):
        for r, p in enumerate(pieces):
            if not isinstance(p, _Raw) or not _close(torch.tensor(p.value), torch.tensor(exp.value)):
                raise _Mismatch(f"output {o}: rank {r} returned {getattr(p, 'value', p)!r}, expected {exp.value!r}")
        return 0.0
    if spec is None:
        raise _Mismatch(f"output {o} is a tensor but the rule gives it no placement")
    for r, p in enumerate(pieces):
        want = spec.local_shape((r,))
        if not isinstance(p, torch.Tensor) or tuple(p.shape) != want or p.dtype != spec.dtype:
            got = (tuple(p.shape), p.dtype) if isinstance(p, torch.Tensor) else p
            raise _Mismatch(f"output {o} rank {r}: local {got}, but its spec "
                            f"{spec.placements[0]} of {tuple(spec.shape)} {spec.dtype} says {want}")
    got = _assemble(pieces, spec.placements[0], n, tol, undefined)
    if undefined:
        return 0.0
    err = _max_err(got, exp)
    if not _close(got, exp, tol):
        raise _Mismatch(f"output {o} ({spec.placements[0]}) differs from the full-tensor op", err)
    return err


def _run_case(op, entry, sample: Sample, case: _Case, metas, checks, expected, n: int, gen, sim_comm: bool):
    """Returns (status, max error, message) with status "ok", "fail" or "real". Kernels that issue
    collectives run again on thread ranks when ``sim_comm``, else they are reported as "real"."""
    if case.error:
        return "fail", float("nan"), case.error
    mesh = _SimMesh(n)
    leaves = _leaves(sample.args, sample.kwargs)
    try:
        schema = _schema(op, sample, case.current, metas, n)
        decision = Decision([None if c is None or t == c else (t,) for c, t in zip(case.current, case.target)],
                            [None if m is None else (p,) for m, p in zip(metas, case.outputs)])
        specs = []
        for m, p in zip(checks, case.outputs):
            if m is None or p is None:
                specs.append(None)
            else:
                pl = normalize_placements((p,), 1, m.ndim)
                specs.append(DTensorSpec(mesh, pl, m.shape, m.stride(), m.dtype))
        pieces = [_distribute(t, p, n, gen) for t, p in zip(leaves, case.target)]

        def one_rank(r: int, rank_mesh) -> list:  # on clones: a rerun must see the inputs unmodified
            plan = entry.local(schema, decision, specs, rank_mesh, (r,)) if entry.local else None
            args, kwargs = _rebuild(sample.args, sample.kwargs, [p[r].clone() for p in pieces])
            return _call(op, args, kwargs, plan, sample)

        try:
            results = [one_rank(r, mesh) for r in range(n)]
        except NeedsRealRanks:
            if not sim_comm:
                raise
            results = run_ranks(n, one_rank)
        worst = 0.0
        tol = _tolerance([t.dtype for t in leaves] + [e.dtype for e in expected if isinstance(e, torch.Tensor)])
        for o, exp in enumerate(expected):
            got = [res[o] if o < len(res) else None for res in results]
            spec = specs[o] if o < len(specs) else None
            worst = max(worst, _compare_output(o, exp, got, spec, n, sample.undefined, tol))
        return "ok", worst, ""
    except NeedsRealRanks as e:
        return "real", float("nan"), str(e)
    except _Mismatch as e:
        return "fail", e.err, str(e)
    except Exception as e:  # a local op rejecting its pieces is a rule bug too
        return "fail", float("nan"), f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


# --- driver -----------------------------------------------------------------------------------

def _perturb(x, zero: bool):
    """Another value of the same type: the sign flipped and moved, or zero."""
    if type(x) in (list, tuple) and x and type(x[0]) in (int, float, bool, complex):
        return type(x)(_perturb(y, zero) for y in x)
    if type(x) is bool:
        return not x
    return x if type(x) not in (int, float, complex) else 0 * x if zero else -2 * x - 1


def _scalar_dependence(op, entry, sample: Sample, metas, n: int) -> str:
    """Pointwise/foreach plans are cached by scalar types only (a new learning rate reuses the plan),
    so their rules must answer the same for other scalar values."""
    leaves = _leaves(sample.args, sample.kwargs)
    layouts = _candidate_layouts(leaves, sample.plain) if entry.whole_mesh else [
        [None if i in sample.plain else R for i in range(len(leaves))]]
    for layout in layouts:
        answers = []
        for perturb in (None, False, True):
            schema = _schema(op, sample, layout, metas, n)
            if perturb is not None:
                schema.args = tuple(_perturb(a, perturb) for a in schema.args)
                schema.kwargs = {k: v if type(v) in (list, tuple) else _perturb(v, perturb)
                                 for k, v in schema.kwargs.items()}
            try:
                answers.append(repr(entry.rule(schema, (n,) if entry.whole_mesh else n)))
            except NotImplementedError as e:
                answers.append(f"refused: {e}")
        if len(set(answers)) > 1:
            return f"the rule's answer for ({_fmt(layout)}) changes with scalar values, which the plan cache ignores"
    return ""

def _check_sample(op, entry, sample: Sample, sizes, rep: OpReport, gen, sim_comm: bool) -> None:
    name = str(op)
    stage = "the sample does not run on full tensors"
    try:
        expected = _expected(op, sample)
        stage = "the dispatcher cannot infer the output shapes (dispatch._meta_outputs)"
        metas = _meta_outputs(op, sample.args, sample.kwargs, _NoDTensor)
    except Exception as e:
        rep.failures.append(Failure(name, sample.label, 0, "-", float("nan"), f"{stage}: {type(e).__name__}: {e}"))
        return
    checks = [t.to("meta") for t in sample.args[0]] if _inplace_list(op, sample) else metas
    make = _whole_mesh_cases if entry.whole_mesh else _per_dim_cases
    for n in sizes:
        try:
            cases = make(op, entry, sample, metas, n, rep)
            msg = _scalar_dependence(op, entry, sample, metas, n) if entry.scalar_insensitive else ""
            if msg:
                rep.failures.append(Failure(name, sample.label, n, "rule", float("nan"), msg))
        except Exception as e:
            rep.failures.append(Failure(name, sample.label, n, "rule", float("nan"),
                                        f"the rule raised {type(e).__name__}: {e}"))
            continue
        for case in cases:
            if case.skip:
                rep.skipped += 1
                continue
            status, err, msg = _run_case(op, entry, sample, case, metas, checks, expected, n, gen, sim_comm)
            if status == "real":
                rep.real_ranks.append(f"[{sample.label}] n={n} {case.label}: {msg}")
                continue
            rep.checked += 1
            if status == "fail":
                rep.failures.append(Failure(name, sample.label, n, case.label, err, msg))


def _check_sizes(world_sizes) -> tuple:
    sizes = tuple(world_sizes)
    for n in sizes:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"world_sizes={world_sizes!r}: each mesh size must be an int >= 1, e.g. (2, 3, 4)")
    if not sizes:
        raise ValueError("world_sizes is empty: give at least one mesh size, e.g. (2, 3, 4)")
    return sizes


def validate_rules(ops=None, world_sizes=(2, 3, 4), seed: int = 0, samples=None,
                   simulate_collectives: bool = False) -> ValidationReport:
    """Check the sharding rules of ``ops`` (default: every registered op) on simulated 1-D meshes.

    ``samples`` optionally maps an op to its own list of ``Sample`` (instead of the built-in ones).
    Local kernels issuing collectives are listed as needing real ranks, unless ``simulate_collectives``
    runs them on thread ranks with simulated collectives (``_simcomm``).

    >>> from torch.ops import aten
    >>> validate_rules([aten.add.Tensor], world_sizes=(3,)).ok
    True
    """
    sizes = _check_sizes(world_sizes)
    targets = registered_ops() if ops is None else list(ops)
    for op in targets:
        if lookup_rule(op) is None:
            raise ValueError(f"{op!r} has no registered sharding rule; pass registered aten overloads "
                             "(see shardwise.tensor.propagation.registered_ops())")
    start = time.perf_counter()
    report = ValidationReport({}, [], sizes)
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):  # samples of random ops reseed the global RNG
        for op in targets:
            given = samples.get(op) if samples else None
            op_samples = given if given is not None else sample_inputs(op, seed)
            if not op_samples:
                report.without_samples.append(str(op))
                continue
            rep = report.ops[str(op)] = OpReport(str(op), samples=len(op_samples))
            for sample in op_samples:
                _check_sample(op, lookup_rule(op), sample, sizes, rep, gen, simulate_collectives)
    report.seconds = time.perf_counter() - start
    return report


def main(argv=None) -> int:
    """``shardwise validate``: print the report; exit status 1 when a rule fails, 2 on bad arguments."""
    parser = argparse.ArgumentParser(prog="shardwise validate",
                                     description="Check sharding rules against full-tensor PyTorch.")
    parser.add_argument("--op", action="append", default=[], help="only ops whose name contains this")
    parser.add_argument("--world-sizes", default="2,3,4", help="comma-separated 1-D mesh sizes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="print failures and the summary only")
    parser.add_argument("--simulate-collectives", action="store_true",
                        help="run kernels that issue collectives on thread ranks instead of skipping them")
    a = parser.parse_args(argv)
    try:
        sizes = _check_sizes(int(s) for s in a.world_sizes.split(",") if s.strip())
    except ValueError as e:
        print(f"--world-sizes {a.world_sizes!r}: {e}", file=sys.stderr)
        return 2
    ops = None
    if a.op:
        ops = [o for o in registered_ops() if any(s in str(o) for s in a.op)]
        if not ops:
            print(f"no registered op matches {a.op}; see shardwise.tensor.propagation.registered_ops()",
                  file=sys.stderr)
            return 2
    report = validate_rules(ops, sizes, a.seed, simulate_collectives=a.simulate_collectives)
    if a.quiet:
        print("\n".join([str(f) for f in report.failures] + [report.summary()]))
    else:
        print(report)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
