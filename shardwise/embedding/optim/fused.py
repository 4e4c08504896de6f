"""The fused optimizer of a sharded collection as a torch optimizer (TorchRec's ``KeyedOptimizer``
shape): ``param_groups`` whose hyper-parameters the update in backward reads at every step (so an
LR scheduler drives it), and a state dict keyed like TorchRec's.

State-dict keys: ``{"state": {"embedding_bags.<t>.weight": {"<t>.momentum1": ..., ...}}}`` --
TorchRec's names: Adagrad and RowWiseAdagrad keep ``momentum1``, Adam and AdamW ``momentum1`` and
``momentum2``, SGD nothing. Where our update needs the step count (Adam's bias correction, Adagrad's
``lr_decay``) there is also ``<t>.step``, which TorchRec's does not have. Entries view the live state
laid out like the weights (DTensor / ShardedTable), so torch.distributed.checkpoint saves and loads
them; every rank holds every key (TorchRec's holds only the rank's own tables). State dicts of the
older form (``{"step", "sum", "exp_avg", "exp_avg_sq"}`` per weight) still load.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ...optim.keyed import KeyedOptimizer
from ..state_dict import copy_into_shards, wrap_shards
from .rules import STATE_DTYPE
from .settings import describe

__all__ = ["FusedOptimizer", "torchrec_state_name"]

_TORCHREC_NAMES = {"sum": "momentum1", "exp_avg": "momentum1", "exp_avg_sq": "momentum2"}
_USES_STEP = {"Adagrad", "Adam", "AdamW"}


def torchrec_state_name(table: str, name: str) -> str:
    """``("t", "sum")`` -> ``"t.momentum1"``: our state buffer's name in TorchRec's state dict."""
    return f"{table}.{_TORCHREC_NAMES.get(name, name)}"


class FusedOptimizer(KeyedOptimizer):
    """The optimizer fused into a sharded collection's backward, one object for all its tables.

    ``param_groups``: one per distinct optimizer setting (tables of the same class and
    hyper-parameters share one); the update reads ``lr`` and the other values from the group at each
    backward, so ``torch.optim.lr_scheduler`` classes drive it like any torch optimizer. ``step()``
    and ``zero_grad()`` do nothing (the update ran in backward). ``params``: ``{key: weight}`` with the
    weights as DTensor / ShardedTable views of the live shards. ``state_dict`` is collective (the step
    count is agreed over ranks).

    Example:
        >>> import functools; from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig, shard, row_wise
        >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig(10, 4, "t0", feature_names=["f"])])
        >>> sharded = shard(ebc, {"t0": row_wise()}, optimizer=functools.partial(torch.optim.Adagrad, lr=0.1))
        >>> opt = sharded.fused_optimizer
        >>> sd = opt.state_dict(); sorted(sd["state"]["embedding_bags.t0.weight"])
        ['t0.momentum1', 't0.step']
        >>> opt.param_groups[0]["lr"]
        0.1
        >>> sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5); opt.step(); sched.step()
        >>> opt.param_groups[0]["lr"]      # the next backward's update uses it
        0.05
        >>> opt.load_state_dict(sd)
    """

    def __init__(self, module, rules: list, groups: list, table_group: dict):
        self._optimizer_step_pre_hooks: dict = {}
        self._optimizer_step_post_hooks: dict = {}
        self.defaults = {"_save_param_groups": False}
        self._module, self._rules, self._table_group = module, list(rules), dict(table_group)
        self.param_groups = groups
        self._params_of = None
        self._params: dict = {}

    # ---- what the module and reshard read ---------------------------------------------------------
    @property
    def rule(self):
        """The one rule of every table; None when no table has an optimizer. ValueError when tables
        differ (reshard and load statistics handle one optimizer per collection)."""
        given = set(self._table_group.values())
        if given == {None} or not given:
            return None
        if len(given) > 1:
            raise ValueError(f"the tables of this collection have different optimizers ({self._listing()}); "
                             f"resharding and load statistics need one optimizer for all of its tables")
        return self._rules[next(iter(given))]

    @property
    def hp(self) -> dict:
        """The hyper-parameters of :attr:`rule` (its live param group)."""
        return self.param_groups[self._table_group[self._module.tables[0].name]] if self.rule else {}

    def table_rule(self, table: str):
        g = self._table_group.get(table)
        return (None, None) if g is None else (self._rules[g], self.param_groups[g])

    def _listing(self) -> str:
        parts = []
        for i, g in enumerate(self.param_groups):
            tables = [t for t, k in self._table_group.items() if k == i]
            parts.append(f"{describe(self._rules[i], g)} for {tables}")
        bare = [t for t, k in self._table_group.items() if k is None]
        return "; ".join(parts + ([f"none for {bare}"] if bare else []))

    # ---- torch optimizer surface --------------------------------------------------------------------
    @property
    def params(self) -> dict:
        """``{"embedding_bags.<t>.weight": weight view}`` for the tables with an optimizer (rebuilt
        after a reshard replaced the shards)."""
        if self._params_of is not self._module._groups:
            mod = self._module
            self._params = {}
            for t, boxes, local, replicated, _ in mod._table_shards():
                if self._table_group.get(t.name) is None:
                    continue
                w = wrap_shards(boxes, local, (t.num_embeddings, t.embedding_dim), mod._topo, replicated, mod._dtype)
                w._in_backward_optimizers = [self]   # as torch's apply_optimizer_in_backward marks them
                self._params[f"{mod._prefix}.{t.name}.weight"] = w
            for i, g in enumerate(self.param_groups):
                g["params"] = [self._params[f"{mod._prefix}.{t}.weight"] for t, k in self._table_group.items()
                               if k == i]
            self._params_of = mod._groups
        return self._params

    @property
    def state(self) -> dict:
        """``{weight view: {"<t>.momentum1": state view, ...}}`` (no step: see ``state_dict``)."""
        params = self.params
        return {params[key]: {n: v for n, v, _ in entries} for key, entries in self._entries().items()}

    def step(self, closure=None):
        return closure() if closure is not None else None

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass

    def _entries(self) -> dict:
        """``{key: [(torchrec name, view, (internal name, size))]}`` for every table with state."""
        mod, out = self._module, {}
        for name, kind in sorted({(n, k) for r in self._rules for n, k in r.state_shapes.items()}):
            for t, boxes, local, replicated, _ in mod._table_shards(name, per_row=(kind == "row")):
                rule, _ = self.table_rule(t.name)
                if rule is None or rule.state_shapes.get(name) != kind:
                    continue
                size = (t.num_embeddings,) if kind == "row" else (t.num_embeddings, t.embedding_dim)
                view = wrap_shards(boxes, local, size, mod._topo, replicated, STATE_DTYPE)
                out.setdefault(f"{mod._prefix}.{t.name}.weight", []).append(
                    (torchrec_state_name(t.name, name), view, (name, size, boxes, local, replicated)))
        return out

    def _step(self) -> int:
        # Ranks without any shard never run an update, so agree on the step count collectively.
        topo = self._module._topo
        local = max((s for g in self._module._groups for s in g.store.steps), default=0)
        t = torch.tensor([local], dtype=torch.int64, device=topo.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=topo.group)
        return int(t.item())

    def state_dict(self) -> dict:
        step = self._step() if any(r.name in _USES_STEP for r in self._rules) else 0
        entries = self._entries()
        state: dict = {}
        for t in self._module.tables:
            rule, _ = self.table_rule(t.name)
            if rule is None:
                continue
            key = f"{self._module._prefix}.{t.name}.weight"
            state[key] = {n: v for n, v, _ in entries.get(key, [])}
            if rule.name in _USES_STEP:
                state[key][f"{t.name}.step"] = torch.tensor(float(step))
        out: dict = {"state": state}
        if self.defaults["_save_param_groups"]:
            out["param_groups"] = [{**{k: v for k, v in g.items() if k != "params"},
                                    "params": sorted(k for k, p in self.params.items() if any(p is q for q in g["params"]))}
                                   for g in self.param_groups]
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        """Copy a saved state (ours, TorchRec's names, or the older ``{"step", "sum", ...}`` form) into
        the live state; every check runs before the first copy."""
        state = state_dict.get("state") if isinstance(state_dict, dict) else None
        if state is None:
            raise ValueError("optimizer state_dict must be {'state': {weight key: {state name: tensor}}}")
        plan, steps = [], {}
        for key, entries in self._entries().items():
            saved = state.get(key)
            if saved is None:
                raise ValueError(f"optimizer state_dict lacks {key!r}; save it from a collection with the same "
                                 f"tables and optimizers ({self._listing()}) (nothing was loaded)")
            table = key[len(self._module._prefix) + 1:-len(".weight")]
            for name, _, (internal, size, boxes, local, replicated) in entries:
                value = saved.get(name, saved.get(internal))     # TorchRec's name, or the older one
                if value is None:
                    raise ValueError(f"optimizer state_dict lacks {key!r} / {name!r} (has {sorted(saved)}); save it "
                                     f"from a collection with the same optimizers ({self._listing()})")
                if tuple(value.shape) != tuple(size):
                    raise ValueError(f"{key}/{name}: shape {tuple(value.shape)} does not match the table's "
                                     f"{tuple(size)}; load a state dict of the same tables")
                plan.append((value, boxes, local, size, replicated, f"{key}/{name}"))
            s = saved.get(f"{table}.step", saved.get("step"))
            if s is not None:
                steps[key] = int(float(s))
        if len(set(steps.values())) > 1:
            listing = ", ".join(f"{k}: {n}" for k, n in sorted(steps.items()))
            raise ValueError(f"optimizer state_dict has different steps per table {sorted(set(steps.values()))} "
                             f"({listing}); the tables of one "
                             "collection step together: load a state dict saved from one collection (nothing was loaded)")
        topo = self._module._topo
        for value, boxes, local, size, replicated, what in plan:
            copy_into_shards(value, boxes, local, size, topo, replicated, what)
        if steps:
            step = next(iter(steps.values()))
            for g in self._module._groups:
                g.store.steps = [step] * len(g.store.steps)
        if self.defaults["_save_param_groups"] and "param_groups" in state_dict:
            self._load_groups(state_dict["param_groups"])

    def __repr__(self) -> str:
        return f"FusedOptimizer({self._listing() or 'no tables'})"
