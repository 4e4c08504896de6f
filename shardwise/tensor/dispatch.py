"""How an aten op on DTensors runs: key -> cached OpPlan -> redistribute inputs -> local op -> wrap.

The cache key (``plan_cache.py``) is built from small hashable values only: the op, each DTensor's
spec, each plain tensor's shape/dtype, and the non-tensor arguments (for pointwise/foreach ops only
their types, so changing scalars such as learning rates reuse one plan). A hit costs one dict lookup
plus the local op. The cache is bounded (oldest entries evicted first).

Ops without a sharding rule raise, unless ``gather_fallback()`` (``GATHER_FALLBACK``, a per-context
switch) is on: their inputs are then gathered to Replicate. Such a plan is cached like any other, so a
cache hit re-checks the switch: a plan made inside a ``with gather_fallback():`` block is refused outside.
"""

from __future__ import annotations

import contextvars
import warnings
from typing import Optional

import torch
from torch.utils._python_dispatch import return_and_correct_aliasing

from ._switch import Switch
from .placements import Replicate
from .callpath.plan_cache import PropagationCache, has_tensor, quick_key, seq_key
from .callpath.wrapping import wrap, wrap_fresh
from .propagation.propagator import Decision, choose_layout, op_mutates_first_arg
from .propagation.outputs import meta_outputs, outside_kernel
from .propagation.registry import RuleEntry, is_out_variant, lookup_rule
from .propagation.schema import LocalPlan, OpSchema, TensorArg
from .redistribute import execute_plan, plan_redistribute
from .spec import DTensorSpec, normalize_placements

__all__ = ["OpDispatcher", "GATHER_FALLBACK", "IMPLICIT_REPLICATION", "FAST_PATH"]

_SCALARS = (int, float, bool, complex)
GATHER_FALLBACK = Switch("gather_fallback", False)
# plain tensors of any shape mixed with DTensors count as Replicate (experimental.implicit_replication)
IMPLICIT_REPLICATION = Switch("implicit_replication", False)
# off: every call takes the full key and plan path (the torch-function fast path and the quick map)
FAST_PATH = Switch("fast_path", True)
_FAST_PATH_ON = FAST_PATH.get


class OpPlan:
    """Everything needed to run one keyed op call on this rank."""

    __slots__ = ("redist", "out_specs", "out_kind", "local", "decision", "gathers", "guard")

    def __init__(self, redist, out_specs, out_kind, local: Optional[LocalPlan], decision, gathers: bool = False,
                 implicit: bool = False):
        self.redist = redist  # list of (arg index, sub index or -1, steps, src spec)
        self.out_specs = out_specs
        self.out_kind = out_kind  # "tensor" | "seq" | "inplace" | "raw"
        self.local = local
        self.decision = decision
        self.gathers = gathers  # made by the gather fallback (the op has no rule)
        # implicit: a plain non-scalar tensor was taken as Replicate (only inside implicit_replication)
        self.guard = _guard(gathers, implicit)


class OpDispatcher:
    """Runs aten ops whose arguments include instances of ``cls`` (the DTensor class)."""

    def __init__(self, cls):
        self.cls = cls
        self.cache = PropagationCache()
        self._warned: set = set()
        # set by the fast path to learn what one call did: per thread/task, or a thread learning a call
        # would also record the ops another thread runs meanwhile (threaded ranks share this dispatcher)
        self.recording = contextvars.ContextVar("shardwise.dispatch_recording", default=None)

    # -- hot path -------------------------------------------------------------------------------
    def __call__(self, op, args, kwargs):
        cls = self.cls
        # Under autograd every op comes here (the torch-function fast path cannot record a backward):
        # plans that just run the op on the local tensors are found by a cheaper key first.
        qkey = quick_key(op, args, cls) if not kwargs and self.recording.get() is None and _FAST_PATH_ON() else None
        if qkey is not None:
            hit = self.cache.quick.get(qkey)
            if hit is not None:
                self.cache.hits += 1
                spec, inplace, raw, fresh = hit
                a = args[0]
                if len(args) == 1:
                    out = raw(a._local_tensor)
                else:
                    out = raw(*[x._local_tensor if type(x) is cls else x for x in args])
                if inplace:
                    return a
                return wrap_fresh(cls, out, spec) if fresh else wrap(cls, out, spec)
        entry = lookup_rule(op)
        insensitive = entry is not None and entry.scalar_insensitive
        key = [op]
        local_args = list(args)
        for i, a in enumerate(args):
            if isinstance(a, cls):
                key.append(a._spec)
                local_args[i] = a._local_tensor
            elif isinstance(a, torch.Tensor):
                key.append((a.shape, a.dtype))
            elif type(a) is list or type(a) is tuple:
                if has_tensor(a):
                    part, local_args[i] = seq_key(a, cls)
                    key.append(part)
                elif insensitive and a and type(a[0]) in _SCALARS:
                    key.append(type(a[0]))
                else:
                    key.append(tuple(a))
            elif insensitive and type(a) in _SCALARS:
                key.append(type(a))
            else:
                key.append(a)
        if kwargs:
            for k, v in kwargs.items():
                key.append(k)
                key.append(type(v) if insensitive and type(v) in _SCALARS else (tuple(v) if type(v) is list else v))
        key = tuple(key)
        plan = self.cache.plans.get(key)
        if plan is None:
            self.cache.misses += 1
            plan = self._plan(op, args, kwargs or {}, entry)
            self.cache.put(key, plan)
        else:
            self.cache.hits += 1
            if plan.guard is not None:  # the plan was made under a switch: refuse it outside the block
                plan.guard(op, args, cls)
        recording = self.recording.get()
        if recording is not None:
            recording.append((op, entry, plan))
        elif qkey is not None:
            self.cache.put_quick(qkey, plan)
        return self._run(plan, op, args, local_args, kwargs or {})

    def _run(self, plan: OpPlan, op, args, local_args, kwargs):
        for i, j, steps, spec, coord in plan.redist:
            if j < 0:
                local_args[i] = execute_plan(local_args[i], steps, spec.mesh, spec.shape, spec.placements, coord,
                                             stride=spec.stride)
            else:
                local_args[i][j] = execute_plan(local_args[i][j], steps, spec.mesh, spec.shape, spec.placements,
                                                coord, stride=spec.stride)
        local = plan.local
        call_kwargs = kwargs
        if kwargs and any(type(v) is self.cls for v in kwargs.values()):
            # a tensor keyword (linalg_pinv's rtol) is never redistributed (its rule keeps it as it is):
            # the local op gets its piece; an out= DTensor is still returned as given
            call_kwargs = {k: v._local_tensor if type(v) is self.cls else v for k, v in kwargs.items()}
        if local is not None:
            for i, v in local.arg_subs.items():
                local_args[i] = v
            if local.kwarg_subs:
                call_kwargs = {**call_kwargs, **local.kwarg_subs}
            out = local.kernel(op, local_args, call_kwargs) if local.kernel else op(*local_args, **call_kwargs)
        else:
            out = op(*local_args, **call_kwargs)
        kind = plan.out_kind
        cls = self.cls
        if kind == "tensor":
            return cls._wrap(out, plan.out_specs[0])
        if kind == "inplace":
            a = args[0]
            spec = plan.out_specs[0]
            if spec is not None and a._spec != spec:
                # squeeze_/t_/transpose_ change the shape; under the gather fallback the argument was
                # replicated first and the result is that replicated value: the DTensor takes it
                a._local_tensor, a._spec = out, spec
                if torch.Tag.inplace_view in op.tags:
                    return return_and_correct_aliasing(op, args, kwargs, a)
            return a
        if kind == "out":  # an out= variant returns the DTensor it wrote into
            return kwargs["out"]
        if kind == "seq":
            if out is None:
                return None
            wrapped = [o if s is None else cls._wrap(o, s) for o, s in zip(out, plan.out_specs)]
            return tuple(wrapped) if isinstance(out, tuple) else wrapped
        return out

    # -- cache miss: build a plan ---------------------------------------------------------------
    def _plan(self, op, args, kwargs, entry) -> OpPlan:
        schema, mesh = self._schema(op, args, kwargs)
        inplace = op_mutates_first_arg(op)
        gathers = entry is None
        if gathers:
            entry = self._fallback_entry(op, schema, mesh, args)
        decision = choose_layout(schema, entry, tuple(mesh.shape), inplace)
        coord = mesh.get_coordinate()
        outside = coord is None  # a rank outside the mesh moves nothing (PyTorch's rule); see _outside_kernel
        coord = None if outside else tuple(coord)
        redist = []
        for ta, req in zip(schema.tensor_args, decision.inputs):
            if req is None or outside:
                continue
            steps = plan_redistribute(ta.placements, req, tuple(mesh.shape), len(ta.shape))
            if steps:
                i, j = self._path(args, ta.index)
                spec = (args[i] if j < 0 else args[i][j])._spec
                redist.append((i, j, steps, spec, coord))
        out_specs = []
        for meta, pl in zip(schema.outputs, decision.outputs):
            if meta is None or pl is None:
                out_specs.append(None)
            else:
                pl = normalize_placements(pl, mesh.ndim, meta.ndim)
                out_specs.append(DTensorSpec(mesh, pl, meta.shape, meta.stride(), meta.dtype))
        if outside:
            local = LocalPlan(kernel=outside_kernel(out_specs, torch.device(mesh.device_type)))
        else:
            local = entry.local(schema, decision, out_specs, mesh, coord) if entry.local else None
        implicit = any(ta.placements is None and _numel(ta.shape) > 1 for ta in schema.tensor_args)
        return OpPlan(redist, out_specs, self._out_kind(op, schema, inplace), local, decision, gathers, implicit)

    def _out_kind(self, op, schema: OpSchema, inplace: bool) -> str:
        if inplace and schema.outputs and schema.outputs[0] is not None and len(op._schema.returns) == 1:
            return "inplace"
        rets = op._schema.returns
        if len(rets) == 1 and "out" in schema.kwargs and is_out_variant(op):
            return "out"
        if len(rets) == 1 and str(rets[0].type) == "Tensor":
            return "tensor"
        if not rets or not any("Tensor" in str(r.type) for r in rets):
            return "raw"
        return "seq"

    def _schema(self, op, args, kwargs):
        cls = self.cls
        tensor_args: list[TensorArg] = []
        meshes = []

        def conv(x):
            if isinstance(x, cls):
                ta = TensorArg(len(tensor_args), x._spec.shape, x._spec.dtype, x._spec.placements)
                meshes.append(x._spec.mesh)
            else:
                ta = TensorArg(len(tensor_args), x.shape, x.dtype, None)
            tensor_args.append(ta)
            return ta

        sargs = tuple(
            conv(a) if isinstance(a, torch.Tensor)
            else [conv(x) if isinstance(x, torch.Tensor) else x for x in a] if isinstance(a, (list, tuple)) else a
            for a in args
        )
        skw = {k: conv(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        mesh = meshes[0]
        for m in meshes[1:]:
            if m is not mesh and m != mesh:
                raise ValueError(
                    f"{op}: DTensors on different meshes ({mesh} and {m}) in one op; redistribute them onto "
                    "one DeviceMesh first"
                )
        for ta in tensor_args:
            if ta.placements is None and _numel(ta.shape) > 1 and not IMPLICIT_REPLICATION.get():
                raise _mixed_error(op, ta.shape)
        outputs = meta_outputs(op, args, kwargs, cls)
        return OpSchema(op, sargs, skw, tensor_args, outputs, tuple(mesh.shape)), mesh

    def _fallback_entry(self, op, schema: OpSchema, mesh, args) -> RuleEntry:
        if not GATHER_FALLBACK.get():
            raise _no_rule_error(op, args, self.cls)
        if op not in self._warned:
            self._warned.add(op)
            warnings.warn(f"{op}: no sharding strategy; gathering its inputs to Replicate (slow)", stacklevel=5)
        full = tuple(Replicate() for _ in mesh.shape)
        decision = Decision(
            [None if ta.placements is None or ta.placements == full else full for ta in schema.tensor_args],
            [None if o is None else full for o in schema.outputs],
        )
        return RuleEntry(lambda s, m: decision, whole_mesh=True)

    @staticmethod
    def _path(args, index: int) -> tuple[int, int]:
        """(arg index, sub index or -1) of the ``index``-th tensor leaf (same order as _schema)."""
        n = 0
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                if n == index:
                    return i, -1
                n += 1
            elif isinstance(a, (list, tuple)):
                for j, x in enumerate(a):
                    if isinstance(x, torch.Tensor):
                        if n == index:
                            return i, j
                        n += 1
        raise AssertionError(f"tensor leaf {index} not found (tensor kwargs are not redistributed)")


def _numel(shape) -> int:
    # a plain one-element tensor counts as a replicated scalar (as 0-d ones, and as PyTorch's DTensor):
    # composite ops make such tensors internally (torch.tensor([x]))
    n = 1
    for s in shape:
        n *= s
    return n


def _mixed_error(op, shape) -> ValueError:
    # ValueError, not TypeError: Tensor operators turn TypeErrors into NotImplemented and the message
    # would be lost
    return ValueError(
        f"{op}: a plain torch.Tensor of shape {tuple(shape)} is mixed with DTensors; only tensors of one "
        "element are implicitly replicated. Wrap it with distribute_tensor(t, mesh, [Replicate()]) or "
        "DTensor.from_local(t, mesh, placements), or run the op inside "
        "`with shardwise.tensor.experimental.implicit_replication():`"
    )


def _guard(gathers: bool, implicit: bool):
    """What a cache hit re-checks: the switches the plan was made under (None: nothing)."""
    if not (gathers or implicit):
        return None

    def guard(op, args, cls):
        if gathers and not GATHER_FALLBACK.get():
            raise _no_rule_error(op, args, cls)
        if implicit and not IMPLICIT_REPLICATION.get():
            flat = [x for a in args for x in (a if type(a) in (list, tuple) else (a,))]
            raise _mixed_error(op, next(x.shape for x in flat if isinstance(x, torch.Tensor)
                                        and not isinstance(x, cls) and x.numel() > 1))

    return guard


def _no_rule_error(op, args, cls) -> NotImplementedError:
    tensors = [x for a in args for x in (a if type(a) in (list, tuple) else (a,)) if isinstance(x, torch.Tensor)]
    placements = {i: [str(p) for p in t._spec.placements] for i, t in enumerate(tensors) if isinstance(t, cls)}
    return NotImplementedError(
        f"{op}: no sharding strategy is registered (input placements {placements}); redistribute the inputs to "
        "Replicate() and call it on .to_local(), or run it inside `with shardwise.tensor.gather_fallback():` "
        "(gathers its inputs to Replicate)"
    )
