"""Check every registered sharding rule against plain PyTorch, on simulated ranks in one process.

For each op with sample inputs (``samples/``), each sample, each mesh (1-D sizes, optionally N-D
shapes) and each strategy its rule offers (per-dim rules: every combination over the mesh dims), the
validator builds every rank's local inputs from the full sample tensors (torch.chunk pieces, copies, or
random pieces whose reduction is the full value for pending reductions), plans the call the way the
dispatcher does (decision, output specs, the rule's ``local`` hook), runs the op on every rank,
assembles the global result from the claimed output placements and compares it with the op on the
full tensors. Local kernels that issue collectives cannot run on sequential simulated ranks; those
combinations are listed as needing real ranks, or run on thread ranks with simulated collectives.

>>> from torch.ops import aten
>>> report = validate_rules(ops=[aten.mm.default], world_sizes=(2, 3, (2, 2)))
>>> report.ok, report.ops["aten.mm.default"].checked > 0
(True, True)
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from .. import ops as _ops  # noqa: F401  (registers the rules)
from ..propagation.outputs import meta_outputs as _meta_outputs
from ..placements import Partial, Replicate, Shard
from ..propagation.propagator import Decision, op_mutates_first_arg
from ..propagation.registry import lookup_rule, registered_ops
from ..propagation.schema import OpSchema, TensorArg
from ..spec import DTensorSpec, normalize_placements
from .per_rank import Mismatch, call, compare_output, coords, distribute, flatten, leaves_of, rebuild, tolerance
from .report import Failure, OpReport, ValidationReport
from .samples import Plain, Sample, sample_inputs
from .thread_ranks import NotSimulated, run_ranks

__all__ = ["validate_rules", "ValidationReport", "OpReport", "Failure", "NeedsRealRanks", "Sample", "Plain"]

R = Replicate()
_CANDIDATES = (R, "first", "last", Partial("sum"), Partial("avg"), Partial("max"), Partial("min"))


class NeedsRealRanks(RuntimeError):
    """A local kernel touched the process group (a collective): it cannot run on sequential ranks."""


class _SimMesh:
    """A stand-in for DeviceMesh: specs only need its shape; anything else (``get_group`` for a
    collective) means the kernel needs real (or thread) ranks."""

    def __init__(self, shape: tuple):
        self.shape, self.ndim = tuple(shape), len(shape)

    def size(self, dim=None) -> int:
        return self.shape[dim] if dim is not None else math.prod(self.shape)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise NeedsRealRanks(f"the local kernel uses mesh.{name} (a process group: a collective)")


class _NoDTensor:  # no value is an instance: ``_meta_outputs`` treats every tensor as a plain one
    pass


def _schema(op, sample: Sample, placements: Sequence, outputs, mesh_shape) -> OpSchema:
    """The OpSchema the dispatcher builds when leaf ``i`` has ``placements[i]`` (None: a plain tensor)."""
    leaves = leaves_of(sample.args, sample.kwargs)
    tas = [TensorArg(i, t.shape, t.dtype, p) for i, (t, p) in enumerate(zip(leaves, placements))]
    sargs, skw = rebuild(sample.args, sample.kwargs, tas)
    return OpSchema(op, tuple(sargs), skw, tas, outputs, tuple(mesh_shape))


# --- cases: one layout of the inputs and outputs to check ------------------------------------------

@dataclass
class _Case:
    label: str
    current: list  # per leaf: the placements the input holds (None: plain tensor)
    target: list  # per leaf: the placements the local op sees
    outputs: list  # per checked output: its claimed placements
    skip: str = ""  # why the dispatcher never runs this case
    error: str = ""  # a malformed rule answer


def _fmt(ps) -> str:
    def one(p):
        if not isinstance(p, tuple):
            return "-" if p is None else str(p)
        return one(p[0]) if len(p) == 1 else "[" + ",".join(map(one, p)) + "]"

    return ", ".join(map(one, ps))


def _norm(p, ndim: int):
    return Shard(p.dim + ndim) if type(p) is Shard and p.dim < 0 else p


def _inplace_list(op, sample: Sample) -> bool:
    return op_mutates_first_arg(op) and bool(sample.args) and isinstance(sample.args[0], (list, tuple))


def _skip_reason(op, leaves, plain, reqs, outputs) -> str:
    for i, (t, ps) in enumerate(zip(leaves, reqs)):
        for p in ps or ():
            if i in plain and p is not None and type(p) is not Replicate:
                return "a plain tensor must stay replicated"
            if isinstance(p, Partial) and t.dtype == torch.bool and p.reduce_op in ("sum", "avg"):
                return "a bool tensor cannot hold a pending sum"
    if op_mutates_first_arg(op) and outputs and outputs[0] is not None and reqs and reqs[0] != outputs[0]:
        return "an in-place op keeps its argument's layout"
    return ""


def _place(kind, t: torch.Tensor):
    if kind in ("first", "last") or type(kind) is Shard:
        return R if t.ndim == 0 else Shard(t.ndim - 1 if kind == "last" else 0)
    if isinstance(kind, Partial) and t.dtype == torch.bool and kind.reduce_op in ("sum", "avg"):
        return R
    return kind


def _per_dim_cases(op, entry, sample: Sample, metas, mesh_shape, rep: OpReport) -> list:
    leaves, plain, nd = leaves_of(sample.args, sample.kwargs), sample.plain, len(mesh_shape)
    base = [None if i in plain else (R,) * nd for i in range(len(leaves))]
    schema = _schema(op, sample, base, metas, mesh_shape)
    by_size = {n: entry.rule(schema, n) for n in sorted(set(mesh_shape))}
    cases = []
    for combo in itertools.product(*(by_size[n] for n in mesh_shape)):
        label = str(combo[0]) if nd == 1 else " x ".join(f"[{st}]" for st in combo)
        if any(len(st.inputs) != len(leaves) or len(st.outputs) != len(metas) for st in combo):
            msg = f"a strategy's arity differs from the op's {len(leaves)} tensor args/{len(metas)} outputs"
            cases.append(_Case(label, base, base, [], error=msg))
            continue
        reqs = [tuple(_norm(st.inputs[i], t.ndim) for st in combo) for i, t in enumerate(leaves)]
        outs = [None if m is None else tuple(_norm(st.outputs[o], m.ndim) for st in combo)
                for o, m in enumerate(metas)]
        free = [i for i in range(len(leaves)) if i not in plain and None in reqs[i]]
        # an input without requirement keeps whatever layout it has: try replicated, pending, sharded
        fills = ([R, Partial()] + ([Shard(0)] if any(leaves[i].ndim for i in free) else [])) if free else [R]
        for fill in fills:
            current = [None if i in plain else tuple(_place(fill, t) if p is None else p for p in reqs[i])
                       for i, t in enumerate(leaves)]
            skip = _skip_reason(op, leaves, plain, [r if i in plain else current[i] for i, r in enumerate(reqs)],
                                outs)
            cases.append(_Case(label if len(fills) == 1 else f"{label} with free inputs {fill}", current,
                               current, outs, skip))
    return cases


def _candidate_layouts(leaves, plain, nd: int) -> list:
    """Input layouts to offer a whole-mesh rule: all leaves alike, and two mixes (per mesh dim)."""
    k, n = len(_CANDIDATES), len(leaves)
    uniform = [[c] * n for c in _CANDIDATES]
    mixes = [[_CANDIDATES[i % k] for i in range(n)], [_CANDIDATES[(i + 3) % k] for i in range(n)]]
    seen, out = set(), []
    for picks in itertools.product(uniform + mixes, repeat=nd):
        layout = tuple(None if i in plain else tuple(_place(p[i], t) for p in picks) for i, t in enumerate(leaves))
        if layout not in seen:
            seen.add(layout)
            out.append(list(layout))
    return out


def _whole_mesh_cases(op, entry, sample: Sample, metas, mesh_shape, rep: OpReport) -> list:
    leaves = leaves_of(sample.args, sample.kwargs)
    n_self = len(sample.args[0]) if _inplace_list(op, sample) else 0
    cases = []
    for current in _candidate_layouts(leaves, sample.plain, len(mesh_shape)):
        try:
            dec = entry.rule(_schema(op, sample, current, metas, mesh_shape), tuple(mesh_shape))
        except NotImplementedError:
            rep.refused += 1
            continue
        target = [None if c is None else tuple(_norm(p, t.ndim) for p in (d or c))
                  for c, d, t in zip(current, dec.inputs, leaves)]
        outs = [None if o is None else tuple(_norm(p, m.ndim) for p in o) for o, m in zip(dec.outputs, metas)]
        case = _Case(f"({_fmt(current)}) => ({_fmt(target)}) -> ({_fmt(outs)})", current, target, outs)
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


# --- running a case ---------------------------------------------------------------------------------

def _specs(checks, outputs, mesh):
    specs = []
    for m, p in zip(checks, outputs):
        if m is None or p is None or None in p:
            specs.append(None)
        else:
            pl = normalize_placements(p, mesh.ndim, m.ndim)
            specs.append(DTensorSpec(mesh, pl, m.shape, m.stride(), m.dtype))
    return specs


def _run_case(op, entry, sample: Sample, case: _Case, metas, checks, expected, mesh_shape, gen, sim_comm: bool):
    """Returns (status, max error, message) with status "ok", "fail" or "real". Kernels that issue
    collectives run again on thread ranks when ``sim_comm``, else they are reported as "real"."""
    if case.error:
        return "fail", float("nan"), case.error
    mesh = _SimMesh(mesh_shape)
    leaves = leaves_of(sample.args, sample.kwargs)
    try:
        schema = _schema(op, sample, case.current, metas, mesh_shape)
        decision = Decision([None if c is None or t == c else t for c, t in zip(case.current, case.target)],
                            [None if m is None else p for m, p in zip(metas, case.outputs)])
        specs = _specs(checks, case.outputs, mesh)
        pieces = [distribute(t, p, mesh_shape, gen) for t, p in zip(leaves, case.target)]
        seed = sample.seed if sample.random else None

        def one_rank(coord: tuple, rank_mesh) -> list:  # on clones: a rerun must see the inputs unmodified
            plan = entry.local(schema, decision, specs, rank_mesh, coord) if entry.local else None
            args, kwargs = rebuild(sample.args, sample.kwargs, [p[coord].clone() for p in pieces])
            return call(op, args, kwargs, plan, seed)

        ranks = coords(mesh_shape)
        try:
            results = dict(zip(ranks, [one_rank(c, mesh) for c in ranks]))
        except NeedsRealRanks:
            if not sim_comm:
                raise
            results = dict(zip(ranks, run_ranks(tuple(mesh_shape), one_rank)))
        worst = 0.0
        tol = tolerance([t.dtype for t in leaves] + [e.dtype for e in expected if isinstance(e, torch.Tensor)])
        for o, exp in enumerate(expected):
            got = {c: res[o] if o < len(res) else None for c, res in results.items()}
            spec = specs[o] if o < len(specs) else None
            worst = max(worst, compare_output(o, exp, got, spec, mesh_shape, sample.undefined, tol))
        return "ok", worst, ""
    except (NeedsRealRanks, NotSimulated) as e:
        return "real", float("nan"), str(e)
    except Mismatch as e:
        return "fail", e.err, str(e)
    except Exception as e:  # a local op rejecting its pieces is a rule bug too
        return "fail", float("nan"), f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


# --- driver -----------------------------------------------------------------------------------------

def _perturb(x, zero: bool):
    """Another value of the same type: the sign flipped and moved, or zero."""
    if type(x) in (list, tuple) and x and type(x[0]) in (int, float, bool, complex):
        return type(x)(_perturb(y, zero) for y in x)
    if type(x) is bool:
        return not x
    return x if type(x) not in (int, float, complex) else 0 * x if zero else -2 * x - 1


def _scalar_dependence(op, entry, sample: Sample, metas, mesh_shape) -> str:
    """Pointwise/foreach plans are cached by scalar types only (a new learning rate reuses the plan),
    so their rules must answer the same for other scalar values."""
    leaves, nd = leaves_of(sample.args, sample.kwargs), len(mesh_shape)
    layouts = _candidate_layouts(leaves, sample.plain, nd) if entry.whole_mesh else [
        [None if i in sample.plain else (R,) * nd for i in range(len(leaves))]]
    for layout in layouts:
        answers = []
        for perturb in (None, False, True):
            schema = _schema(op, sample, layout, metas, mesh_shape)
            if perturb is not None:
                schema.args = tuple(_perturb(a, perturb) for a in schema.args)
                schema.kwargs = {k: v if type(v) in (list, tuple) else _perturb(v, perturb)
                                 for k, v in schema.kwargs.items()}
            try:
                sizes = [tuple(mesh_shape)] if entry.whole_mesh else sorted(set(mesh_shape))
                answers.append(repr([entry.rule(schema, s) for s in sizes]))
            except NotImplementedError as e:
                answers.append(f"refused: {e}")
        if len(set(answers)) > 1:
            return f"the rule's answer for ({_fmt(layout)}) changes with scalar values, which the plan cache ignores"
    return ""


def _expected(op, sample: Sample) -> list:
    args, kwargs = rebuild(sample.args, sample.kwargs, [t.clone() for t in leaves_of(sample.args, sample.kwargs)])
    if sample.random:
        torch.manual_seed(sample.seed)
    return flatten(op, op(*args, **kwargs), args)


def _check_sample(op, entry, sample: Sample, meshes, rep: OpReport, gen, sim_comm: bool) -> None:
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
    for ms in meshes:
        n = ms[0] if len(ms) == 1 else ms
        try:
            cases = make(op, entry, sample, metas, ms, rep)
            msg = _scalar_dependence(op, entry, sample, metas, ms) if entry.scalar_insensitive else ""
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
            status, err, msg = _run_case(op, entry, sample, case, metas, checks, expected, ms, gen, sim_comm)
            if status == "real":
                rep.real_ranks.append(f"[{sample.label}] n={_mesh_str(n)} {case.label}: {msg}")
                continue
            rep.checked += 1
            if status == "fail":
                rep.failures.append(Failure(name, sample.label, n, case.label, err, msg))


def _mesh_str(n) -> str:
    return str(n) if isinstance(n, int) else "x".join(map(str, n))


def _check_sizes(world_sizes) -> tuple:
    sizes = tuple(world_sizes)
    for n in sizes:
        dims = n if isinstance(n, tuple) else (n,)
        if not dims or any(not isinstance(d, int) or isinstance(d, bool) or d < 1 for d in dims):
            raise ValueError(f"world_sizes={world_sizes!r}: each mesh must be a size >= 1 or a tuple of them "
                             "(an N-D mesh shape), e.g. (2, 3, 4, (2, 2))")
    if not sizes:
        raise ValueError("world_sizes is empty: give at least one mesh size, e.g. (2, 3, 4)")
    return sizes


def validate_rules(ops=None, world_sizes=(2, 3, 4), seed: int = 0, samples=None,
                   simulate_collectives: bool = False) -> ValidationReport:
    """Check the sharding rules of ``ops`` (default: every registered op) on simulated meshes: an int
    in ``world_sizes`` is a 1-D mesh of that size, a tuple an N-D mesh shape.

    ``samples`` optionally maps an op to its own list of ``Sample`` (instead of the built-in ones).
    Local kernels issuing collectives are listed as needing real ranks, unless ``simulate_collectives``
    runs them on thread ranks with simulated collectives (``thread_ranks.py``).

    >>> from torch.ops import aten
    >>> validate_rules([aten.add.Tensor], world_sizes=(3,)).ok
    True
    """
    sizes = _check_sizes(world_sizes)
    meshes = [n if isinstance(n, tuple) else (n,) for n in sizes]
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
                _check_sample(op, lookup_rule(op), sample, meshes, rep, gen, simulate_collectives)
    report.seconds = time.perf_counter() - start
    return report
