"""The unsharded EmbeddingCollection: one embedding row per id (no pooling), TorchRec's names and
output (``Dict[str, JaggedTensor]``); the ground truth its sharded form is tested against."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ...sparse import JaggedTensor, KeyedJaggedTensor
from .bag_collection import TableBags
from .config import EmbeddingConfig, check_tables
from .init import fill_rows

__all__ = ["EmbeddingCollection", "check_sequence_tables", "check_sequence_features", "sequence_output"]


def check_sequence_tables(tables: Sequence[EmbeddingConfig]) -> list[EmbeddingConfig]:
    """Configs of one collection: EmbeddingConfigs of one ``embedding_dim`` (TorchRec's rule: every
    feature's rows are stacked into one ``[ids, dim]`` output)."""
    tables = check_tables(tables, EmbeddingConfig)
    dims = {t.name: t.embedding_dim for t in tables}
    if len(set(dims.values())) > 1:
        raise ValueError(f"all tables of an EmbeddingCollection must have the same embedding_dim (TorchRec's "
                         f"rule), got {dims}; give them one dim or put them in separate collections")
    return tables


def check_sequence_features(kjt: KeyedJaggedTensor, known: Sequence[str]) -> None:
    """The batch is a KJT whose keys are all looked up by some table. Weights are ignored, as in
    TorchRec (an EmbeddingConfig has nothing to weight)."""
    if not isinstance(kjt, KeyedJaggedTensor):
        raise TypeError(f"forward expects a KeyedJaggedTensor, got {type(kjt).__name__}")
    unknown = [k for k in kjt.keys() if k not in set(known)]
    if unknown:
        raise ValueError(f"features {unknown} are not looked up by any table (known: {list(known)}); "
                         f"drop them from the batch or add them to an EmbeddingConfig")


def sequence_output(features: Sequence[str], kjt: KeyedJaggedTensor, rows: dict, dim: int, dtype,
                    device, need_indices: bool = False) -> dict:
    """``{feature: JaggedTensor}`` in config order from ``rows[feature]`` ([ids, dim], the input's id
    order); a feature absent from the batch gets no ids (``batch`` empty bags). ``need_indices``: each
    output's weights are its feature's ids (TorchRec's ``need_indices=True``)."""
    out, present = {}, kjt.keys()
    for f in features:
        ids = None
        if f in present:
            jt = kjt[f]
            lengths, ids = jt.lengths(), jt.values()
        else:
            lengths = torch.zeros(kjt.stride(), dtype=torch.int64, device=device)
        values = rows.get(f)
        if values is None:
            values = torch.zeros(0, dim, dtype=dtype, device=device)
        if need_indices and ids is None:
            ids = torch.zeros(0, dtype=kjt.values().dtype, device=values.device)
        weights = ids.to(values.device) if need_indices else None
        out[f] = JaggedTensor(values, weights, lengths=lengths.to(values.device))
    return out


class EmbeddingCollection(nn.Module):
    """Embedding tables returning one row per id: ``forward(kjt)`` gives ``{feature: JaggedTensor}``
    (features in config order) whose values are ``[ids of that feature, embedding_dim]`` in the
    batch's order and whose lengths are the batch's -- TorchRec's ``EmbeddingCollection``.

    Initial values are the same pure function of (``init_seed``, table name, row) as the bag
    collection's (:mod:`~shardwise.embedding.collection.init`); ``device="meta"`` holds no storage and
    :func:`~shardwise.embedding.shard` then materialises each rank's own shards only. A feature absent
    from the batch gets empty bags (TorchRec raises KeyError); weights on the batch are ignored, as in
    TorchRec. ``need_indices=True`` returns each feature's ids as its output JaggedTensor's weights, as
    TorchRec's does.

    Example:
        >>> ec = EmbeddingCollection([EmbeddingConfig(100, 8, "t", feature_names=["f"])])
        >>> out = ec(KeyedJaggedTensor(["f"], torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 1])))
        >>> out["f"].values().shape, out["f"].lengths().tolist()
        (torch.Size([3, 8]), [2, 1])
    """

    def __init__(self, tables: Sequence[EmbeddingConfig], device: Optional[torch.device] = None,
                 need_indices: bool = False, init_seed: int = 0):
        super().__init__()
        self._tables = check_sequence_tables(tables)
        if not isinstance(init_seed, int) or isinstance(init_seed, bool):
            raise TypeError(f"init_seed={init_seed!r} must be an int")
        self.init_seed = init_seed
        if not isinstance(need_indices, bool):
            raise TypeError(f"need_indices={need_indices!r} must be a bool")
        self._need_indices = need_indices
        embeddings = {}
        for t in self._tables:
            emb = nn.Embedding(t.num_embeddings, t.embedding_dim, device=device,
                               _weight=torch.empty(t.num_embeddings, t.embedding_dim, device=device,
                                                  dtype=t.data_type.torch_dtype))
            if emb.weight.device.type != "meta":   # meta: no storage; shard() fills each rank's shards
                fill_rows(emb.weight.data, t, init_seed, 0, 0)
                if t.init_fn is not None:
                    t.init_fn(emb.weight.data)
            embeddings[t.name] = emb
        self.embeddings = TableBags(embeddings)

    @property
    def is_meta(self) -> bool:
        """True when the tables hold no storage (built with ``device="meta"``)."""
        return any(self.embeddings[t.name].weight.device.type == "meta" for t in self._tables)

    @property
    def tables(self) -> list[EmbeddingConfig]:
        return list(self._tables)

    @property
    def is_weighted(self) -> bool:
        return False   # an EmbeddingConfig has no per-id weights; shard() digests this like the bag case

    def embedding_configs(self) -> list[EmbeddingConfig]:
        return list(self._tables)

    def embedding_dim(self) -> int:
        return self._tables[0].embedding_dim

    def need_indices(self) -> bool:
        return self._need_indices

    def embedding_names_by_table(self) -> list[list[str]]:
        return [list(t.feature_names) for t in self._tables]

    def feature_names(self) -> list[str]:
        return [f for t in self._tables for f in t.feature_names]

    def forward(self, kjt: KeyedJaggedTensor) -> dict:
        check_sequence_features(kjt, self.feature_names())
        rows = {}
        present = set(kjt.keys())
        for t in self._tables:
            weight = self.embeddings[t.name].weight
            for f in t.feature_names:
                if f in present:
                    rows[f] = F.embedding(kjt[f].values(), weight)
        first = self.embeddings[self._tables[0].name].weight
        return sequence_output(self.feature_names(), kjt, rows, self.embedding_dim(), first.dtype, first.device,
                               self._need_indices)
