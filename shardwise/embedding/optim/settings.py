"""Which fused optimizer each table gets: per-parameter settings from torch's
``apply_optimizer_in_backward`` (TorchRec's usual way), a collection-wide ``optimizer=`` factory, or
TorchRec's ``fused_params`` with :class:`EmbOptimType` names.

Precedence, per table: the table weight's own ``apply_optimizer_in_backward`` setting, then the
collection-wide ``optimizer=`` / ``fused_params`` (which must agree when both are given). Two
different settings on one table's weight are an error naming the table.

Example:
    >>> import torch
    >>> from torch.distributed.optim import _apply_optimizer_in_backward as apply_optimizer_in_backward
    >>> from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig
    >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig(10, 4, t, feature_names=[t]) for t in ("a", "b")])
    >>> apply_optimizer_in_backward(torch.optim.Adagrad, [ebc.embedding_bags["a"].weight], {"lr": 0.1})
    >>> got = table_optimizers(ebc, None, {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.02})
    >>> {t: (rule.name, hp["lr"]) for t, (rule, hp) in got.items()}
    {'a': ('Adagrad', 0.1), 'b': ('SGD', 0.02)}
"""

from __future__ import annotations

import functools
from enum import Enum
from typing import Optional

import torch

from ...optim.rowwise_adagrad import RowWiseAdagrad
from .rules import resolve_optimizer

__all__ = ["EmbOptimType", "fused_params_optimizer", "table_optimizers", "describe"]


class EmbOptimType(Enum):
    """FBGEMM's embedding optimizer names (``fbgemm_gpu.split_embedding_configs.EmbOptimType``, as
    TorchRec's ``fused_params={"optimizer": ...}`` takes them; same values). Supported fused here:
    SGD / EXACT_SGD, EXACT_ADAGRAD, EXACT_ROWWISE_ADAGRAD / ROWWISE_ADAGRAD, ADAM; the others raise."""

    SGD = "sgd"
    EXACT_SGD = "exact_sgd"
    LAMB = "lamb"
    ADAM = "adam"
    EXACT_ADAGRAD = "exact_adagrad"
    EXACT_ROWWISE_ADAGRAD = "exact_row_wise_adagrad"
    LARS_SGD = "lars_sgd"
    PARTIAL_ROWWISE_ADAM = "partial_row_wise_adam"
    PARTIAL_ROWWISE_LAMB = "partial_row_wise_lamb"
    ROWWISE_ADAGRAD = "row_wise_adagrad"
    SHAMPOO = "shampoo"
    SHAMPOO_V2 = "shampoo_v2"
    MADGRAD = "madgrad"
    EXACT_ROWWISE_WEIGHTED_ADAGRAD = "exact_row_wise_weighted_adagrad"
    ENSEMBLE_ROWWISE_ADAGRAD = "ensemble_row_wise_adagrad"
    EMAINPLACE_ROWWISE_ADAGRAD = "ema_in_place_row_wise_adagrad"
    NONE = "none"


_BY_TYPE = {"sgd": torch.optim.SGD, "exact_sgd": torch.optim.SGD, "exact_adagrad": torch.optim.Adagrad,
            "exact_row_wise_adagrad": RowWiseAdagrad, "row_wise_adagrad": RowWiseAdagrad, "adam": torch.optim.Adam}
# FBGEMM's defaults where fused_params leave a value out (they differ from torch's: eps 1e-8)
_FBGEMM_DEFAULTS = {"learning_rate": 0.01, "eps": 1.0e-8, "beta1": 0.9, "beta2": 0.999, "weight_decay": 0.0}
_OPTIMIZER_KEYS = {"optimizer", "learning_rate", "eps", "beta1", "beta2", "weight_decay"}
_IGNORED_KEYS = {"output_dtype", "stochastic_rounding", "cache_load_factor", "prefetch_pipeline"}


def _type_name(value) -> str:
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, str):
        return value.lower()
    raise TypeError(f"fused_params['optimizer']={value!r} must be an EmbOptimType (or its name), e.g. "
                    f"EmbOptimType.EXACT_ROWWISE_ADAGRAD")


def fused_params_optimizer(fused_params: Optional[dict], where: str):
    """``functools.partial(torch optimizer class, ...)`` for TorchRec's ``fused_params`` (None when
    they name no optimizer and no learning rate). Keys that would change the update and that we do not
    implement raise; FBGEMM kernel knobs without meaning here are listed in ``_IGNORED_KEYS``."""
    if not fused_params:
        return None
    unknown = sorted(set(fused_params) - _OPTIMIZER_KEYS - _IGNORED_KEYS)
    if unknown:
        raise ValueError(f"{where}: fused_params keys {unknown} are not supported (supported: "
                         f"{sorted(_OPTIMIZER_KEYS)}; ignored as kernel-only: {sorted(_IGNORED_KEYS)}); leave them out")
    if "optimizer" not in fused_params and "learning_rate" not in fused_params:
        return None
    kind = _type_name(fused_params.get("optimizer", EmbOptimType.EXACT_SGD))   # FBGEMM's default
    cls = _BY_TYPE.get(kind)
    if cls is None:
        names = sorted({n.upper() for n in _BY_TYPE})
        raise ValueError(f"{where}: fused optimizer {kind!r} is not supported fused here; supported EmbOptimType "
                         f"values: {names}")
    p = {**_FBGEMM_DEFAULTS, **{k: v for k, v in fused_params.items() if k in _FBGEMM_DEFAULTS}}
    if p["weight_decay"]:
        raise ValueError(f"{where}: fused_params weight_decay={p['weight_decay']} is not supported fused (decay of "
                         f"touched rows only); use 0, or torch.optim.AdamW through apply_optimizer_in_backward")
    kwargs: dict = {"lr": float(p["learning_rate"])}
    if cls is not torch.optim.SGD:
        kwargs["eps"] = float(p["eps"])
    if cls is torch.optim.Adam:
        kwargs["betas"] = (float(p["beta1"]), float(p["beta2"]))
    return functools.partial(cls, **kwargs)


def _key(rule, hp) -> tuple:
    return rule.name, tuple(sorted((k, repr(v)) for k, v in hp.items()))


def _param_setting(weight, table: str, where: str):
    classes = getattr(weight, "_optimizer_classes", None)
    if not classes:
        return None
    kwargs = getattr(weight, "_optimizer_kwargs", [{}] * len(classes))
    found = []
    for cls, kw in zip(classes, kwargs):
        try:
            rule, hp = resolve_optimizer(functools.partial(cls, **kw))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: table {table!r}: its apply_optimizer_in_backward setting "
                             f"{cls.__name__}({kw}) cannot be fused: {exc}") from None
        found.append((rule, hp))
    if len({_key(r, h) for r, h in found}) > 1:
        listing = ", ".join(f"{r.name}({h})" for r, h in found)
        raise ValueError(f"{where}: table {table!r} has {len(found)} different optimizers applied in backward "
                         f"({listing}); one table takes one optimizer: apply just one to its weight")
    return found[0]


def table_optimizers(ebc, optimizer=None, fused_params: Optional[dict] = None, where: str = "shard()") -> dict:
    """``{table: (rule, hyper-parameters) | None}`` for ``ebc``'s tables (None: no optimizer given)."""
    from ..shard_source import table_weight

    wide = None
    by_factory = resolve_optimizer(optimizer) if optimizer is not None else None
    by_fused = fused_params_optimizer(fused_params, where)
    by_fused = resolve_optimizer(by_fused) if by_fused is not None else None
    if by_factory and by_fused and _key(*by_factory) != _key(*by_fused):
        raise ValueError(f"{where}: optimizer= gives {describe(*by_factory)} but fused_params give "
                         f"{describe(*by_fused)}; pass one of them")
    wide = by_factory or by_fused
    out = {}
    for t in ebc.tables:
        own = _param_setting(table_weight(ebc, t.name), t.name, where)
        out[t.name] = own or (None if wide is None else (wide[0], dict(wide[1])))
    return out


def describe(rule, hp) -> str:
    """``Adagrad(lr=0.1, eps=1e-10, ...)`` for messages and reprs."""
    skip = ("params", "initial_lr", "foreach", "differentiable", "fused", "capturable", "decoupled_weight_decay")
    shown = ", ".join(f"{k}={v}" for k, v in hp.items()
                      if k not in skip and v is not None and v is not False and (k == "lr" or v != 0))
    return f"{rule.name}({shown})"
