"""TorchRec's awaitables (``torchrec.distributed.types``): a value that ``wait()`` produces.

``Awaitable.wait()`` runs ``_wait_impl()`` and then the ``callbacks`` in order. ``LazyAwaitable``
also waits by itself, once, when its value is needed: passed to a torch function, an attribute read
or an arithmetic operator. The sharded collections' staged methods
(:mod:`~shardwise.embedding.torchrec_api.sharded_api`) return these.

Example (the introduction tutorial's):
    >>> class Ones(LazyAwaitable):
    ...     def __init__(self, size):
    ...         super().__init__()
    ...         self._size = size
    ...     def _wait_impl(self):
    ...         return torch.ones(self._size)
    >>> Ones([3, 2]).wait().shape
    torch.Size([3, 2])
    >>> (torch.add(Ones([2]), 1) + Ones([2])).tolist()     # waited where the value is needed
    [3.0, 3.0]
"""

from __future__ import annotations

import abc
import operator
from typing import Any, Callable, Generic, TypeVar

import torch
from torch.utils._pytree import tree_map

__all__ = ["Awaitable", "NoWait", "LazyAwaitable", "LazyNoWait"]

W = TypeVar("W")


class Awaitable(abc.ABC, Generic[W]):
    """A value computed by ``wait()``: ``_wait_impl()``, then each of ``callbacks`` applied in turn."""

    def __init__(self) -> None:
        self._callbacks: list[Callable[[Any], Any]] = []

    @abc.abstractmethod
    def _wait_impl(self) -> W:
        ...

    def wait(self) -> W:
        result = self._wait_impl()
        for callback in self._callbacks:
            result = callback(result)
        return result

    @property
    def callbacks(self) -> list:
        return self._callbacks


class NoWait(Awaitable[W]):
    """An awaitable of a value that is already there."""

    def __init__(self, obj: W) -> None:
        super().__init__()
        self._obj = obj

    def _wait_impl(self) -> W:
        return self._obj


def _waited(obj: Any) -> Any:
    if isinstance(obj, LazyAwaitable):
        if obj._result is None:   # once: the value is kept (as TorchRec's)
            obj._result = obj.wait()
        return obj._result
    return obj


class LazyAwaitable(Awaitable[W]):
    """An awaitable that waits by itself where its value is used: as an argument of a torch function,
    through an attribute or with an operator; ``wait()`` still works."""

    def __init__(self) -> None:
        super().__init__()
        self._result = None

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return func(*tree_map(_waited, tuple(args)), **tree_map(_waited, dict(kwargs or {})))

    def __getattr__(self, name: str):
        # only for names the awaitable itself lacks: those of the value
        if name == "_result":
            raise RuntimeError(f"{type(self).__name__} was not initialised: call super().__init__() in its __init__")
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return getattr(_waited(self), name)


class LazyNoWait(LazyAwaitable[W]):
    """A lazy awaitable of a value that is already there."""

    def __init__(self, obj: W) -> None:
        super().__init__()
        self._obj = obj

    def _wait_impl(self) -> W:
        return self._obj


def _binary(op):
    def method(self, other):
        return op(_waited(self), _waited(other))
    return method


def _reflected(op):
    def method(self, other):
        return op(_waited(other), _waited(self))
    return method


def _unary(op):
    def method(self):
        return op(_waited(self))
    return method


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor",
              "lshift", "rshift", "eq", "ne", "lt", "le", "gt", "ge", "getitem"):
    _op = getattr(operator, _name if _name not in ("and", "or") else _name + "_")
    setattr(LazyAwaitable, f"__{_name}__", _binary(_op))
    if _name not in ("eq", "ne", "lt", "le", "gt", "ge", "getitem"):
        setattr(LazyAwaitable, f"__r{_name}__", _reflected(_op))
for _name in ("neg", "pos", "abs", "invert"):
    setattr(LazyAwaitable, f"__{_name}__", _unary(getattr(operator, _name)))
LazyAwaitable.__hash__ = object.__hash__   # defining __eq__ would otherwise make it unhashable
del _name, _op
