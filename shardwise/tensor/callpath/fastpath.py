"""A coarse fast path above the dispatcher, for calls that need no autograd recording.

At the ``__torch_function__`` level a call like ``torch.add(a, b)`` is keyed on (function, input specs,
other arguments). The first time, it runs through the normal aten dispatch while the dispatcher
records what it did; if that was exactly one aten op whose plan needs no redistribution and no local
rewrites, the call is remembered as "run the same function on the local tensors, wrap with this
spec". Later calls skip the dispatcher's Python re-entry and the per-op plan lookup altogether.
Calls that need autograd (grad mode on and an input requires grad) go to the dispatcher, where plans
that run the op on the local tensors as they are hit a cheaper "quick" key (dispatch.py): autograd's
own backward node is recorded as for any tensor, so gradients are the full path's.
``make_entry`` builds ``DTensor.__torch_dispatch__``, which runs such quick-map hits inline.
``fast_path(False)`` (``FAST_PATH``, a per-context switch) sends every call down the full path.
"""

from __future__ import annotations

import threading

import torch

from ..dispatch import _FAST_PATH_ON, FAST_PATH, OpDispatcher
from .plan_cache import has_tensor, seq_key
from .wrapping import NEW, wrap, wrap_fresh

_SCALARS = (int, float, bool)
_SLOW = (None, "slow")  # this key never qualifies: go straight to the full path


class FastPath:
    def __init__(self, dispatcher, max_size: int = 8192):
        self.dispatcher = dispatcher
        self.plans: dict = {}
        self.max_size = max_size
        self.scalar_types_only: dict = {}  # func -> bool, learnt from its aten op's rule
        self._lock = threading.Lock()

    def __call__(self, func, args, kwargs):
        cls = self.dispatcher.cls
        # everything below reads tensor attributes, which would re-enter __torch_function__
        with torch._C.DisableTorchFunctionSubclass():
            if not FAST_PATH.get():
                return func(*args, **kwargs) if kwargs else func(*args)
            if not kwargs and len(args) == 2:
                # binary ops on two DTensors: the hottest shape, kept free of generic walks
                a, b = args
                if type(a) is cls and type(b) is cls:
                    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
                        return func(a, b)
                    plan = self.plans.get((func, a._spec, b._spec))
                    if plan is not None and plan is not _SLOW and plan[1] == "wrap":
                        return wrap_fresh(cls, func(a._local_tensor, b._local_tensor), plan[0])
            if torch.is_grad_enabled() and _any_requires_grad(args):
                return func(*args, **kwargs) if kwargs else func(*args)
            key, local_args = self._key(func, args, kwargs, cls)
            if key is not None:
                plan = self.plans.get(key)
                if plan is None:
                    return self._learn(key, func, args, kwargs)
                if plan is not _SLOW:
                    spec, mode = plan
                    out = func(*local_args, **kwargs) if kwargs else func(*local_args)
                    if mode == "wrap":
                        return wrap_fresh(cls, out, spec)
                    if mode == "self":
                        return args[0]
                    if mode == "seq":
                        return [wrap_fresh(cls, o, s) for o, s in zip(out, spec)]
                    return out
            return func(*args, **kwargs) if kwargs else func(*args)

    def _key(self, func, args, kwargs, cls):
        insensitive = self.scalar_types_only.get(func, False)
        key = [func]
        local_args = list(args)
        for i, a in enumerate(args):
            if isinstance(a, cls):
                key.append(a._spec)
                local_args[i] = a._local_tensor
            elif isinstance(a, torch.Tensor):
                if a.ndim:
                    return None, None  # let the full path raise its error
                key.append((a.dtype,))
            elif type(a) is list or type(a) is tuple:
                if has_tensor(a):
                    if any(isinstance(x, torch.Tensor) and not isinstance(x, cls) for x in a):
                        return None, None  # plain tensors in a list: the full path decides
                    part, local_args[i] = seq_key(a, cls)
                    key.append(part)
                else:
                    key.append(tuple(a))
            elif insensitive and type(a) in _SCALARS:
                key.append(type(a))
            else:
                key.append(a)
        if kwargs:
            for k, v in kwargs.items():
                if isinstance(v, torch.Tensor):
                    return None, None
                key.append(k)
                key.append(type(v) if insensitive and type(v) in _SCALARS else v)
        key = tuple(key)
        try:
            hash(key)  # e.g. slices (indexing) are unhashable before Python 3.12: take the full path
        except TypeError:
            return None, None
        return key, local_args

    def _learn(self, key, func, args, kwargs):
        disp = self.dispatcher
        recorded = []
        token = disp.recording.set(recorded)
        try:
            out = func(*args, **kwargs) if kwargs else func(*args)
        finally:
            disp.recording.reset(token)
        plan = _SLOW
        if len(recorded) == 1:
            op, entry, oplan = recorded[0]
            self.scalar_types_only.setdefault(func, bool(entry and entry.scalar_insensitive))
            # a gathered fallback must go back to the dispatcher, which refuses it once the fallback is off
            simple = not oplan.redist and oplan.local is None and not oplan.gathers
            kind = oplan.out_kind
            # views are left to the dispatcher so autograd's view tracking (version counters) holds
            is_view = kind != "inplace" and any(r.alias_info is not None for r in op._schema.returns)
            simple = simple and not is_view
            if simple and kind == "tensor" and isinstance(out, disp.cls) and out._spec is oplan.out_specs[0]:
                plan = (oplan.out_specs[0], "wrap")
            elif simple and kind == "inplace" and out is args[0]:
                plan = (None, "self")
            elif simple and kind == "raw" and out is None:  # in-place foreach ops
                plan = (None, "none")
            elif simple and kind == "seq" and type(out) is list and all(s is not None for s in oplan.out_specs):
                plan = (tuple(oplan.out_specs), "seq")
        try:
            hashable_key = self._key(func, args, kwargs, disp.cls)[0] or key
        except TypeError:
            return out
        with self._lock:  # two threads evicting at once would pop one key twice
            if len(self.plans) >= self.max_size:
                self.plans.pop(next(iter(self.plans)))
            self.plans[hashable_key] = plan
        return out


def _any_requires_grad(args) -> bool:
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.requires_grad:
                return True
        elif type(a) is list or type(a) is tuple:
            for x in a:
                if isinstance(x, torch.Tensor) and x.requires_grad:
                    return True
    return False


def make_entry(dispatcher: OpDispatcher):
    """``__torch_dispatch__`` for ``dispatcher.cls``. Every op autograd records comes here; a call on one
    or two DTensors (and a scalar: ``threshold_backward``, relu's backward) whose plan is in the quick map
    runs inline (a frame less than the dispatcher's own quick lookup), everything else goes to
    ``dispatcher``."""
    cache, quick, cls = dispatcher.cache, dispatcher.cache.quick, dispatcher.cls

    def __torch_dispatch__(_cls, func, types, args=(), kwargs=None):
        n = len(args)
        if not kwargs and 0 < n <= 3 and dispatcher.recording.get() is None and _FAST_PATH_ON():
            a = args[0]
            if type(a) is cls:
                b = c = None
                if n == 1:
                    hit = quick.get((func, a._spec))
                else:
                    b = args[1]
                    if n == 3:  # (DTensor, DTensor, scalar), e.g. threshold_backward: quick_key's key
                        c, t = args[2], type(args[2])
                        if type(b) is cls and t in _SCALARS:
                            hit, b = quick.get((func, a._spec, b._spec, t, c)), b._local_tensor
                        else:
                            hit = None
                    elif type(b) is cls:
                        hit, b = quick.get((func, a._spec, b._spec)), b._local_tensor
                    elif type(b) is list and b and type(b[0]) is int:  # dims or sizes: quick_key's key
                        hit = quick.get((func, a._spec, tuple(b)))
                    else:
                        hit = None
                if hit is not None:
                    cache.hits += 1
                    spec, inplace, raw, fresh = hit
                    out = raw(a._local_tensor) if n == 1 else raw(a._local_tensor, b) if n == 2 else \
                        raw(a._local_tensor, b, c)
                    if inplace:
                        return a
                    if fresh and NEW is not None and not out.requires_grad:  # wrapping.wrap_fresh, inlined
                        return NEW(cls, out, spec, False)
                    return wrap(cls, out, spec)
        return dispatcher(func, args, kwargs)

    return __torch_dispatch__
