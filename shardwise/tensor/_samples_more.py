"""Sample inputs for the rule validator, part 2: embedding, foreach and norm ops (see ``_samples``)."""

from __future__ import annotations

from torch.ops import aten

from ._samples import Plain, S, Sample, _BUILDERS, _on  # noqa: F401  (the registry lives there)


# --- embedding (row-wise tables: ids spread over every rank's row block) -------------------------------

@_on(aten.embedding.default)
def _embedding(op, m):
    return [S(m.f(10, 4), m.i(5, 3, hi=10)), S(m.f(3, 5), m.i(7, hi=3)), S(m.f(10, 4), m.i(5, hi=10), 2),
            S(m.f(10, 4), m.i(2, 3, hi=10), scale_grad_by_freq=True)]


@_on(aten.embedding_dense_backward.default)
def _embedding_backward(op, m):
    return [S(m.f(5, 3, 4), m.i(5, 3, hi=10), 10, -1, False), S(m.f(7, 5), m.i(7, hi=3), 3, 1, False),
            S(m.f(5, 3, 4), m.i(5, 3, hi=10), 10, 2, True)]


@_on(aten.embedding_renorm_.default)
def _embedding_renorm(op, m):
    return [S(m.f(10, 4) * 3, m.i(6, hi=10), 1.0, 2.0), S(m.f(3, 5) * 3, m.i(4, hi=3), 0.5, 1.0)]


# --- foreach: arguments made from the overload's schema -----------------------------------------------

def _foreach_arg(a, m, pos: bool):
    t = str(a.type)
    if t in ("Tensor[]", "List[Tensor]"):
        shapes = [(5, 3), (2,), (3, 1)]
        return [m.pos(*s) if pos else m.f(*s) for s in shapes]
    if t in ("Scalar[]", "List[number]"):
        return [0.5, -2.0, 3.0]
    if t in ("Scalar", "number"):  # a negative factor catches pending max/min passed through a scaling
        return {"alpha": 0.5, "self": 2.0}.get(a.name, -2.0)
    if t == "Tensor":  # a scalar operand, or addcmul's per-tensor scalars
        return m.f(3) if a.name == "scalars" else Plain(m.f())
    if t == "bool":
        return False
    raise AssertionError(f"no sample for foreach argument {a}")


def _foreach(op, m):
    name = op._schema.name.split("::")[-1]
    pos = any(k in name for k in ("sqrt", "log", "pow", "div", "reciprocal"))
    args, kwargs = [], {}
    for a in op._schema.arguments:
        if a.kwarg_only:
            kwargs[a.name] = _foreach_arg(a, m, pos)
        else:
            args.append(_foreach_arg(a, m, pos))
    out = [Sample(tuple(args), kwargs)]
    if any(isinstance(a, Plain) for a in args):  # the 0-d operand as a replicated DTensor, too
        out.append(Sample(tuple(a.t if isinstance(a, Plain) else a for a in args), kwargs))
    return out


def _register_foreach():
    from .ops.foreach import _ops
    from .propagation.registry import RULES

    for packet in _ops():
        for name in packet.overloads():
            if getattr(packet, name) in RULES:
                _BUILDERS.setdefault(getattr(packet, name), _foreach)


_register_foreach()


# --- norms (sharded reductions run a collective kernel: checked on real ranks too) ----------------------

@_on(aten.linalg_vector_norm.default)
def _vector_norm(op, m):
    return [S(m.f(5, 3)), S(m.f(5, 3), 1.0, [0]), S(m.f(5, 3), float("inf"), [1], True), S(m.f(2, 7), 3.0),
            S(m.f(4, 3), 0.0), S(m.f(3, 5), -float("inf"), [0])]


@_on(aten._foreach_norm.Scalar)
def _foreach_norm(op, m):
    return [S([m.f(5, 3), m.f(2), m.f(3, 1)], 2.0), S([m.f(5, 3), m.f(4)], float("inf"))]


# --- slicing backward (gradients scattered into zeros) ------------------------------------------------

@_on(aten.slice_backward.default)
def _slice_backward(op, m):
    return [S(m.f(6, 3), [6, 5], 1, 1, 4, 1), S(m.f(3, 5), [6, 5], 0, 0, 5, 2), S(m.f(5, 2), [7, 2], 0, 2, 7, 1)]


@_on(aten.select_backward.default)
def _select_backward(op, m):
    return [S(m.f(5), [6, 5], 0, 2), S(m.f(7), [7, 3], 1, -1)]
