"""``shardwise.compile.compile``: trace a whole train step once, then replay it per rank.

Example::

    @compile(parallel_mode=DataParallel("replicate"))
    def step(model, optimizer, x, y):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    for x, y in loader:                      # this rank's batch
        loss = step(model, optimizer, x, y)  # traced on the first call, replayed after
"""
from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode

from .modes import ParallelMode, Signature
from .optim import optim_spec
from .tracing import JointGraph, trace_joint

__all__ = ["compile", "CompiledStep"]


def compile(parallel_mode: ParallelMode, gm_transformation: Callable | None = None) -> Callable:
    """Decorator for ``step(model, optimizer, *batch)``; see the module docstring.

    A new trace happens when batch shapes/dtypes, non-tensor batch values,
    optimizer hyper-parameters (other than ``lr``) or the presence of lazily
    created optimizer state change.  ``lr`` is read from
    ``optimizer.param_groups`` on every call, so schedulers just work.
    ``gm_transformation(gm) -> callable`` may compile the final graph further.
    """
    if not isinstance(parallel_mode, ParallelMode):
        raise TypeError(
            f"parallel_mode must be a shardwise.compile.ParallelMode (e.g. DataParallel('replicate')), "
            f"got {type(parallel_mode).__name__}"
        )
    if gm_transformation is not None and not callable(gm_transformation):
        raise TypeError(f"gm_transformation must be callable(gm) -> callable, got {gm_transformation!r}")

    def wrap(fn: Callable) -> "CompiledStep":
        return functools.update_wrapper(CompiledStep(fn, parallel_mode, gm_transformation), fn)

    return wrap


@dataclass
class _Entry:
    fn: Callable
    gm: torch.fx.GraphModule
    sig: Signature
    joint: JointGraph


class CompiledStep:
    """The callable returned by :func:`compile`; ``.traces`` counts traces so far.

    Traces are kept per guard key (batch shapes/dtypes, hyper-parameters, optimizer state present),
    at most ``max_traces`` of them, least recently used evicted first; a warning says so once the
    step has traced ``warn_after`` times (batch shapes that keep changing: pad them to a few sizes).
    """

    max_traces = 16
    warn_after = 8

    def __init__(self, fn: Callable, mode: ParallelMode, gm_transformation: Callable | None):
        self.fn, self.mode, self.gm_transformation = fn, mode, gm_transformation
        self.state = None
        self._owner: tuple[int, int] | None = None
        self._cache: dict[Any, _Entry] = {}  # insertion order = least recently used first
        self.traces = 0
        # compare batch layout and hyper-parameters across ranks on every call (one tiny all-gather)
        self.check_ranks = True

    @property
    def graph(self) -> torch.fx.GraphModule | None:
        """The per-rank graph of the most recent trace (for inspection)."""
        return self._last.gm if self._cache else None

    def __call__(self, model=None, optimizer=None, *batch):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(
                f"the compiled step's first argument must be the torch.nn.Module, got "
                f"{type(model).__name__}; call it as step(model, optimizer, *batch)"
            )
        spec = optim_spec(optimizer)
        local = self.mode.local_batch(batch)
        joint = None
        if self.check_ranks and getattr(self.mode.mesh, "ndim", 0) == 1:
            _check_ranks_agree(self.mode.mesh, spec, batch, optimizer)
        if self._owner is None:
            # Trace before touching the model: a step that cannot be traced
            # fails with the model and optimizer unchanged.
            joint = self._trace_joint(model, optimizer, self.mode.trace_batch(batch, local))
            self.state = self.mode.setup(model, optimizer, spec)
            self._owner = (id(model), id(optimizer))
        elif self._owner != (id(model), id(optimizer)):
            raise ValueError(
                "this compiled step is bound to the model and optimizer of its first call; "
                "decorate a separate step function for another model/optimizer"
            )
        self.state.spec = spec
        key = self._guard_key(spec, local)
        entry = self._cache.pop(key, None)
        if entry is None:
            joint = joint or self._trace_joint(model, optimizer, self.mode.trace_batch(batch, local))
            entry = self._build(joint, spec, local)
            self._evict_for_one_more()
        self._cache[key] = entry  # (re)inserted last: most recently used
        self._last = entry
        return self._run(entry, model, optimizer, local)

    def _evict_for_one_more(self) -> None:
        while len(self._cache) >= max(int(self.max_traces), 1):
            del self._cache[next(iter(self._cache))]
        if self.traces == self.warn_after:
            warnings.warn(
                f"shardwise.compile: step {getattr(self.fn, '__name__', self.fn)!r} has traced {self.traces} times "
                f"(batch shapes, dtypes or hyper-parameters keep changing); each trace costs seconds and at most "
                f"{self.max_traces} are kept. Pad batches to a few fixed shapes", stacklevel=3,
            )

    def _guard_key(self, spec, local: tuple):
        leaves, treespec = pytree.tree_flatten(local)
        desc = []
        for x in leaves:
            if isinstance(x, torch.Tensor):
                desc.append(("T", tuple(x.shape), x.dtype, x.device.type))
            else:
                desc.append(("C", type(x).__name__, x if _hashable(x) else id(x)))
        st = self.state
        stateful = tuple(st.has_state(n) for n in st.names if st.group_of[n] is not None)
        return (spec, str(treespec), tuple(desc), stateful)

    def _trace_joint(self, model, optimizer, local: tuple) -> JointGraph:
        fake_mode = FakeTensorMode()
        with fake_mode:
            # Global shapes; after setup the parameters are DTensors of the same shape.
            fparams = {
                n: torch.empty(p.shape, dtype=p.dtype, device=p.device) for n, p in model.named_parameters()
            }
        fbufs = {n: fake_mode.from_tensor(b) for n, b in model.named_buffers()}
        flocal = pytree.tree_map(
            lambda t: fake_mode.from_tensor(t) if isinstance(t, torch.Tensor) else t, local
        )
        joint = trace_joint(self.fn, model, optimizer, fparams, fbufs, flocal)
        joint.fake_mode = fake_mode
        return joint

    def _build(self, joint: JointGraph, spec, local: tuple) -> _Entry:
        gm, sig = self.mode.partition(joint, self.state, spec, local, joint.fake_mode)
        fn = self.mode.transform_and_compile(gm, self.gm_transformation)
        self.traces += 1
        return _Entry(fn, gm, sig, joint)

    def _run(self, entry: _Entry, model, optimizer, local: tuple):
        st = self.state
        buffers = dict(model.named_buffers())
        batch_t = [t for t in pytree.tree_leaves(local) if isinstance(t, torch.Tensor)]
        device = next(iter(st.storage.values())).device
        args = []
        for kind, a, b in entry.sig.inputs:
            if kind == "param":
                args.append(st.storage[a])
            elif kind == "buffer":
                args.append(buffers[a])
            elif kind == "opt_state":
                args.append(st.states[a][b])
            elif kind == "lr":
                args.append(torch.tensor(optimizer.param_groups[a]["lr"], dtype=torch.float64, device=device))
            else:
                args.append(batch_t[a])
        with torch.no_grad():
            outs = entry.fn(*args)
        user, new_p, new_s = [], {}, {}
        for (kind, a, b), v in zip(entry.sig.outputs, outs):
            if kind == "user":
                user.append(v)
            elif kind == "param":
                new_p[a] = v
            else:
                new_s.setdefault(a, {})[b] = v
        st.write_back(new_p, new_s)
        # what torch's own step wrapper records, so LR schedulers see a stepped optimizer
        optimizer._opt_called = True
        it = iter(user)
        leaves = [next(it) if is_t else c for is_t, c in entry.joint.out_consts]
        return pytree.tree_unflatten(leaves, entry.joint.out_spec)


def _check_ranks_agree(mesh, spec, batch, optimizer) -> None:
    """Every call: all ranks must step with the same batch shapes and hyper-parameters (lr included),
    or the replicas would silently diverge (and an average of gradients over unequal local batches is
    not the gradient of the whole batch). One 8-byte all-gather of a digest (crc32, not
    Python's per-process hash); only on a mismatch are the details gathered, and every rank raises."""
    import zlib

    import torch.distributed as dist

    from shardwise._device import mesh_device

    leaves = pytree.tree_leaves(batch)
    desc = [(tuple(x.shape), str(x.dtype)) if isinstance(x, torch.Tensor) else repr(x) for x in leaves]
    mine = {"batch": repr(desc), "lr": repr([g["lr"] for g in optimizer.param_groups]), "optimizer": repr(spec)}
    group = mesh.get_group()
    digest = zlib.crc32("|".join(mine.values()).encode())
    device = mesh_device(mesh)
    gathered = torch.empty(dist.get_world_size(group), dtype=torch.int64, device=device)
    dist.all_gather_single(gathered, torch.tensor([digest], dtype=torch.int64, device=device), group=group)
    if bool((gathered == gathered[0]).all()):
        return
    details = [None] * dist.get_world_size(group)
    dist.all_gather_object(details, mine, group=group)
    for what in ("batch", "lr", "optimizer"):
        values = [d[what] for d in details]
        if len(set(values)) > 1:
            diffs = "; ".join(f"rank {r}: {v}" for r, v in enumerate(values) if v != values[0])
            raise ValueError(
                f"compiled step: ranks disagree on the {what} (rank 0: {values[0]}; {diffs}); data parallel needs "
                "the same batch shapes and optimizer settings on every rank (drop or pad a ragged last batch)"
            )


def _hashable(x) -> bool:
    try:
        hash(x)
        return True
    except TypeError:
        return False
