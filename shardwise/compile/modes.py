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


def mesh_first(who: str, args: tuple, mesh):
    """Earlier releases took the mesh as the first positional argument (``DataParallel(mesh, ...)``);
    that form still works: returns ``(mesh, remaining positional args)``."""
    from torch.distributed.device_mesh import DeviceMesh

    if args and isinstance(args[0], DeviceMesh):
        if mesh is not None:
            raise TypeError(f"{who}: the mesh was given twice (first positional argument and mesh=); keep mesh=")
        return args[0], args[1:]
    return mesh, args


@dataclass
class Signature:
    """What each flat input/output of a per-rank graph is.

    Entries are ``(kind, fqn, name)``: kinds ``param``, ``buffer``,
    ``opt_state``, ``lr`` (``fqn`` holds the group index), ``input``, ``user``.
    """

    inputs: list[tuple[str, Any, Any]] = field(default_factory=list)
    outputs: list[tuple[str, Any, Any]] = field(default_factory=list)


class ParallelMode(abc.ABC):
    """Base class of compile-mode parallelism strategies.

    ``mesh`` is a ``DeviceMesh`` of ``mesh_ndim`` dims (1 for the built-in modes); left ``None`` it becomes
    all ranks of the default process group (on the group's device) when first used, so a mode can be
    built before ``init_process_group``.
    """

    _mesh: Any = None
    mesh_ndim: int | None = 1  # the mesh dims a mode works on (None: any); both built-in modes are 1-D

    @property
    def mesh(self):
        if self._mesh is None:
            from shardwise._device import default_mesh

            self._mesh = default_mesh(type(self).__name__)
        return self._mesh

    @mesh.setter
    def mesh(self, mesh) -> None:
        if mesh is not None and self.mesh_ndim is not None and getattr(mesh, "ndim", None) != self.mesh_ndim:
            raise ValueError(
                f"{type(self).__name__} needs a {self.mesh_ndim}-D DeviceMesh, got {mesh!r}; leave mesh=None for "
                "all ranks of the default process group, or build one with init_device_mesh(device_type, (world_size,))"
            )
        self._mesh = mesh

    @property
    def world(self) -> int:
        """Number of ranks on the mesh."""
        return self.mesh.size()

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
