"""A clean process exit after ``destroy_process_group``, without a workaround in the user's script.

Why processes aborted at exit ("terminate called without an active exception", SIGABRT): a process
group's destructor joins its gloo worker threads, but ``destroy_process_group`` only drops the
registry's references. Three kinds of reference kept destroyed groups alive until interpreter
finalization:

* ``torch.distributed.nn.functional``'s ``group=group.WORLD`` defaults, evaluated when that module is
  first imported. Functional collectives import it lazily (through ``torch._dynamo``) on their first
  call, i.e. after ``init_process_group``, so the defaults hold the default group itself.
* every live ``DeviceMesh`` keeps its groups in ``_pg_registry``, and shardwise's sharding-propagation
  and fast-path caches keep every mesh they have seen (through the specs in their keys) for the
  life of the process; so do the user's own module-level meshes and DTensors.
* reference cycles (autograd graphs, modules with hooks) that hold tensors or meshes.

The group then died during finalization, when its destructor joined a gloo thread that was still
releasing a finished collective's work; dropping that work's tensors needs the GIL, which a thread
cannot take once the interpreter is finalizing, and it is killed inside a C++ destructor.

:func:`release_destroyed_groups` runs at exit (registered when shardwise is imported; atexit runs
before finalization): if the default group was destroyed, it drops those references to dead groups
and collects cycles, so the groups' destructors join their threads while the interpreter is whole.
It changes nothing while a process group exists.

Example::

    dist.init_process_group("gloo")
    ...                                 # shardwise DTensors, collectives, backward
    dist.destroy_process_group()        # at exit, the dead group is released before finalization
"""
from __future__ import annotations

import atexit
import gc
import sys
import types

__all__ = ["release_destroyed_groups"]


def release_destroyed_groups() -> int:
    """Drop references to destroyed process groups (see the module docstring); returns how many.

    Only acts when torch.distributed was used and no default group exists now (after
    ``destroy_process_group()`` every group is destroyed, so each one still referenced is dead).
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or dist.is_initialized():
        return 0
    from torch.distributed import ProcessGroup

    dropped = _clear_function_defaults(ProcessGroup)
    dropped += _clear_mesh_registries()
    gc.collect()  # cycles that hold groups, meshes or tensors of finished collectives
    return dropped


def _clear_function_defaults(group_type) -> int:
    """``def f(..., group=group.WORLD)`` in ``torch.distributed.*``: the captured group becomes ``None``,
    which those functions read as "the default group" (the documented meaning of ``group=None``)."""
    # type(), not isinstance(): isinstance reads attributes of the object (ProcessGroup's metaclass
    # probes it), and deprecated module attributes such as torch.distributed.reduce_op warn when read
    dead = lambda v: issubclass(type(v), group_type)  # noqa: E731
    dropped = 0
    for name, module in list(sys.modules.items()):
        if not name.startswith("torch.distributed") or module is None:
            continue
        for fn in _functions_of(module):
            if fn.__defaults__ and any(dead(d) for d in fn.__defaults__):
                dropped += sum(dead(d) for d in fn.__defaults__)
                fn.__defaults__ = tuple(None if dead(d) else d for d in fn.__defaults__)
            kw = fn.__kwdefaults__
            if kw and any(dead(v) for v in kw.values()):
                dropped += sum(dead(v) for v in kw.values())
                fn.__kwdefaults__ = {k: None if dead(v) else v for k, v in kw.items()}
    return dropped


def _functions_of(module):
    """Functions defined in ``module``, and the methods of its classes."""
    for obj in list(vars(module).values()):
        kind = type(obj)
        if kind is types.FunctionType and obj.__module__ == module.__name__:
            yield obj
        elif issubclass(kind, type) and obj.__module__ == module.__name__:
            for attr in list(vars(obj).values()):
                if type(attr) in (staticmethod, classmethod):
                    attr = attr.__func__
                if type(attr) is types.FunctionType:
                    yield attr


def _clear_mesh_registries() -> int:
    """A ``DeviceMesh`` holds its groups in ``_pg_registry`` (torch uses it only while compiling); after
    ``destroy_process_group`` they are dead, and a mesh alive in a cache or a user's global must not
    carry them into finalization."""
    mesh_module = sys.modules.get("torch.distributed.device_mesh")
    mesh_type = getattr(mesh_module, "DeviceMesh", None)
    if mesh_type is None:
        return 0
    dropped = 0
    for obj in gc.get_objects():
        registry = getattr(obj, "_pg_registry", None) if issubclass(type(obj), mesh_type) else None
        if isinstance(registry, dict) and registry:
            dropped += len(registry)
            registry.clear()
    return dropped


atexit.register(release_destroyed_groups)
