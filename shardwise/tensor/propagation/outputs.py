"""What an op returns, before it runs: its outputs on meta tensors of the global shapes (the shapes a
plan's output specs take), and the stand-in kernel of a rank outside the op's mesh."""

from __future__ import annotations

from typing import Optional

import torch

from .propagator import op_mutates_first_arg

__all__ = ["meta_outputs", "outside_kernel"]


def meta_outputs(op, args, kwargs, cls) -> list[Optional[torch.Tensor]]:
    """Run the op on meta tensors with the global shapes; returns the flat list of outputs."""

    if not any("Tensor" in str(r.type) for r in op._schema.returns):
        return [None] * len(op._schema.returns)

    def to_meta(x, plain=True):
        if isinstance(x, cls):
            s = x._spec
            return torch.empty_strided(s.shape, s.stride, dtype=s.dtype, device="meta")
        if isinstance(x, torch.Tensor):
            return x.to("meta") if plain else x
        if isinstance(x, (list, tuple)) and x and isinstance(x[0], torch.Tensor):
            return [to_meta(y, plain) for y in x]
        return x

    margs = [to_meta(a) for a in args]
    mkwargs = {k: to_meta(v) for k, v in kwargs.items()}
    if "device" in mkwargs:
        mkwargs["device"] = torch.device("meta")
    try:
        out = op(*margs, **mkwargs)
    except (RuntimeError, NotImplementedError):
        # some ops read a small plain tensor's values on the host (foreach `scalars`): keep plain
        # tensors real and only make the distributed ones meta
        margs = [to_meta(a, plain=False) for a in args]
        mkwargs = {k: to_meta(v, plain=False) for k, v in kwargs.items()}
        try:
            out = op(*margs, **mkwargs)
        except NotImplementedError:
            margs, mkwargs, out = _without_meta_kernel(op, args, kwargs, cls)
    if op_mutates_first_arg(op) and len(op._schema.returns) <= 1:
        out = margs[0] if not isinstance(margs[0], list) else margs[0]
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [o if isinstance(o, torch.Tensor) else None for o in out]
    return []


def _without_meta_kernel(op, args, kwargs, cls):
    """An op with no meta kernel (geqrf): its output shapes from one call on zero-filled CPU tensors of
    the global shapes. Refused for ops whose output shapes depend on the values (nonzero, unique): a
    global shape guessed from zeros would be wrong."""
    if torch.Tag.dynamic_output_shape in op.tags or torch.Tag.data_dependent_output in op.tags:
        raise NotImplementedError(
            f"{op}: its output shape depends on the input values and it has no meta kernel, so the "
            "DTensor's global shape cannot be known before it runs; call it on .full_tensor() (or "
            ".to_local()) and wrap the result with DTensor.from_local")

    def zeros(x):
        if isinstance(x, cls):
            s = x._spec
            return torch.zeros(s.shape, dtype=s.dtype)
        if isinstance(x, torch.Tensor):
            return torch.zeros(x.shape, dtype=x.dtype)
        if isinstance(x, (list, tuple)) and x and isinstance(x[0], torch.Tensor):
            return [zeros(y) for y in x]
        return x

    zargs = [zeros(a) for a in args]
    zkwargs = {k: zeros(v) for k, v in kwargs.items()}
    if "device" in zkwargs:
        zkwargs["device"] = torch.device("cpu")
    out = op(*zargs, **zkwargs)
    meta = lambda t: t.to("meta") if isinstance(t, torch.Tensor) else t  # noqa: E731
    out = [meta(o) for o in out] if isinstance(out, (list, tuple)) else meta(out)
    return [meta(a) for a in zargs], {k: meta(v) for k, v in zkwargs.items()}, out


def outside_kernel(out_specs, device):
    """The local op of a rank outside the op's mesh, as PyTorch's: no collective and no compute; a tensor
    output is an empty tensor (0-d: a zero) with the output's dtype, a non-tensor output is None."""

    def empty(spec):
        return torch.zeros((), dtype=spec.dtype, device=device) if not spec.shape else \
            torch.empty(0, dtype=spec.dtype, device=device)

    def kernel(op, args, kwargs):
        rets = op._schema.returns
        if op_mutates_first_arg(op) and len(rets) == 1:
            return args[0]
        if len(rets) == 1 and str(rets[0].type) == "Tensor":
            return empty(out_specs[0])
        if all(s is None for s in out_specs):
            return None
        return [None if s is None else empty(s) for s in out_specs]

    return kernel
