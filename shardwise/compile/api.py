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

import dataclasses
import functools
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode

from . import agreement
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
    mutated_buffers: tuple[str, ...] = ()


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
        # compare batch layout and hyper-parameters across ranks on every call (agreement.py): carried
        # by the graph's first gradient bucket, or one 32-float all-reduce where a graph carries nothing
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
        check = self.check_ranks and getattr(self.mode.mesh, "ndim", 0) == 1
        # after the first step a DataParallel graph carries the check in its first gradient bucket
        # (agreement.py); the first step, and modes whose graphs carry nothing, check with a collective
        carried = check and getattr(self.mode, "carries_agreement", False) and bool(self._cache)
        if check and not carried:
            agreement.check_now(self.mode.mesh, agreement.describe(batch, optimizer, self._optim_spec(optimizer)))
        try:
            spec = self._optim_spec(optimizer)
            entry, local = self._prepare(model, optimizer, spec, batch)
        except Exception as exc:
            if carried:  # the other ranks are in this step's collectives: meet them there, then fail together
                self._fail_together(exc, batch, optimizer)
            raise
        mine = agreement.describe(batch, optimizer, spec) if carried else None
        return self._run(entry, model, optimizer, local, mine)

    def _optim_spec(self, optimizer):
        spec = optim_spec(optimizer)
        if self.gm_transformation is None:
            return spec
        # a transformation such as torch.compile re-traces the graph with fake tensors, and torch's fused
        # optimizer kernels (tensor-lr overloads) have no fake implementation: trace the per-parameter update
        return dataclasses.replace(spec, groups=tuple(dataclasses.replace(g, fused=False) for g in spec.groups))

    def _prepare(self, model, optimizer, spec, batch) -> tuple[_Entry, tuple]:
        """Validate, trace and build (or fetch) this call's graph; no collective, nothing mutated."""
        local = self.mode.local_batch(batch)
        joint = None
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
        return entry, local

    def _fail_together(self, exc: Exception, batch, optimizer) -> None:
        """This rank could not build its step while the others run theirs: replay the last graph's
        collectives with a poisoned agreement carrier, then raise what every rank raises."""
        from shardwise._device import mesh_device

        try:
            spec = repr(self._optim_spec(optimizer))
        except (TypeError, ValueError) as e:
            spec = f"unreadable ({e})"
        mine = agreement.describe(batch, optimizer, None, error=f"{type(exc).__name__}: {exc}")
        mine["optimizer"] = spec
        agreement.replay_collectives(self._last.gm, mesh_device(self.mode.mesh))
        agreement.explain(self.mode.mesh.get_group(), mine)

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
        return _Entry(fn, gm, sig, joint, tuple(agreement.mutated_buffers(gm)))

    def _run(self, entry: _Entry, model, optimizer, local: tuple, mine: dict | None):
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
            elif kind == "agree":  # no bits to compare on the first step (checked before it) or unchecked
                args.append(agreement.digest_bits(mine, device) if mine is not None else
                            torch.zeros(agreement.DIGEST_BITS, dtype=torch.float32, device=device))
            else:
                args.append(batch_t[a])
        saved = {n: buffers[n].clone() for n in entry.mutated_buffers} if mine is not None else {}
        try:
            with torch.no_grad():
                outs = entry.fn(*args)
        except agreement.RanksDisagree:
            # raised on every rank at once, before the optimizer wrote anything; only buffers the
            # forward updated (BatchNorm statistics) need their old values back
            with torch.no_grad():
                for n, old in saved.items():
                    buffers[n].copy_(old)
            agreement.explain(self.mode.mesh.get_group(), mine)
            raise AssertionError("the agreement bits differed but every rank described the same step")
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


def _hashable(x) -> bool:
    try:
        hash(x)
        return True
    except TypeError:
        return False
