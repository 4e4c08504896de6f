"""What a sharding rule sees: the op, its arguments with tensors replaced by metadata, and outputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

from ..placements import Placement

__all__ = ["TensorArg", "OpSchema", "Strategy", "LocalPlan"]


@dataclass(frozen=True)
class TensorArg:
    """A tensor argument as rules see it. ``placements`` is None for a plain (non-distributed)
    tensor, which the dispatcher only admits as an implicitly replicated 0-d scalar."""

    index: int
    shape: torch.Size
    dtype: torch.dtype
    placements: Optional[tuple[Placement, ...]]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_dtensor(self) -> bool:
        return self.placements is not None


@dataclass
class OpSchema:
    """An op call as seen by a rule: ``args``/``kwargs`` hold ``TensorArg`` where tensors were (lists of
    tensors become lists of ``TensorArg``); ``tensor_args`` lists them in flattening order;
    ``outputs`` holds meta tensors with the global output shapes (``None`` for non-tensors)."""

    op: Any
    args: tuple
    kwargs: dict
    tensor_args: list[TensorArg]
    outputs: list[Optional[torch.Tensor]]
    mesh_shape: tuple[int, ...] = ()

    def arg(self, i: int, name: str | None = None, default=None):
        if i < len(self.args):
            return self.args[i]
        if name is not None and name in self.kwargs:
            return self.kwargs[name]
        return default

    @property
    def num_outputs(self) -> int:
        return len(self.outputs)


@dataclass(frozen=True)
class Strategy:
    """One way to run an op on ONE mesh dimension: required input placements (one per tensor arg,
    ``None`` = no requirement) and the resulting output placements (one per output, ``None`` for
    non-tensor outputs)."""

    outputs: tuple
    inputs: tuple

    def __str__(self) -> str:
        fmt = lambda ps: ", ".join("-" if p is None else str(p) for p in ps)  # noqa: E731
        return f"({fmt(self.inputs)}) -> ({fmt(self.outputs)})"


@dataclass
class LocalPlan:
    """How to run the local op once inputs are laid out: argument substitutions computed at plan time
    (e.g. a view's local sizes) and an optional custom kernel ``kernel(op, args, kwargs)``."""

    arg_subs: dict = field(default_factory=dict)
    kwarg_subs: dict = field(default_factory=dict)
    kernel: Optional[Callable] = None


def strategies_str(strategies: Sequence[Strategy]) -> str:
    return "; ".join(str(s) for s in strategies)
