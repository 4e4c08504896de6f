"""Per-rank machinery of the rule validator: argument leaves, local inputs from full tensors, the local
call, and assembling plus comparing the global result. Meshes are shapes (``(4,)``, ``(2, 2)``);
a rank is its mesh coordinate.

>>> pieces = distribute(torch.arange(5.0), (Shard(0), Shard(0)), (2, 2), None)
>>> [pieces[c].tolist() for c in sorted(pieces)]
[[0.0, 1.0], [2.0], [3.0], [4.0]]
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from ..placements import MaskPartial, NormPartial, Placement, Replicate, Shard
from ..propagation.propagator import op_mutates_first_arg

__all__ = ["leaves_of", "rebuild", "partial_pieces", "distribute", "coords", "flatten", "call", "tolerance",
           "compare_output", "Mismatch", "Raw"]


class Mismatch(Exception):
    def __init__(self, message: str, err: float = float("nan")):
        super().__init__(message)
        self.err = err


@dataclass
class Raw:  # a non-tensor result (``_local_scalar_dense``)
    value: object


def coords(mesh_shape) -> list:
    return list(itertools.product(*(range(n) for n in mesh_shape)))


def leaves_of(args, kwargs) -> list:
    """Tensor leaves in the dispatcher's order: args (lists flattened), then tensor kwargs."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(x for x in a if isinstance(x, torch.Tensor))
    out.extend(v for v in kwargs.values() if isinstance(v, torch.Tensor))
    return out


def rebuild(args, kwargs, leaves: Sequence) -> tuple[list, dict]:
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


# --- local inputs -----------------------------------------------------------------------------------

def partial_pieces(full: torch.Tensor, op: str, n: int, gen) -> list:
    """``n`` random pieces whose ``op`` reduction is ``full`` (max/min: each element exact on one
    random rank, strictly smaller/larger elsewhere; product: random factors in [0.5, 1.5) and the
    quotient)."""
    shape, dt = tuple(full.shape), full.dtype
    if op == "product" and (dt.is_floating_point or dt.is_complex):
        factors = (torch.rand((n - 1, *shape), generator=gen) + 0.5).to(dt)  # away from 0: no blow-up
        return [*factors.unbind(0), full / factors.prod(0)]
    if op == "product":  # integers and bools: the value on one random rank, ones elsewhere
        owner = torch.randint(0, n, shape, generator=gen)
        return [torch.where(owner == r, full, torch.ones_like(full)) for r in range(n)]
    if op in ("sum", "avg"):
        target = full * n if op == "avg" else full
        if dt.is_floating_point:
            noise = torch.randn((n - 1, *shape), generator=gen).to(dt)
        else:
            noise = torch.randint(-3, 4, (n - 1, *shape), generator=gen).to(dt)
        return [*noise.unbind(0), target - noise.sum(0)]
    owner = torch.randint(0, n, shape, generator=gen)
    pieces = []
    for r in range(n):
        if dt == torch.bool:
            coin = torch.rand(shape, generator=gen) < 0.5
            other = (full & coin) if op == "max" else (full | coin)
        else:
            if dt.is_floating_point:
                delta = (torch.rand(shape, generator=gen) + 0.25).to(dt)
            else:
                delta = torch.randint(1, 4, shape, generator=gen).to(dt)
            other = full - delta if op == "max" else full + delta
        pieces.append(torch.where(owner == r, full, other))
    return pieces


def _shard(full: torch.Tensor, dim: int, n: int) -> list:
    # torch.chunk sizes written out (not spec.chunk_range): the ground truth the specs are checked against
    if full.dim() == 0:
        raise ValueError("Shard on a 0-d tensor")
    size = full.shape[dim]
    chunk = -(-size // n)
    sizes = [max(0, min(chunk, size - r * chunk)) for r in range(n)]
    return [t.clone() for t in torch.split(full, sizes, dim=dim)]


def _split(full: torch.Tensor, p: Placement, n: int, gen) -> list:
    if type(p) is Replicate:
        return [full.clone() for _ in range(n)]
    if type(p) is Shard:
        return _shard(full, p.dim, n)
    if isinstance(p, NormPartial):  # pending p-norms: the placement knows the parts ops make
        return p.split(full, n, gen)
    return partial_pieces(full, p.reduce_op, n, gen)


def distribute(full: torch.Tensor, placements: Optional[tuple], mesh_shape, gen) -> dict:
    """coord -> local input: mesh dims applied in order, so shards of one tensor dim nest."""
    if placements is None:  # a plain tensor: every rank has it
        return {c: full.clone() for c in coords(mesh_shape)}
    pieces = {(): full}
    for p, n in zip(placements, mesh_shape):
        pieces = {c + (k,): t for c, whole in pieces.items() for k, t in enumerate(_split(whole, p, n, gen))}
    return pieces


# --- the local call ---------------------------------------------------------------------------------

def flatten(op, out, args) -> list:
    """Outputs as the dispatcher lists them (an in-place op's are its mutated first argument)."""
    if op_mutates_first_arg(op) and len(op._schema.returns) <= 1:
        out = args[0]
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [o if isinstance(o, torch.Tensor) else None for o in out]
    return [Raw(out)]


def call(op, args: list, kwargs: dict, plan, seed: Optional[int]) -> list:
    """The dispatcher's local step: the plan's substitutions, then its kernel or the op."""
    if plan is not None:
        for i, v in plan.arg_subs.items():
            args[i] = v
        if plan.kwarg_subs:
            kwargs = {**kwargs, **plan.kwarg_subs}
    if seed is not None:
        torch.manual_seed(seed)
    out = plan.kernel(op, args, kwargs) if plan is not None and plan.kernel else op(*args, **kwargs)
    return flatten(op, out, args)


# --- comparison -------------------------------------------------------------------------------------

_TOL = {torch.float64: (1e-7, 1e-9), torch.float16: (2e-2, 2e-2), torch.bfloat16: (2e-2, 2e-2)}


def tolerance(dtypes) -> tuple[float, float]:
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
        rtol, atol = tol or tolerance([b.dtype])
        return torch.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
    return torch.equal(a, b)


def _combine(pieces: list, p: Placement, n: int, tol, undefined: bool, where: str) -> torch.Tensor:
    """The value over one mesh dim from its ``n`` pieces in coordinate order."""
    if type(p) is Shard:
        return torch.cat(pieces, p.dim)
    if type(p) is Replicate:
        for r, t in enumerate(pieces[1:], 1):
            if not undefined and not _close(t, pieces[0], tol):
                raise Mismatch(f"replicated output differs between {where}0 and {where}{r}", _max_err(t, pieces[0]))
        return pieces[0]
    stacked, dt = torch.stack(pieces), pieces[0].dtype
    if isinstance(p, NormPartial):  # pending p-norms: the placement knows its reduction
        return p.combine(stacked).to(dt)
    op = "sum" if isinstance(p, MaskPartial) else p.reduce_op
    if op in ("max", "min"):
        return stacked.amax(0) if op == "max" else stacked.amin(0)
    if op == "product":
        return stacked.prod(0).to(dt)
    total = stacked.sum(0).to(dt)
    if op == "sum":
        return total
    return total / n if dt.is_floating_point else torch.div(total, n, rounding_mode="floor")


def _assemble(pieces: dict, placements: tuple, mesh_shape, tol, undefined: bool) -> torch.Tensor:
    """Undo ``distribute``: combine the last mesh dim first."""
    for m in reversed(range(len(mesh_shape))):
        groups: dict = {}
        for c in sorted(pieces):
            groups.setdefault(c[:m], []).append(pieces[c])
        where = "rank " if len(mesh_shape) == 1 else f"mesh dim {m} index "
        pieces = {k: _combine(v, placements[m], mesh_shape[m], tol, undefined, where) for k, v in groups.items()}
    return pieces[()]


def compare_output(o: int, exp, pieces: dict, spec, mesh_shape, undefined: bool, tol) -> float:
    """Check output ``o`` of every rank (``pieces``: coord -> local value) against ``exp``; returns the
    max error or raises Mismatch."""
    if exp is None:
        if any(p is not None for p in pieces.values()):
            raise Mismatch(f"output {o}: a rank returned a tensor where the op returns none")
        return 0.0
    if isinstance(exp, Raw):
        for c, p in pieces.items():
            if not isinstance(p, Raw) or not _close(torch.tensor(p.value), torch.tensor(exp.value)):
                raise Mismatch(f"output {o}: rank {c} returned {getattr(p, 'value', p)!r}, expected {exp.value!r}")
        return 0.0
    if spec is None:
        raise Mismatch(f"output {o} is a tensor but the rule gives it no placement")
    pl = ",".join(str(p) for p in spec.placements)
    for c, p in pieces.items():
        want = spec.local_shape(c)
        if not isinstance(p, torch.Tensor) or tuple(p.shape) != want or p.dtype != spec.dtype:
            got = (tuple(p.shape), p.dtype) if isinstance(p, torch.Tensor) else p
            rank = c[0] if len(c) == 1 else c
            raise Mismatch(f"output {o} rank {rank}: local {got}, but its spec {pl} of "
                           f"{tuple(spec.shape)} {spec.dtype} says {want}")
    got = _assemble(pieces, spec.placements, mesh_shape, tol, undefined)
    if undefined:
        return 0.0
    err = _max_err(got, exp)
    if not _close(got, exp, tol):
        raise Mismatch(f"output {o} ({pl}) differs from the full-tensor op", err)
    return err
