"""DTensor: a torch.Tensor subclass whose data is laid out over a DeviceMesh.

>>> from shardwise.tensor import Shard, distribute_tensor, init_device_mesh
>>> w = distribute_tensor(torch.ones(8, 4), init_device_mesh("cpu", (1,)), [Shard(0)])  # on (2,): 4 rows each
>>> (w * 2).sum().full_tensor()                                  # ordinary torch code runs
tensor(64.)
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

import torch
from torch.distributed.device_mesh import DeviceMesh

from .checks.agreement import check_same_call, checks_enabled
from .dispatch import GATHER_FALLBACK, OpDispatcher
from .callpath.donation import donatable
from .callpath.fastpath import _SLOW, FAST_PATH, FastPath, make_entry
from .full import full_local
from .callpath.function_hooks import HOOKS as _HOOKS
from .callpath.wrapping import NEW as _NEW
from .callpath.wrapping import wrap, wrap_generic
from .full import grad_placements as _grad_placements
from .checks.layout import check_device, check_from_local, check_local_shapes
from .placements import Partial, Placement, Replicate, Shard
from .redistribute import redistribute_local
from .spec import DTensorSpec, _global_stride, coord_or_none, mesh_or_current, normalize_placements

__all__ = ["DTensor", "gather_fallback", "fast_path", "propagation_cache"]

_NO_TORCH_FUNCTION = torch._C.DisableTorchFunctionSubclass
_GRAD_ON = torch.is_grad_enabled
_FAST_PATH_ON = FAST_PATH.get
_SCALARS = (int, float, bool)


class _FromLocal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local, spec):
        ctx.spec = spec
        return DTensor._wrap(local.view_as(local), spec)

    @staticmethod
    def backward(ctx, grad):
        spec = ctx.spec
        if not isinstance(grad, DTensor):
            return grad, None
        target = tuple(spec.placements)
        if grad._spec.placements != target:
            grad = grad.redistribute(spec.mesh, _grad_placements(target))
        return grad._local_tensor, None


class _ToLocal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, grad_placements):
        ctx.spec = x._spec
        ctx.grad_placements = grad_placements
        return x._local_tensor.view_as(x._local_tensor)

    @staticmethod
    def backward(ctx, grad):
        spec = ctx.spec
        placements = spec.placements if ctx.grad_placements is None else ctx.grad_placements
        gspec = DTensorSpec(spec.mesh, placements, spec.shape, spec.stride, grad.dtype)
        return DTensor._wrap(grad, gspec), None


def _moved(x: "DTensor", placements, donate: bool) -> "DTensor":
    src = x._spec
    local = redistribute_local(x._local_tensor, src, placements, coord_or_none(src.mesh), donate)
    return DTensor._wrap(local, src.with_placements(placements))


class _Redistribute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, placements, donate):
        ctx.src = x._spec
        if placements == x._spec.placements:
            return DTensor._wrap(x._local_tensor.view_as(x._local_tensor), x._spec)
        return _moved(x, placements, donate)

    @staticmethod
    def backward(ctx, grad):
        # never donated: autograd may hand the same gradient buffer to several consumers
        src = ctx.src
        target = _grad_placements(src.placements)
        if grad._spec.placements == target:
            return grad, None, None
        local = redistribute_local(grad._local_tensor, grad._spec, target, coord_or_none(src.mesh))
        return DTensor._wrap(local, grad._spec.with_placements(target)), None, None


class DTensor(torch.Tensor):
    """A global tensor whose local pieces live on the ranks of a DeviceMesh.

    Public API mirrors ``torch.distributed.tensor.DTensor``: ``from_local``, ``to_local``,
    ``redistribute``, ``full_tensor``, ``placements``, ``device_mesh``. Ordinary torch ops run on it
    with the collectives their sharding needs; autograd and ``torch.optim`` work.

    >>> x = DTensor.from_local(torch.ones(2, 3), DeviceMesh("cpu", [0]), [Shard(0)])  # a 1-rank mesh
    >>> x.shape                          # local rows x mesh size: [4, 3] on a mesh of 2 ranks
    torch.Size([2, 3])
    """

    # slots, as PyTorch's DTensor: cheaper to set than instance-dict entries, once per op
    __slots__ = ("_local_tensor", "_spec")
    _local_tensor: torch.Tensor
    _spec: DTensorSpec

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if _HOOKS.open:  # a with block (loss_parallel) takes over some functions; see function_hooks.py
            hook = _HOOKS.lookup(func)
            if hook is not None:
                out = hook(func, args, kwargs or {})
                if out is not NotImplemented:
                    return out
        # the hottest cases inline (calls whose first argument is a DTensor); see fastpath.py
        a = args[0] if args else None
        if type(a) is cls:
            n = len(args)
            b = args[1] if n == 2 else None
            with _NO_TORCH_FUNCTION():
                # requires_grad first: grad mode is read only when an input asks for recording
                if (a.requires_grad or (isinstance(b, torch.Tensor) and b.requires_grad)) and _GRAD_ON():
                    # autograd records the backward; the op reaches __torch_dispatch__ (its quick map)
                    return func(*args, **kwargs) if kwargs else func(*args)
                if not kwargs and n <= 2 and _FAST_PATH_ON():
                    if n == 1:
                        plan = _FAST_PLANS.get((func, a._spec))
                    elif type(b) is cls:
                        plan, b = _FAST_PLANS.get((func, a._spec, b._spec)), b._local_tensor
                    elif type(b) in _SCALARS:  # the key FastPath._key makes for (DTensor, scalar)
                        key = type(b) if _FASTPATH.scalar_types_only.get(func) else b
                        plan = _FAST_PLANS.get((func, a._spec, key))
                    else:
                        plan = None
                    if plan is not None and plan[1] == "wrap":
                        out = func(a._local_tensor) if n == 1 else func(a._local_tensor, b)
                        # a new tensor (views are not learnt): wrapping.wrap_fresh, inlined
                        if _NEW is None or out.requires_grad:
                            return wrap_generic(cls, out, plan[0])
                        return _NEW(cls, out, plan[0], False)
                    if plan is _SLOW:
                        # learnt to have no local plan (a property read such as ``x.requires_grad``, a
                        # view): what the fast path would end up doing, without its generic key walk
                        return func(*args)
        return _FASTPATH(func, args, kwargs)

    @staticmethod
    def __new__(cls, local_tensor: torch.Tensor, spec: DTensorSpec, *, requires_grad: bool = False):
        r = torch.Tensor._make_wrapper_subclass(
            cls, spec.shape, strides=spec.stride, dtype=spec.dtype, device=local_tensor.device,
            requires_grad=requires_grad,
        )
        r._local_tensor = local_tensor
        r._spec = spec
        return r

    @classmethod
    def _wrap(cls, local: torch.Tensor, spec: DTensorSpec) -> "DTensor":
        return wrap(cls, local, spec)

    # __torch_dispatch__ is set below the class, once the dispatcher exists: dispatch.make_entry

    def __repr__(self) -> str:
        pl = ", ".join(str(p) for p in self._spec.placements)
        return f"DTensor(local={self._local_tensor!r}, placements=({pl}), shape={tuple(self.shape)})"

    # torch.compile / make_fx support: the subclass is a (local tensor, spec) pair
    def __tensor_flatten__(self):
        return ["_local_tensor"], (self._spec, self.requires_grad)

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        spec, requires_grad = meta
        spec = DTensorSpec(spec.mesh, spec.placements, outer_size, outer_stride, spec.dtype)
        return DTensor(inner["_local_tensor"], spec, requires_grad=requires_grad)

    @classmethod
    def __metadata_guard__(cls, saved, now) -> bool:
        # torch.compile's guard keeps a deep copy of the metadata, so the mesh is compared by value (a
        # spec compares it by identity); sizes and strides are guarded on the outer tensor already
        (a, grad_a), (b, grad_b) = saved, now
        return grad_a == grad_b and a.placements == b.placements and a.dtype == b.dtype and a.mesh == b.mesh

    def __coerce_tangent_metadata__(self):
        # the layout a compiled backward expects its incoming gradient in: a pending sum's gradient is
        # replicated (what .full_tensor()'s backward gives), so the backward needs no collective for it
        if not any(isinstance(p, Partial) for p in self._spec.placements):
            return self
        return self.redistribute(self.device_mesh, _grad_placements(self._spec.placements))

    def __coerce_same_metadata_as_tangent__(self, expected, expected_type=None):
        # a gradient arriving in another layout than the compiled backward expects: move it, same value
        if expected_type is not None and expected_type is not DTensor:
            return None
        return self.redistribute(self.device_mesh, expected[0].placements)

    # torch.distributed.checkpoint protocol (see checkpoint.py)
    def __create_write_items__(self, fqn: str, obj) -> list:
        from .interop.checkpoint import write_items

        return write_items(fqn, self)

    def __create_chunk_list__(self) -> list:
        from .interop.checkpoint import chunk

        return [chunk(self)]

    def __get_tensor_shard__(self, index) -> torch.Tensor:
        return self._local_tensor

    @property
    def placements(self) -> tuple[Placement, ...]:
        return self._spec.placements

    @property
    def device_mesh(self) -> DeviceMesh:
        return self._spec.mesh

    @staticmethod
    def from_local(
        local_tensor: torch.Tensor,
        device_mesh: Optional[DeviceMesh] = None,
        placements: Optional[Sequence[Placement]] = None,
        *,
        run_check: bool = False,
        shape: Optional[Sequence[int]] = None,
        stride: Optional[Sequence[int]] = None,
    ) -> "DTensor":
        """Wrap this rank's piece. Without ``shape``, shards are assumed even (local size x mesh size);
        pass ``shape`` for uneven torch.chunk shards. ``run_check`` compares all ranks' local shapes.
        A meta piece gives a meta DTensor (shapes only, e.g. a module built on the meta device).
        ``device_mesh=None``: the mesh of the innermost ``with mesh:`` block; ``placements=None``: Replicate.

        >>> DTensor.from_local(torch.ones(2, 3), DeviceMesh("cpu", [0]), [Shard(0)]).shape  # 2 rows x 1 rank
        torch.Size([2, 3])
        """
        if not isinstance(local_tensor, torch.Tensor) or isinstance(local_tensor, DTensor):
            raise TypeError(f"from_local expects a plain torch.Tensor, got {type(local_tensor).__name__}; wrap "
                            "this rank's piece as a tensor (a DTensor is already distributed: use redistribute)")
        device_mesh = mesh_or_current(device_mesh, "from_local")
        if placements is None:
            placements = [Replicate()] * device_mesh.ndim
        check_device(local_tensor, device_mesh, "from_local")
        outside = coord_or_none(device_mesh) is None  # this rank is not in the mesh: nothing to check
        if run_check and not outside:
            placements, gathered = check_from_local(local_tensor, device_mesh, placements)
        else:
            placements, gathered = normalize_placements(placements, device_mesh.ndim, local_tensor.ndim), None
        if shape is None:
            # even shards assumed; under run_check, from the first rank's piece so all ranks agree
            gshape = list(local_tensor.shape if gathered is None else gathered[0][1])
            for mdim, p in enumerate(placements):
                if type(p) is Shard:
                    gshape[p.dim] *= device_mesh.size(mdim)
            shape = gshape
        shape = torch.Size(shape)
        if stride is None:
            stride = _global_stride(local_tensor, device_mesh, placements, shape)
        if gathered is not None:
            check_local_shapes(gathered, device_mesh, placements, shape)
        spec = DTensorSpec(device_mesh, placements, shape, stride, local_tensor.dtype)
        if outside:  # PyTorch's rule: a rank outside the mesh holds an empty piece
            local_tensor = local_tensor.new_empty(0, requires_grad=local_tensor.requires_grad)
        if not (local_tensor.requires_grad and torch.is_grad_enabled()):
            # nothing to record: skip the autograd.Function (a quarter of the cost of a small lookup)
            return DTensor._wrap(local_tensor, spec)
        return _FromLocal.apply(local_tensor, spec)

    def to_local(self, *, grad_placements: Optional[Sequence[Placement]] = None) -> torch.Tensor:
        """This rank's piece, differentiable (gradients come back as a DTensor with this layout)."""
        if not torch.is_grad_enabled() or not self.requires_grad:
            return self._local_tensor
        gp = None if grad_placements is None else tuple(grad_placements)
        return _ToLocal.apply(self, gp)

    def _target(self, device_mesh, placements) -> tuple:
        """Validated target placements of a redistribute call."""
        mesh = device_mesh or self._spec.mesh
        if mesh is not self._spec.mesh and mesh != self._spec.mesh:
            raise ValueError(f"redistribute cannot move a DTensor to another mesh ({self._spec.mesh} -> {mesh}); "
                             "pass its own mesh (x.device_mesh) or None, or rebuild it on the other mesh with "
                             "distribute_tensor(x.full_tensor(), other_mesh, placements)")
        if placements is None:
            raise ValueError("redistribute needs target placements, e.g. [Replicate()]")
        return normalize_placements(placements, mesh.ndim, self.ndim)

    def _agreed_target(self, device_mesh, placements) -> tuple:
        """``_target``, after checking every rank asked the same (checked mode, see checks/agreement.py)."""
        try:
            target, err = self._target(device_mesh, placements), None
            asked = "(" + ", ".join(map(str, target)) + ")"
        except (TypeError, ValueError) as e:
            target, err, asked = None, e, f"an invalid call ({e})"
        src = ", ".join(map(str, self._spec.placements))
        request = f"({src}) -> {asked} of {tuple(self.shape)} {str(self.dtype).replace('torch.', '')}"
        check_same_call(self._spec.mesh, "redistribute", request)
        if err is not None:
            raise err
        return target

    def redistribute(self, device_mesh: Optional[DeviceMesh] = None, placements=None, *, async_op: bool = False,
                     forward_dtype: Optional[torch.dtype] = None,
                     backward_dtype: Optional[torch.dtype] = None) -> "DTensor":
        """Change the layout; differentiable (the backward is the adjoint redistribution).

        A temporary pending value (``F.embedding(ids, w).redistribute(mesh, [Replicate()])``) is reduced
        in its own buffer; a value anything else still references is copied (see donation.py).
        ``forward_dtype`` / ``backward_dtype``: run the move / the gradient's move in that dtype (the
        gradient reaching this tensor has its dtype again), as PyTorch's. ``async_op`` is accepted for
        PyTorch's signature; the result is always ready (collectives are waited for here).
        """
        refs = sys.getrefcount(self)  # first, alone: pending call arguments would add references
        if forward_dtype is None and backward_dtype is None:
            return self._redistribute(device_mesh, placements, donatable(self, refs))
        from .cast import cast_backward, cast_forward

        x = cast_forward(self, forward_dtype)
        return cast_backward(x._redistribute(device_mesh, placements, False), backward_dtype)

    def _redistribute(self, device_mesh, placements, donate: bool) -> "DTensor":
        if checks_enabled() and coord_or_none(self._spec.mesh) is not None:
            placements = self._agreed_target(device_mesh, placements)
        else:
            placements = self._target(device_mesh, placements)
        if not (self.requires_grad and torch.is_grad_enabled()):
            return self if placements == self._spec.placements else _moved(self, placements, donate)
        # recorded even when nothing moves, as PyTorch's: the backward brings a Partial gradient (from
        # to_local(grad_placements=[Partial()]), say) back to this tensor's own layout
        return _Redistribute.apply(self, placements, donate)

    def full_tensor(self, *, grad_placements: Optional[Sequence[Placement]] = None) -> torch.Tensor:
        """The whole tensor on every rank (gathers/reduces as needed; always a new tensor); differentiable.
        ``grad_placements``: the layout the incoming gradient has (as ``to_local``'s)."""
        full = tuple(Replicate() for _ in self._spec.placements)
        if self._spec.placements == full:
            # a snapshot, never an alias of the live local tensor (which an optimizer may update)
            return self.to_local(grad_placements=grad_placements).clone()
        refs = sys.getrefcount(self)  # first, alone: pending call arguments would add references
        donate = donatable(self, refs)
        if checks_enabled() and coord_or_none(self._spec.mesh) is not None:
            self._agreed_target(self._spec.mesh, full)
        gp = None if grad_placements is None else tuple(grad_placements)
        # one autograd Function instead of redistribute's and to_local's (see full.py)
        return full_local(self, full, donate, gp)

    # -- interop with torch.distributed.tensor ----------------------------------------------------
    @staticmethod
    def from_torch(t) -> "DTensor":
        """Convert a ``torch.distributed.tensor.DTensor`` (sharing its local data; differentiable)."""
        from .interop import from_torch

        return from_torch(t)

    def to_torch(self):
        """Convert to a ``torch.distributed.tensor.DTensor`` (sharing the local data; differentiable)."""
        from .interop import to_torch

        return to_torch(self)


_DISPATCHER = OpDispatcher(DTensor)
_FASTPATH = FastPath(_DISPATCHER)
_FAST_PLANS = _FASTPATH.plans  # never replaced (FastPath only adds and evicts)
DTensor.__torch_dispatch__ = classmethod(make_entry(_DISPATCHER))


def fast_path(enabled: bool):
    """Use (default) or bypass the torch-function fast path and the dispatcher's quick map inside a
    ``with`` block, in this thread or task only (see fastpath.py, dispatch.py): bypassed, every call goes
    through the per-op dispatcher's full key and plan.

    >>> x = DTensor.from_local(torch.ones(4, 2), DeviceMesh("cpu", [0]), [Shard(0)])
    >>> with fast_path(False): y = (x * 2).relu()     # counted by propagation_cache()
    """
    return FAST_PATH.set(enabled)


def gather_fallback(enabled: bool = True):
    """Inside a ``with`` block (this thread or task only), run ops that have no sharding rule by gathering
    their inputs to Replicate (slow; warns once per op) instead of raising ``NotImplementedError``.

    >>> x = DTensor.from_local(torch.eye(4), DeviceMesh("cpu", [0]), [Shard(0)])
    >>> with gather_fallback(): q, r = torch.linalg.qr(x)   # x gathered, qr runs replicated on every rank
    """
    return GATHER_FALLBACK.set(enabled)


def propagation_cache():
    """The sharding-propagation cache (``hits``, ``misses``, ``plans``, ``clear()``)."""
    return _DISPATCHER.cache
