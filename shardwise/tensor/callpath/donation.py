"""Buffer donation: reduce a pending DTensor's local buffer in place when nothing else can see it.

A reduction to ``Replicate`` must return a new value. When the source DTensor is a temporary, as in
``F.embedding(ids, w).full_tensor()``, nobody can observe its local buffer afterwards, so the
all-reduce may run in place on it instead of on a fresh copy (what a hand-written lookup does). This
is the same idea as PyTorch's AccumulateGrad stealing a gradient whose use count is one, or JAX's
``donate_argnums``, decided here from reference counts:

* the DTensor has no Python reference besides the caller's argument slot (calibrated once per
  interpreter, below) and no C++ reference (autograd did not save it);
* its local tensor is referenced only by the DTensor, is not a view and shares its storage with no
  other tensor (no ``to_local()`` result or view of it is alive);
* no torch dispatch mode is active (tracing wants the functional, out-of-place graph).

If the interpreter cannot tell a temporary from a named value (another CPython's reference
semantics), donation is off and every reduction copies, which is always correct.

>>> import torch.nn.functional as F
>>> from shardwise.tensor import Replicate, Shard, distribute_tensor, init_device_mesh
>>> mesh = init_device_mesh("cpu", (1,))
>>> w = distribute_tensor(torch.randn(10, 4), mesh, [Shard(0)])
>>> ids = distribute_tensor(torch.tensor([1, 9, 1]), mesh, [Replicate()])
>>> out = F.embedding(ids, w)      # a pending sum
>>> a = out.full_tensor()          # out is named: copied, out stays valid
>>> b = F.embedding(ids, w).full_tensor()   # a temporary: reduced in place
>>> torch.equal(a, b), torch.equal(out.full_tensor(), a)
(True, True)
"""

from __future__ import annotations

import sys

import torch

__all__ = ["donatable"]


class _Probe:
    def refs(self) -> int:
        return sys.getrefcount(self)


def _temporary_refs():
    """References a method's ``self`` has when the receiver is a temporary; None if a named receiver
    looks the same (then donation is never safe to decide)."""
    temp = _Probe().refs()
    named = _Probe()
    return temp if named.refs() > temp else None


# a property of the interpreter, not program state: computed once, never changed
_TEMPORARY_REFS = _temporary_refs()


def donatable(dt, refs: int) -> bool:
    """Whether ``dt`` can hand its local buffer to an in-place collective. ``refs`` is
    ``sys.getrefcount(self)`` taken as a statement of its own at the top of the public method (an
    expression that also passes ``self`` elsewhere would count that reference too)."""
    if _TEMPORARY_REFS is None or refs > _TEMPORARY_REFS or dt._use_count() != 1:
        return False
    local = dt._local_tensor
    if type(local) is not torch.Tensor or local._base is not None or local.requires_grad:
        return False
    if torch._C._len_torch_dispatch_stack() or not local.is_contiguous():
        return False
    # the DTensor's attribute, this frame's name and getrefcount's argument: nobody else
    if sys.getrefcount(local) > 3 or local._use_count() != 1:
        return False
    # this tensor and the temporary storage object: no view or alias shares the memory
    return torch._C._storage_Use_Count(local.untyped_storage()._cdata) == 2
