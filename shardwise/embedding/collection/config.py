"""Table configuration for embedding-bag collections."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

__all__ = ["BaseEmbeddingConfig", "EmbeddingBagConfig", "EmbeddingConfig", "PoolingType", "DataType"]


class PoolingType(str, enum.Enum):
    """How a bag's rows combine: their sum, or their mean (divided by the bag's id count).

    Example:
        >>> EmbeddingBagConfig(10, 4, "t", feature_names=["f"], pooling=PoolingType.MEAN).pooling
        'mean'
    """

    SUM = "sum"
    MEAN = "mean"


class DataType(str, enum.Enum):
    """Weight storage type of a table (TorchRec's names); optimizer state is always fp32.

    Example:
        >>> EmbeddingBagConfig(10, 4, "t", feature_names=["f"], data_type=DataType.FP16).data_type.value
        'FP16'
    """

    FP32 = "FP32"
    FP16 = "FP16"
    BF16 = "BF16"

    @property
    def torch_dtype(self) -> torch.dtype:
        return {"FP32": torch.float32, "FP16": torch.float16, "BF16": torch.bfloat16}[self.value]


@dataclass(frozen=True)
class BaseEmbeddingConfig:
    """The fields every table config shares (TorchRec's ``BaseEmbeddingConfig``, in its order); use
    :class:`EmbeddingBagConfig` (pooled) or :class:`EmbeddingConfig` (one row per id).

    Example:
        >>> EmbeddingConfig(1000, 16, "t_user", feature_names=["user_id"]).num_embeddings
        1000
    """

    num_embeddings: int
    embedding_dim: int
    name: str = ""
    data_type: DataType = DataType.FP32
    feature_names: tuple = field(default_factory=tuple)
    weight_init_max: Optional[float] = None     # initial values uniform in [min, max] (default ±sqrt(1/rows))
    weight_init_min: Optional[float] = None
    num_embeddings_post_pruning: Optional[int] = None   # accepted for TorchRec code; must be None here
    # applied to each shard's tensor after the default init (TorchRec's init_fn): values may depend on
    # the plan; left out of equality and repr (a function's repr differs across processes)
    init_fn: Optional[Callable] = field(default=None, compare=False, repr=False)
    need_pos: bool = False                      # accepted for TorchRec code; must be False here

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name or "." in self.name:
            raise ValueError(f"table name {self.name!r} must be a non-empty str without '.'; "
                             f"it becomes part of state-dict keys")
        for attr in ("num_embeddings", "embedding_dim"):
            v = getattr(self, attr)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"table {self.name!r}: {attr}={v!r} must be a positive int")
        names = self.feature_names
        if isinstance(names, str) or not all(isinstance(f, str) for f in names):
            raise TypeError(f"table {self.name!r}: feature_names must be a list of str, got {names!r}")
        if not names:
            raise ValueError(f"table {self.name!r}: feature_names is empty; give the features that use it")
        if len(set(names)) != len(names):
            raise ValueError(f"table {self.name!r}: duplicate feature names in {list(names)}")
        object.__setattr__(self, "feature_names", tuple(names))
        lo, hi = self.weight_init_min, self.weight_init_max
        if (lo is None) != (hi is None) or (lo is not None and not float(lo) <= float(hi)):
            raise ValueError(f"table {self.name!r}: weight_init_min={lo!r}, weight_init_max={hi!r}: give both, "
                             f"min <= max (or neither, for the default ±sqrt(1/num_embeddings))")
        if self.init_fn is not None and not callable(self.init_fn):
            raise TypeError(f"table {self.name!r}: init_fn={self.init_fn!r} must be callable(tensor) -> None")
        dt = self.data_type.value if isinstance(self.data_type, enum.Enum) else self.data_type
        try:
            object.__setattr__(self, "data_type", DataType(str(dt).upper()))
        except ValueError:
            raise ValueError(f"table {self.name!r}: data_type={self.data_type!r} is not supported; use "
                             f"DataType.FP32, FP16 or BF16") from None
        if self.num_embeddings_post_pruning is not None or self.need_pos:
            raise ValueError(f"table {self.name!r}: num_embeddings_post_pruning / need_pos are TorchRec "
                             f"inference features shardwise does not implement; leave them unset")


@dataclass(frozen=True)
class EmbeddingBagConfig(BaseEmbeddingConfig):
    """One embedding table and the features that look it up; TorchRec's fields in TorchRec's order
    (``num_embeddings, embedding_dim, name, data_type, feature_names, weight_init_max,
    weight_init_min, ..., init_fn, ..., pooling``), so code written for TorchRec runs unchanged.

    ``data_type``: weights in fp32, fp16 or bf16 (``DataType`` or its name); optimizer state stays fp32.
    ``pooling="mean"`` divides the (weighted) sum of a bag by the number of ids in it; an empty bag
    pools to zeros.

    Example:
        >>> EmbeddingBagConfig(num_embeddings=1000, embedding_dim=16, name="t_user", feature_names=["user_id"]).name
        't_user'
        >>> EmbeddingBagConfig(1000, 16, "t_user", DataType.FP16, ["user_id"]).data_type
        <DataType.FP16: 'FP16'>
    """

    pooling: str = "sum"

    def __post_init__(self):
        super().__post_init__()
        try:
            object.__setattr__(self, "pooling", PoolingType(self.pooling).value)
        except ValueError:
            raise ValueError(f"table {self.name!r}: pooling={self.pooling!r} is not supported; "
                             f"use 'sum' or 'mean'") from None


@dataclass(frozen=True)
class EmbeddingConfig(BaseEmbeddingConfig):
    """A table of an :class:`~shardwise.embedding.EmbeddingCollection`: one embedding row per id, no
    pooling (TorchRec's ``EmbeddingConfig``: the base fields, in TorchRec's order).

    Example:
        >>> EmbeddingConfig(num_embeddings=1000, embedding_dim=16, name="t_item", feature_names=["item_seq"]).name
        't_item'
    """


def check_tables(tables, kind=EmbeddingBagConfig) -> list:
    """Validate a table list: configs of ``kind`` (a config class or a tuple of them), unique table
    names, each feature in exactly one table."""
    tables = list(tables)
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names_of = " or ".join(k.__name__ for k in kinds)
    if not tables:
        raise ValueError(f"need at least one {names_of}")
    for t in tables:
        if not isinstance(t, kinds):
            raise TypeError(f"tables must be {names_of}, got {type(t).__name__}")
    names = [t.name for t in tables]
    if len(set(names)) != len(names):
        raise ValueError(f"table names must be unique, got {names}")
    seen: dict[str, str] = {}
    for t in tables:
        for f in t.feature_names:
            if f in seen:
                raise ValueError(f"feature {f!r} is used by tables {seen[f]!r} and {t.name!r}; "
                                 f"a feature may look up only one table")
            seen[f] = t.name
    return tables
