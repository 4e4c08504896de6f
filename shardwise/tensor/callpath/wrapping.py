"""Making the DTensor object around a local result: paid once per op on every dispatch path.

``torch.Tensor._dtensor__new__`` is the C++ constructor PyTorch's own DTensor uses: it reads
``spec.tensor_meta.shape`` / ``.stride`` (a ``DTensorSpec`` of ours answers with itself), takes dtype,
device and layout from the local tensor and sets ``_spec`` and ``_local_tensor``, in about half the
time of ``_make_wrapper_subclass`` (whose argument parser takes 15 arguments) plus two attribute
writes. It differs from the generic constructor in three cases, which keep the generic one:

- a local tensor that requires grad (a DTensor wrapped under ``no_grad`` around a tensor that requires
  grad): the C++ constructor warns;
- a conjugate or negative view: it copies those dispatch bits onto the wrapper, which would change how
  later ops on the DTensor run;
- a layout other than strided: the generic constructor makes a strided wrapper.

``wrap`` checks all three. ``wrap_fresh`` is for results the plan knows to be new tensors made from
strided ones (not views: ops whose schema returns no alias), where only the first can happen; the
dispatch paths inline its two lines. A torch without the C++ constructor gets the generic one.

>>> from shardwise.tensor import DTensor, DeviceMesh, Shard
>>> x = DTensor.from_local(torch.ones(2, 3), DeviceMesh("cpu", [0]), [Shard(0)])
>>> y = wrap(DTensor, torch.zeros(2, 3), x._spec)
>>> type(y).__name__, tuple(y.shape), y.placements, y.requires_grad
('DTensor', (2, 3), (Shard(dim=0),), False)
"""

from __future__ import annotations

import torch

__all__ = ["wrap", "wrap_fresh", "wrap_generic", "NEW"]

_MAKE = torch.Tensor._make_wrapper_subclass
_STRIDED = torch.strided
NEW = getattr(torch.Tensor, "_dtensor__new__", None)  # (cls, local, spec, requires_grad)


def wrap_generic(cls, local: torch.Tensor, spec):
    # positional arguments: keyword parsing in _make_wrapper_subclass is measurable per op
    r = _MAKE(cls, spec.shape, spec.stride, None, None, spec.dtype, _STRIDED, local.device)
    r._local_tensor = local
    r._spec = spec
    return r


if NEW is None:
    wrap = wrap_fresh = wrap_generic
else:
    def wrap(cls, local: torch.Tensor, spec):
        """The DTensor ``cls`` with ``spec`` around any local tensor (requires_grad False)."""
        if local.requires_grad or local.is_conj() or local.is_neg() or local.layout is not _STRIDED:
            return wrap_generic(cls, local, spec)
        return NEW(cls, local, spec, False)

    def wrap_fresh(cls, local: torch.Tensor, spec):
        """``wrap`` for a new (non-view) result of an op on strided tensors."""
        if local.requires_grad:
            return wrap_generic(cls, local, spec)
        return NEW(cls, local, spec, False)
