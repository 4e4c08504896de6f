"""The fused optimizer's state, exposed like a torch optimizer's state_dict / load_state_dict."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .rules import STATE_DTYPE
from ..state_dict import copy_into_shards, wrap_shards

__all__ = ["FusedOptimizer"]


class FusedOptimizer:
    """State of the optimizer fused into a sharded collection's backward.

    ``state_dict()`` = ``{"state": {"embedding_bags.<t>.weight": {"step": tensor, <name>: sharded}},
    "param_groups": [{hyper-parameters..., "params": [keys]}]}`` (keys ``embeddings.<t>.weight`` for an
    EmbeddingCollection); the sharded entries view the live state, laid out like the weights (so
    torch.distributed.checkpoint can save and load them).

    Example:
        >>> import functools; from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig, shard, row_wise
        >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig(10, 4, "t0", feature_names=["f"])])
        >>> sharded = shard(ebc, {"t0": row_wise()}, optimizer=functools.partial(torch.optim.Adagrad, lr=0.1))
        >>> sd = sharded.fused_optimizer.state_dict()
        >>> sorted(sd["state"]["embedding_bags.t0.weight"]), sd["param_groups"][0]["lr"]
        (['step', 'sum'], 0.1)
        >>> sharded.fused_optimizer.load_state_dict(sd)
    """

    def __init__(self, module, rule, hp):
        self._module, self.rule, self.hp = module, rule, dict(hp or {})

    def _step(self) -> int:
        # Ranks without any shard never run an update, so agree on the step count collectively.
        topo = self._module._topo
        local = max((s for g in self._module._groups for s in g.store.steps), default=0)
        t = torch.tensor([local], dtype=torch.int64, device=topo.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=topo.group)
        return int(t.item())

    def _entries(self):
        for name, kind in (self.rule.state_shapes.items() if self.rule else []):
            for t, boxes, local, replicated, _ in self._module._table_shards(name, per_row=(kind == "row")):
                size = (t.num_embeddings,) if kind == "row" else (t.num_embeddings, t.embedding_dim)
                yield f"{self._module._prefix}.{t.name}.weight", name, boxes, local, size, replicated

    def state_dict(self) -> dict:
        if self.rule is None:
            return {"state": {}, "param_groups": []}
        step = self._step()
        topo, dtype = self._module._topo, STATE_DTYPE
        state: dict = {}
        for key, name, boxes, local, size, replicated in self._entries():
            entry = state.setdefault(key, {"step": torch.tensor(float(step))})
            entry[name] = wrap_shards(boxes, local, size, topo, replicated, dtype)
        keys = [f"{self._module._prefix}.{t.name}.weight" for t in self._module.tables]
        for key in keys:
            state.setdefault(key, {"step": torch.tensor(float(step))})
        return {"state": state, "param_groups": [{**self.hp, "params": keys}]}

    def load_state_dict(self, state_dict: dict) -> None:
        if self.rule is None:
            raise ValueError("this sharded collection has no fused optimizer (shard(..., optimizer=None))")
        state = state_dict.get("state") if isinstance(state_dict, dict) else None
        if state is None:
            raise ValueError("optimizer state_dict must be {'state': ..., 'param_groups': ...}")
        entries = list(self._entries())
        for key, name, *_ in entries:
            if key not in state or name not in state[key]:
                raise ValueError(f"optimizer state_dict lacks {key!r} / {name!r}; save it from a collection "
                                 f"with the same tables and optimizer ({self.rule.name})")
        # every check before the first copy: a bad entry must not leave the state half loaded
        per_key = {k: int(float(v["step"])) for k, v in state.items() if isinstance(v, dict) and "step" in v}
        steps = set(per_key.values())
        if len(steps) > 1:
            listing = ", ".join(f"{k}: {n}" for k, n in sorted(per_key.items()))
            raise ValueError(f"optimizer state_dict has different steps per table {sorted(steps)} ({listing}); the "
                             "tables of one collection step together: load a state dict saved from one collection "
                             "(nothing was loaded)")
        for key, name, _, _, size, _ in entries:
            if tuple(state[key][name].shape) != tuple(size):
                raise ValueError(f"{key}/{name}: shape {tuple(state[key][name].shape)} does not match the "
                                 f"table's {tuple(size)}; load a state dict of the same tables")
        topo = self._module._topo
        for key, name, boxes, local, size, replicated in entries:
            copy_into_shards(state[key][name], boxes, local, size, topo, replicated, f"{key}/{name}")
        step = steps.pop() if steps else 0
        for g in self._module._groups:
            g.store.steps = [step] * len(g.store.steps)
