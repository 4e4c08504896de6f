"""Parameter and optimizer-state storage owned by a compiled step.

Each parameter lives in one local tensor (full for replicated ones, the
padded ``Shard(0)`` slice for sharded ones).  The model's parameters and
the optimizer's state are replaced by ``shardwise.tensor.DTensor`` views of
that storage, so checkpoints see ordinary distributed tensors while the
compiled graph reads and writes plain local tensors.

Example::

    st = TrainState(model, opt, layouts, mesh, spec)
    model.weight.placements  # (Shard(dim=0),) for a sharded weight
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .layout import ParamLayout
from .optim import OptimSpec, init_state, state_names

__all__ = ["TrainState"]


class TrainState:
    """Owns storage for ``model``'s parameters and ``optimizer``'s state."""

    def __init__(self, model, optimizer, layouts: dict[str, ParamLayout], mesh, spec: OptimSpec):
        self.mesh, self.layouts, self.spec = mesh, layouts, spec
        self.rank = mesh.get_local_rank()
        params = dict(model.named_parameters())
        _check_devices(params, mesh)
        self.names = tuple(params)
        self.group_of = _group_index(optimizer, params)
        _broadcast_from_first(mesh, list(params.values()) + list(model.buffers()))
        self.storage = {n: self._shard(params[n].detach(), layouts[n]) for n in self.names}
        self.states: dict[str, dict[str, torch.Tensor]] = {}
        for n in self.names:
            g = self.group_of[n]
            if g is None:
                continue
            old = optimizer.state.get(params[n], {})
            if old:
                self.states[n] = {
                    k: self._convert_state(k, v, layouts[n], self.storage[n].device) for k, v in old.items()
                }
            else:
                self.states[n] = init_state(spec.groups[g], self.storage[n], has_state=False)
        self._install(model, optimizer, params)

    def _shard(self, full: torch.Tensor, lay: ParamLayout) -> torch.Tensor:
        if not lay.sharded:
            return full.clone()
        pad = lay.padded_rows - lay.shape[0]
        if pad:
            full = torch.cat([full, full.new_zeros((pad, *lay.shape[1:]))])
        return full[self.rank * lay.rows:(self.rank + 1) * lay.rows].clone()

    def _convert_state(self, name: str, value, lay: ParamLayout, device):
        if name == "step" or not isinstance(value, torch.Tensor) or value.shape != lay.shape:
            if isinstance(value, torch.Tensor):
                return value.detach().clone().to(device)
            return torch.tensor(float(value), dtype=torch.float32, device=device)
        return self._shard(value.detach(), lay)

    def has_state(self, fqn: str) -> bool:
        g = self.group_of[fqn]
        names = state_names(self.spec.groups[g], has_state=True)
        return all(k in self.states[fqn] for k in names)

    def wrap(self, fqn: str, local: torch.Tensor) -> torch.Tensor:
        """A DTensor view of ``local`` (storage or same-shaped state)."""
        from shardwise.tensor import DTensor, Replicate, Shard

        lay = self.layouts[fqn]
        if local.dim() == 0 and lay.shape != local.shape:
            return local  # the Adam step count stays a plain scalar, as in torch
        with torch.no_grad():
            if lay.sharded:
                view = local[: lay.valid_rows(self.rank)]
                return DTensor.from_local(view, self.mesh, [Shard(0)], shape=lay.shape)
            return DTensor.from_local(local, self.mesh, [Replicate()], shape=lay.shape)

    def _install(self, model, optimizer, params) -> None:
        new = {n: torch.nn.Parameter(self.wrap(n, self.storage[n]), params[n].requires_grad) for n in self.names}
        by_id = {id(params[n]): new[n] for n in self.names}
        # every alias of a tied parameter must point at the same new Parameter
        for alias, p in model.named_parameters(remove_duplicate=False):
            mod_name, _, attr = alias.rpartition(".")
            setattr(model.get_submodule(mod_name), attr, by_id[id(p)])
        for group in optimizer.param_groups:
            group["params"] = [by_id[id(p)] for p in group["params"]]
        optimizer.state.clear()
        self.params = new
        self.optimizer = optimizer
        for n in self.names:
            self._publish_state(n)

    def _publish_state(self, fqn: str) -> None:
        if self.group_of[fqn] is None or not self.states[fqn]:
            return
        self.optimizer.state[self.params[fqn]] = {
            k: self.wrap(fqn, v) for k, v in self.states[fqn].items()
        }

    @torch.no_grad()
    def write_back(self, storages: dict, states: dict) -> None:
        """Copy a step's results into the storage the DTensors view."""
        for n, t in storages.items():
            self.storage[n].copy_(t)
        for n, st in states.items():
            created = False
            for k, v in st.items():
                if k in self.states[n]:
                    self.states[n][k].copy_(v)
                else:  # lazily created state (SGD momentum) becomes storage
                    self.states[n][k] = v
                    created = True
            if created:
                self._publish_state(n)


def _check_devices(params: dict, mesh) -> None:
    """Before anything changes: the collectives run on the mesh's device, so must the parameters."""
    from shardwise._device import mesh_device

    for n, p in params.items():
        if p.device.type != mesh.device_type:
            raise ValueError(
                f"parameter {n!r} is on {p.device} but the mesh is a {mesh.device_type!r} mesh; move the model "
                f"to this rank's device first (model.to('{mesh_device(mesh)}')), or pass a mesh= on the model's device"
            )


def _group_index(optimizer, params: dict) -> dict:
    where = {}
    for gi, group in enumerate(optimizer.param_groups):
        for p in group["params"]:
            where[id(p)] = gi
    known = {id(p) for p in params.values()}
    stray = [i for i in where if i not in known]
    if stray:
        raise ValueError(
            f"the optimizer holds {len(stray)} tensor(s) that are not parameters of the model; "
            "build the optimizer from model.parameters()"
        )
    return {n: where.get(id(p)) for n, p in params.items()}


def _broadcast_from_first(mesh, tensors) -> None:
    """Start from identical values on every rank, as DDP does."""
    if mesh.size() == 1:
        return
    group = mesh.get_group()
    src = dist.get_global_rank(group, 0)
    with torch.no_grad():
        for t in tensors:
            dist.broadcast(t.data, src=src, group=group)
