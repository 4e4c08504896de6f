"""Validator samples for ``ops/optim/foreach.py``: arguments made from each registered overload's schema."""

from __future__ import annotations

from ..base import _BUILDERS, Plain, Sample


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
    from ....ops.optim.foreach import _ops
    from ....propagation.registry import RULES

    for packet in _ops():
        for name in packet.overloads():
            if getattr(packet, name) in RULES:
                _BUILDERS.setdefault(getattr(packet, name), _foreach)


_register_foreach()
