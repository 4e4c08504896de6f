"""Keyed optimizers: torch optimizers whose state dict is keyed by parameter name (TorchRec's
``torchrec.optim.keyed``), so one object can stand for a whole model's optimizers -- fused
embedding ones and dense ones -- in checkpoints, LR schedulers and ``step()`` loops.

Example:
    >>> import torch
    >>> lin = torch.nn.Linear(2, 1)
    >>> opt = KeyedOptimizerWrapper(dict(lin.named_parameters()), lambda ps: torch.optim.SGD(ps, lr=0.1))
    >>> combined = CombinedOptimizer([("dense", opt)])
    >>> sorted(combined.params)
    ['dense.bias', 'dense.weight']
    >>> lin(torch.ones(1, 2)).sum().backward(); combined.step()
    >>> sched = torch.optim.lr_scheduler.StepLR(combined, step_size=1, gamma=0.5); sched.step()
    >>> combined.param_groups[0]["lr"]
    0.05
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any, Callable, Collection, Mapping, Optional

import torch

__all__ = ["KeyedOptimizer", "CombinedOptimizer", "KeyedOptimizerWrapper"]


def _copy_into(current: Any, new: Any, where: str) -> Any:
    """Load ``new`` into ``current`` in place where it is a tensor (sharded ones copy their local part)."""
    if isinstance(current, dict):
        if not isinstance(new, Mapping):
            raise ValueError(f"{where}: expected a dict, got {type(new).__name__}")
        for k in current:
            if k not in new:
                raise ValueError(f"{where}: the state to load lacks {k!r} (it has {sorted(new)})")
            current[k] = _copy_into(current[k], new[k], f"{where}.{k}")
        return current
    if isinstance(current, torch.Tensor):
        with torch.no_grad():
            current.copy_(new)
        return current
    return copy.deepcopy(new)


class KeyedOptimizer(torch.optim.Optimizer):
    """An optimizer over ``params`` = ``{name: tensor}`` whose ``state_dict()`` is
    ``{"state": {name: {...}}}`` (plus ``"param_groups"`` with names after
    ``save_param_groups(True)``), TorchRec's signature and state-dict shape. ``load_state_dict``
    copies into the existing state tensors in place (so a checkpoint loads into sharded state), and
    refuses a state with other parameters. ``add_param_group`` is not supported (groups are given).

    Example:
        >>> w = torch.nn.Parameter(torch.ones(2))
        >>> ko = KeyedOptimizer({"w": w}, {w: {"m": torch.zeros(2)}}, [{"params": [w], "lr": 0.1}])
        >>> ko.state_dict()
        {'state': {'w': {'m': tensor([0., 0.])}}}
    """

    def __init__(self, params: Mapping[str, torch.Tensor], state: Mapping[Any, Any],
                 param_groups: Collection[Mapping[str, Any]]) -> None:
        # torch's Optimizer.__init__ would build groups from a parameter list; ours arrive keyed
        self._optimizer_step_pre_hooks: dict = OrderedDict()
        self._optimizer_step_post_hooks: dict = OrderedDict()
        self.state = state
        self.param_groups = param_groups
        self.params = params
        self.defaults: dict = {"_save_param_groups": False}
        known = {id(p) for p in params.values()}
        stray = [k for k in state if id(k) not in known]
        if stray:
            raise ValueError(f"KeyedOptimizer: {len(stray)} state entries belong to no parameter of params "
                             f"({sorted(params)}); every state key must be one of the params")

    def _key_of(self) -> dict:
        return {id(p): k for k, p in self.params.items()}

    def state_dict(self) -> dict:
        key_of = self._key_of()
        out: dict = {"state": {key_of[id(p)]: s for p, s in self.state.items()}}
        if self.defaults.get("_save_param_groups"):
            out["param_groups"] = [{**{k: copy.deepcopy(v) for k, v in g.items() if k != "params"},
                                    "params": sorted(key_of[id(p)] for p in g["params"])}
                                   for g in self.param_groups]
        return out

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        new = state_dict.get("state") if isinstance(state_dict, Mapping) else None
        if new is None:
            raise ValueError("load_state_dict: expected {'state': {parameter name: state}}, got "
                             f"{type(state_dict).__name__}")
        mine = {k: self.state[p] for k, p in self.params.items() if p in self.state}
        if sorted(mine) != sorted(new):
            raise ValueError(f"load_state_dict: the state holds parameters {sorted(new)}, this optimizer "
                             f"{sorted(mine)}; load a state dict saved from the same model (nothing was loaded)")
        for k, s in mine.items():
            _copy_into(s, new[k], k)
        if self.defaults.get("_save_param_groups") and "param_groups" in state_dict:
            self._load_groups(state_dict["param_groups"])
        self.post_load_state_dict()

    def _load_groups(self, groups: list) -> None:
        key_of = self._key_of()
        by_keys = {"/".join(sorted(g["params"])): g for g in groups}
        for g in self.param_groups:
            name = "/".join(sorted(key_of[id(p)] for p in g["params"]))
            if name not in by_keys:
                raise ValueError(f"load_state_dict: no saved param group holds exactly {name}")
            g.update({k: copy.deepcopy(v) for k, v in by_keys[name].items() if k != "params"})

    def post_load_state_dict(self) -> None:
        """Called after a load (subclasses refresh derived values here)."""

    def add_param_group(self, param_group: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__}: param groups are fixed at construction; build "
                                  f"another optimizer and combine them with CombinedOptimizer")

    def save_param_groups(self, save: bool) -> None:
        """Whether ``state_dict()`` also holds ``param_groups`` (TorchRec's default: no)."""
        self.defaults["_save_param_groups"] = bool(save)

    def init_state(self, sparse_grad_parameter_names: Optional[set] = None) -> None:
        """One step on zero gradients, so lazily created state exists before a checkpoint load."""
        for key, p in self.params.items():
            if p.requires_grad:
                g = torch.zeros_like(p)
                p.grad = g.to_sparse() if sparse_grad_parameter_names and key in sparse_grad_parameter_names else g
        self.step()

    def __getstate__(self) -> dict:
        return self.__dict__


def _prefixed(key: str, name: str) -> str:
    return f"{key}.{name}" if key and name else (key or name)


class CombinedOptimizer(KeyedOptimizer):
    """Several keyed optimizers as one (TorchRec's): ``optims`` = ``[opt | (prefix, opt)]``; names
    are ``prefix.name``. ``step`` / ``zero_grad`` run every one; ``param_groups`` is all their
    groups (the same dicts, so an LR scheduler over this object drives each); ``state_dict`` and
    ``load_state_dict`` go through each optimizer's own.

    Example: see the module's.
    """

    def __init__(self, optims: list) -> None:
        self._optims: list = []
        for item in optims:
            key, opt = ("", item) if isinstance(item, KeyedOptimizer) else (
                item if isinstance(item, tuple) and len(item) == 2 else ("", item))
            if not isinstance(opt, KeyedOptimizer):
                raise TypeError(f"CombinedOptimizer takes KeyedOptimizers or (prefix, KeyedOptimizer), got "
                                f"{type(opt).__name__}; wrap a torch optimizer in KeyedOptimizerWrapper")
            self._optims.append((key, opt))
        seen: set = set()
        for key, opt in self._optims:
            for name in opt.params:
                full = _prefixed(key, name)
                if full in seen:
                    raise ValueError(f"CombinedOptimizer: duplicate parameter name {full!r}; give the optimizers "
                                     f"distinct prefixes")
                seen.add(full)
        self._optimizer_step_pre_hooks = OrderedDict()
        self._optimizer_step_post_hooks = OrderedDict()
        save = self._optims[0][1].defaults.get("_save_param_groups", False) if self._optims else False
        self.defaults = {"_save_param_groups": save}

    @property
    def optimizers(self) -> list:
        return self._optims

    @staticmethod
    def prepend_opt_key(name: str, opt_key: str) -> str:
        return _prefixed(opt_key, name)

    @property
    def params(self) -> dict:
        return {_prefixed(k, n): p for k, o in self._optims for n, p in o.params.items()}

    @property
    def state(self) -> dict:
        return {p: s for _, o in self._optims for p, s in o.state.items()}

    @property
    def param_groups(self) -> list:
        return [g for _, o in self._optims for g in o.param_groups]

    def step(self, closure: Any = None) -> None:
        for _, opt in self._optims:
            opt.step(closure=closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for _, opt in self._optims:
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        out: dict = {"state": {}}
        for key, opt in self._optims:
            sd = opt.state_dict()
            out["state"].update({_prefixed(key, n): s for n, s in sd["state"].items()})
            if "param_groups" in sd:
                out.setdefault("param_groups", []).extend(
                    {**g, "params": [_prefixed(key, n) for n in g["params"]]} for g in sd["param_groups"])
        return out

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        new = state_dict.get("state") if isinstance(state_dict, Mapping) else None
        if new is None:
            raise ValueError("load_state_dict: expected {'state': {parameter name: state}}")
        parts, claimed = [], set()
        for key, opt in self._optims:
            own = opt.state_dict()["state"]
            part = {n: new[_prefixed(key, n)] for n in own if _prefixed(key, n) in new}
            claimed.update(_prefixed(key, n) for n in part)
            parts.append((opt, {"state": part}))
        extra = sorted(set(new) - claimed)
        if extra:
            raise ValueError(f"load_state_dict: {extra} belong to none of the combined optimizers (their names: "
                             f"{sorted(self.params)}); nothing was loaded")
        for opt, part in parts:   # each optimizer checks its own part before copying
            opt.load_state_dict(part)

    def save_param_groups(self, save: bool) -> None:
        self.defaults["_save_param_groups"] = bool(save)
        for _, opt in self._optims:
            opt.save_param_groups(save)

    def post_load_state_dict(self) -> None:
        for _, opt in self._optims:
            opt.post_load_state_dict()

    def __repr__(self) -> str:
        return "CombinedOptimizer(\n" + "".join(f"  {k or '(no prefix)'}: {o!r}\n" for k, o in self._optims) + ")"


class KeyedOptimizerWrapper(KeyedOptimizer):
    """A torch optimizer built by ``optim_factory`` over ``params`` (a ``{name: parameter}`` dict),
    keyed by name (TorchRec's signature; ``pass_params_dict`` hands the factory the dict itself).

    Example: see the module's.
    """

    def __init__(self, params: Mapping[str, torch.Tensor], optim_factory: Callable,
                 pass_params_dict: bool = False) -> None:
        self._optimizer = optim_factory(params if pass_params_dict else list(params.values()))
        super().__init__(params, self._optimizer.state, self._optimizer.param_groups)

    def step(self, closure: Any = None) -> Any:
        return self._optimizer.step(closure=closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._optimizer.zero_grad(set_to_none=set_to_none)

    def __repr__(self) -> str:
        return f"KeyedOptimizerWrapper({self._optimizer!r})"
