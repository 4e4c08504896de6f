"""Samples recorded from torch's OpInfo database (``op_db``, the inputs PyTorch's own tests use): each
OpInfo's first sample inputs run on plain tensors under a dispatch mode that keeps the aten calls they
make, so an aten op nobody wrote a builder for (a linalg factorization, a pooling backward) gets real
arguments. Slow (imports op_db and runs every OpInfo): the samples of ``base.py``'s builders come first,
and the validator's quick test checks a subset of these."""

from __future__ import annotations

import functools
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from .base import Sample

__all__ = ["recorded_samples"]

_PER_OP = 2


def _clone(x):
    return x.detach().clone() if isinstance(x, torch.Tensor) else x


def _usable(args, kwargs) -> bool:
    leaves = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
    return bool(leaves) and all(t.layout == torch.strided and t.device.type == "cpu" and not t.is_conj()
                                and not t.is_neg() for t in leaves)


class _Recorder(TorchDispatchMode):
    def __init__(self, store: dict, wanted):
        super().__init__()
        self.store, self.wanted = store, wanted

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        calls = self.store.setdefault(func, []) if func in self.wanted else None
        if calls is not None and len(calls) < _PER_OP and _usable(args, kwargs):
            calls.append((tree_map(_clone, args), tree_map(_clone, kwargs)))
        return func(*args, **kwargs)


def _forward_backward(info, s) -> None:
    out = info.op(s.input, *s.args, **s.kwargs)
    outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor) and o.requires_grad
            and o.dtype.is_floating_point]
    if outs:
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])


@functools.lru_cache(maxsize=4)
def _record(wanted: frozenset) -> dict:
    from torch.testing._internal.common_methods_invocations import op_db

    store: dict = {}
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        for info in op_db:
            if torch.float32 not in info.supported_dtypes("cpu"):
                continue
            try:
                grad = info.supports_autograd
                for k, s in enumerate(info.sample_inputs("cpu", torch.float32, requires_grad=grad)):
                    if k >= _PER_OP:
                        break
                    with _Recorder(store, wanted):  # the backward's aten calls too
                        _forward_backward(info, s)
            except Exception:  # noqa: BLE001  an OpInfo whose samples need what is missing here
                continue
    return store


def recorded_samples(ops) -> dict:
    """{op: [Sample]} for the ``ops`` some OpInfo's samples call (ops no OpInfo reaches are absent)."""
    store = _record(frozenset(ops))
    out = {}
    for op in ops:
        calls = store.get(op)
        if calls:
            out[op] = [Sample(tuple(a), dict(kw)) for a, kw in calls]
    return out
