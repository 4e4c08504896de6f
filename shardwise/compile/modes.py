"""The ``ParallelMode`` interface: how a traced step becomes a per-rank graph.

A mode owns three decisions: how the user's batch is split across ranks,
how parameters/optimizer state are laid out (``setup``), and which
collectives the per-rank graph contains (``partition``).
``transform_and_compile`` then runs graph passes and returns the callable.

Example::

    class MyMode(ParallelMode):
        def partition(self, joint, state, spec, local_batch, fake_mode): ...
        def transform_and_compile(self, gm): return gm
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

__all__ = ["ParallelMode", "Signature"]


@dataclass
class Signature:
    """What each flat input/output of a per-rank graph is.

    Entries are ``(kind, fqn, name)``: kinds ``param``, ``buffer``,
    ``opt_state``, ``lr`` (``fqn`` holds the group index), ``input``, ``user``.
    """

    inputs: list[tuple[str, Any, Any]] = field(default_factory=list)
    outputs: list[tuple[str, Any, Any]] = field(default_factory=list)


class ParallelMode(abc.ABC):
    """Base class of compile-mode parallelism strategies."""

    mesh: Any

    @abc.abstractmethod
    def setup(self, model: torch.nn.Module, optimizer: Any, spec: Any) -> Any:
        """Lay out parameters/state (returns a :class:`~.state.TrainState`)."""

    @abc.abstractmethod
    def local_batch(self, batch: tuple) -> tuple:
        """This rank's part of the (global) batch; validates it identically on all ranks."""

    def trace_batch(self, batch: tuple, local: tuple) -> tuple:
        """The batch whose shapes the joint graph is traced with (default: this rank's part)."""
        return local

    @abc.abstractmethod
    def partition(
        self, joint, state, spec, local_batch: tuple, fake_mode
    ) -> tuple[torch.fx.GraphModule, Signature]:
        """Turn the traced joint graph into this rank's graph with collectives."""

    @abc.abstractmethod
    def transform_and_compile(
        self, gm: torch.fx.GraphModule, gm_transformation: Callable | None = None
    ) -> Callable:
        """Run graph passes, then compile (``gm_transformation`` may replace the last step)."""
