"""``DTensorExpandMode``: the generic path through the DTensor core.

Every node of the traced joint graph is re-run on DTensors whose
placements come from the inputs (``input_placements``) and parameters
(``param_placements``); the core's sharding rules pick each op's strategy
and its redistributions, which are recorded (as functional collectives and
local ops) into a new per-rank graph by ``make_fx``.  Gradients are then
redistributed to their parameter's placement and the optimizer runs on the
local pieces.  Unlike :class:`~.data_parallel.DataParallel`, no collective
is chosen by this module: they are all implied by the propagation.

Example::

    mode = DTensorExpandMode(input_placements=([Shard(0)], [Shard(0)]))  # mesh=None: the whole world

    @compile(parallel_mode=mode)
    def step(model, opt, x, y): ...
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
import torch.fx.traceback as fx_traceback
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import make_fx

from .layout import ParamLayout
from .modes import ParallelMode, Signature, mesh_first
from .optim import functional_update, state_names
from .passes import bucket_gradients, schedule_waits
from .state import TrainState

__all__ = ["DTensorExpandMode"]


class DTensorExpandMode(ParallelMode):
    """Propagate shardings through every node with the core's strategies.

    ``input_placements``: one placement list per batch argument (e.g.
    ``[Shard(0)]`` splits that argument's dim 0 like ``torch.chunk``;
    ``[Replicate()]`` gives every rank all of it).  The step receives the
    global batch.  ``param_placements(fqn, param)`` returns a placement list
    for a parameter (default: replicated); ``Shard(0)`` needs dim 0 divisible
    by the mesh size.  ``fallback_to_replicate=True`` lets ops without a
    sharding rule in the core run replicated (their inputs are gathered).
    The gradient redistributions are bucketed like DataParallel's
    (``bucket_cap_bytes``, 0 = one collective per parameter). ``mesh=None`` (default) is every rank of
    the default process group, as for DataParallel; ``DTensorExpandMode(mesh, input_placements)`` still works.

    Example (every rank passes the global batch; ``x`` and ``y`` split along dim 0):
        >>> import copy; from shardwise.compile import compile; from shardwise.tensor import Shard
        >>> @compile(parallel_mode=DTensorExpandMode(input_placements=[[Shard(0)], [Shard(0)]]))
        ... def step(model, optimizer, x, y):
        ...     loss = ((model(x) - y) ** 2).mean()
        ...     loss.backward(); optimizer.step(); optimizer.zero_grad()
        ...     return loss
        >>> model = torch.nn.Linear(4, 2); ref = copy.deepcopy(model)
        >>> x, y = torch.randn(8, 4), torch.randn(8, 2)
        >>> torch.allclose(step(model, torch.optim.SGD(model.parameters(), lr=0.1), x, y), ((ref(x) - y) ** 2).mean())
        True
    """

    def __init__(self, *args, input_placements: Optional[Sequence[Sequence]] = None,
                 param_placements: Optional[Callable] = None,
                 mesh=None, fallback_to_replicate: bool = False, bucket_cap_bytes: int = 4 << 20):
        from shardwise.tensor import Replicate, Shard

        # DTensorExpandMode(input_placements, param_placements, *, mesh=None, ...); like DataParallel,
        # mesh=None is every rank of the default group, and the earlier mesh-first form still works
        mesh, rest = mesh_first("DTensorExpandMode", args, mesh)
        if len(rest) > 2:
            raise TypeError(
                f"DTensorExpandMode takes at most 2 positional arguments (input_placements, param_placements), "
                f"got {len(rest)}; pass the rest by keyword"
            )
        for name, _, kw in zip(("input_placements", "param_placements"), rest, (input_placements, param_placements)):
            if kw is not None:
                raise TypeError(f"DTensorExpandMode got {name} twice (positionally and by keyword)")
        input_placements, param_placements = (tuple(rest) + (input_placements, param_placements)[len(rest):])[:2]
        if input_placements is None:
            raise TypeError(
                "DTensorExpandMode needs input_placements: one [Shard(d)] or [Replicate()] per batch argument"
            )
        pls = [tuple(p) for p in input_placements]
        for i, p in enumerate(pls):
            if len(p) != 1 or not isinstance(p[0], (Shard, Replicate)):
                raise ValueError(
                    f"input_placements[{i}]={list(p)!r}: give one Shard(d) or Replicate() per batch argument"
                )
        self.mesh, self.input_placements = mesh, pls
        self.param_placements = param_placements
        self.fallback_to_replicate = fallback_to_replicate
        if not isinstance(bucket_cap_bytes, int) or bucket_cap_bytes < 0:
            raise ValueError(f"bucket_cap_bytes={bucket_cap_bytes!r} must be a non-negative int")
        self.bucket_cap_bytes = bucket_cap_bytes

    def _param_placement(self, fqn: str, p: torch.Tensor):
        from shardwise.tensor import Replicate, Shard

        pl = tuple(self.param_placements(fqn, p)) if self.param_placements else (Replicate(),)
        if pl == (Shard(0),) and p.dim() > 0 and p.shape[0] % self.world == 0:
            return pl
        if pl != (Replicate(),):
            raise ValueError(
                f"param_placements({fqn!r}) returned {list(pl)!r}; DTensorExpandMode supports Replicate() "
                f"and Shard(0) with dim 0 ({tuple(p.shape)}) divisible by the {self.world} ranks"
            )
        return pl

    def setup(self, model, optimizer, spec) -> TrainState:
        from shardwise.tensor import Shard

        layouts = {
            n: ParamLayout(n, p.shape, p.dtype, self._param_placement(n, p) == (Shard(0),), self.world)
            for n, p in model.named_parameters()
        }
        return TrainState(model, optimizer, layouts, self.mesh, spec)

    def local_batch(self, batch: tuple) -> tuple:
        from shardwise.tensor import Shard

        if len(batch) != len(self.input_placements):
            raise ValueError(
                f"input_placements has {len(self.input_placements)} entries but the step got {len(batch)} "
                "batch arguments; give one placement list per argument"
            )
        rank = self.mesh.get_local_rank()
        out = []
        for i, (arg, (pl,)) in enumerate(zip(batch, self.input_placements)):
            if not isinstance(arg, torch.Tensor):
                raise TypeError(f"DTensorExpandMode batch argument {i} must be a tensor, got {type(arg).__name__}")
            if isinstance(pl, Shard):
                if arg.dim() <= pl.dim or arg.shape[pl.dim] % self.world:
                    raise ValueError(
                        f"batch argument {i} of shape {tuple(arg.shape)} cannot be split evenly along dim "
                        f"{pl.dim} over {self.world} ranks; use a size divisible by {self.world}"
                    )
                arg = arg.chunk(self.world, pl.dim)[rank].contiguous()
            out.append(arg)
        return tuple(out)

    def trace_batch(self, batch: tuple, local: tuple) -> tuple:
        # ops on DTensors see global shapes, so the joint graph's view sizes must be global
        return batch

    def partition(self, joint, state, spec, local_batch, fake_mode):
        if not self.fallback_to_replicate:
            return _expand(self, joint, state, spec, local_batch, fake_mode)
        from shardwise.tensor import gather_fallback

        # ops without a sharding rule gather their inputs (the core warns once per op); only for
        # this trace: the recorded graph keeps those gathers, the caller's setting is untouched
        with gather_fallback(True):
            return _expand(self, joint, state, spec, local_batch, fake_mode)

    def transform_and_compile(self, gm, gm_transformation=None):
        bucket_gradients(gm, self.world, self.bucket_cap_bytes)
        schedule_waits(gm)
        gm.graph.lint()
        gm.recompile()
        return gm_transformation(gm) if gm_transformation is not None else gm


def _expand(mode: DTensorExpandMode, joint, state, spec, local_batch, fake_mode):
    from shardwise.tensor import DTensor, Replicate, Shard

    mesh = mode.mesh
    names = list(joint.param_names)
    updated = [f for f, g in zip(names, joint.has_grad) if g and state.group_of[f] is not None]
    keys = {f: sorted(state.states[f]) for f in updated}
    pl = {f: (Shard(0),) if state.layouts[f].sharded else (Replicate(),) for f in names}
    in_pl = [p for p, t in zip(mode.input_placements, local_batch) if isinstance(t, torch.Tensor)]
    global_shapes = [list(t.shape) for t in local_batch if isinstance(t, torch.Tensor)]
    for (p,), shape in zip(in_pl, global_shapes):
        if isinstance(p, Shard):  # local_batch split evenly (checked), so global = local * N
            shape[p.dim] *= mode.world
    box = {}

    def per_rank(storages, buffers, states, lrs, batch):
        with torch.no_grad():
            params = [DTensor.from_local(s, mesh, pl[f], shape=state.layouts[f].shape) for f, s in zip(names, storages)]
            bufs = [DTensor.from_local(b, mesh, [Replicate()]) for b in buffers]
            xs = [DTensor.from_local(x, mesh, p, shape=shape) for x, p, shape in zip(batch, in_pl, global_shapes)]
            outs = _ReplicateConstants(joint.gm, mesh).run(*params, *bufs, *xs)
            user, grads = outs[: joint.n_user_out], outs[joint.n_user_out:]
            box["user_placements"] = [u.placements for u in user]
            user = [u.redistribute(mesh, [Replicate()]).to_local() for u in user]
            grad_of = dict(zip(names, grads))
            local_grads = []
            for f in updated:  # tagged so the gradient-bucketing pass can merge these collectives
                with fx_traceback.annotate({"sw_role": "grad_sync", "sw_fqn": f}):
                    local_grads.append(grad_of[f].redistribute(mesh, pl[f]).to_local())
            st_by = {f: dict(zip(keys[f], s)) for f, s in zip(updated, states)}
            created = _local_update(spec, state, updated, dict(zip(names, storages)), local_grads, st_by, lrs)
            box["created"] = [k for k, _ in created]
            return user + [v for _, v in created]

    fake = lambda t: fake_mode.from_tensor(t)  # noqa: E731
    args = (
        [fake(state.storage[f]) for f in names],
        _buffers(joint),
        [[fake(state.states[f][k]) for k in keys[f]] for f in updated],
        [fake(torch.zeros((), dtype=torch.float64, device=_device(state))) for _ in spec.groups],
        [fake(t) for t in local_batch if isinstance(t, torch.Tensor)],
    )
    # the core's id range check is recorded as an op that raises when the graph runs (ops/nn/embedding.py)
    with fx_traceback.preserve_node_meta():
        gm = make_fx(per_rank, tracing_mode="fake")(*args)
    for node in gm.graph.nodes:
        node.meta.update(node.meta.get("custom") or {})
    sig = Signature()
    sig.inputs += [("param", f, None) for f in names]
    sig.inputs += [("buffer", b, None) for b in joint.buffer_names]
    sig.inputs += [("opt_state", f, k) for f in updated for k in keys[f]]
    sig.inputs += [("lr", gi, None) for gi in range(len(spec.groups))]
    sig.inputs += [("input", i, None) for i in range(len(args[4]))]
    sig.outputs += [("user", i, None) for i in range(joint.n_user_out)]
    sig.outputs += [("opt_state", f, k) for f, k in box["created"]]
    _flatten_signature(gm)
    _tag_placeholders(gm, sig)
    return gm, sig


_KIND = {"param": "param", "buffer": "buffer", "opt_state": "opt_state", "lr": "hparam", "input": "input"}


def _tag_placeholders(gm: torch.fx.GraphModule, sig: Signature) -> None:
    """Provenance tags (as in the DataParallel graphs) from the signature we built."""
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert len(phs) == len(sig.inputs), (len(phs), len(sig.inputs))
    for node, (kind, fqn, _) in zip(phs, sig.inputs):
        node.meta["sw_kind"] = _KIND[kind]
        node.meta["sw_fqn"] = fqn if kind in ("param", "buffer", "opt_state") else None
    for node in gm.graph.nodes:
        if node.op == "call_function":
            val = node.meta.get("val")
            node.meta.setdefault("sw_kind", "activation" if isinstance(val, torch.Tensor) else "non_tensor")


def _local_update(spec, state, updated, by_name, local_grads, st_by, lrs) -> list:
    """Run the optimizer on local pieces (in place); returns lazily created state."""
    created = []
    for gi, group in enumerate(spec.groups):
        idx = [i for i, f in enumerate(updated) if state.group_of[f] == gi]
        _, new_s = functional_update(group, [by_name[updated[i]] for i in idx], [local_grads[i] for i in idx],
                                     [st_by[updated[i]] for i in idx], lrs[gi])
        for i, s in zip(idx, new_s):
            f = updated[i]
            created += [((f, k), s[k]) for k in state_names(group, True) if k in s and k not in st_by[f]]
    return created


class _ReplicateConstants(torch.fx.Interpreter):
    """Runs the joint graph on DTensors.  Values computed from no input (masks,
    ``arange``) are identical on every rank: they stay plain tensors until an
    op mixes them with DTensors, where they join as ``Replicate()``."""

    def __init__(self, gm, mesh):
        super().__init__(gm)
        self.mesh = mesh

    def call_function(self, target, args, kwargs):
        from shardwise.tensor import DTensor, Replicate

        leaves = pytree.tree_leaves((args, kwargs))
        if any(isinstance(x, DTensor) for x in leaves):
            def wrap(x):
                if isinstance(x, torch.Tensor) and not isinstance(x, DTensor) and x.dim() > 0:
                    return DTensor.from_local(x, self.mesh, [Replicate()])
                return x

            args, kwargs = pytree.tree_map(wrap, (args, kwargs))
        return super().call_function(target, args, kwargs)


def _buffers(joint):
    return [n.meta["val"] for n in joint.gm.graph.nodes if n.meta.get("sw_kind") == "buffer"]


def _device(state) -> torch.device:
    return next(iter(state.storage.values())).device


def _flatten_signature(gm: torch.fx.GraphModule) -> None:
    """make_fx graphs take pytree-structured args; the runtime passes a flat list."""
    gm.graph._codegen = torch.fx.graph.CodeGen()
    gm.recompile()
