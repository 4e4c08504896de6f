"""EmbeddingBagCollection: the unsharded module (ground truth for every sharded layout)."""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ...sparse import KeyedJaggedTensor, KeyedTensor
from .config import EmbeddingBagConfig, check_tables
from .init import fill_rows
from .variable_batch import split_variable_batch

__all__ = ["EmbeddingBagCollection", "pool_bags"]


def pool_bags(weight: torch.Tensor, values: torch.Tensor, offsets: torch.Tensor,
              per_sample_weights: Optional[torch.Tensor], mean: bool, sparse: bool = False) -> torch.Tensor:
    """Pool bags of rows of ``weight``; mean divides the (weighted) sum by the bag's id count.

    ``offsets`` has one more entry than there are bags. Dividing a weighted sum by the count (not by
    the weight total) is the convention sharded layouts can reproduce from partial sums.
    """
    pooled = F.embedding_bag(values, weight, offsets, mode="sum", per_sample_weights=per_sample_weights,
                             include_last_offset=True, sparse=sparse)
    if mean:
        counts = (offsets[1:] - offsets[:-1]).clamp(min=1).to(pooled.dtype)
        pooled = pooled / counts.unsqueeze(1)
    return pooled


def check_features(kjt: KeyedJaggedTensor, known: Sequence[str], is_weighted: bool) -> None:
    if not isinstance(kjt, KeyedJaggedTensor):
        raise TypeError(f"forward expects a KeyedJaggedTensor, got {type(kjt).__name__}")
    values = kjt.values()
    if values.dim() != 1:
        raise ValueError(f"ids of features {kjt.keys()} have shape {tuple(values.shape)}, but a lookup needs one "
                         f"id per value (1-D values); flatten them and give lengths per bag")
    if values.numel() and (values.dtype.is_floating_point or values.dtype.is_complex or values.dtype == torch.bool):
        raise TypeError(f"ids of features {kjt.keys()} have dtype {values.dtype}, but a lookup needs integer ids; "
                        f"cast the KeyedJaggedTensor's values with .long() before the forward")
    known_set = set(known)   # once, not per key
    unknown = [k for k in kjt.keys() if k not in known_set]
    if unknown:
        raise ValueError(f"features {unknown} are not looked up by any table (known: {list(known)}); "
                         f"drop them from the batch or add them to an EmbeddingBagConfig")
    if is_weighted and kjt.weights_or_none() is None:
        raise ValueError("this collection is weighted (is_weighted=True) but the batch has no weights; "
                         "pass weights= to the KeyedJaggedTensor")
    if not is_weighted and kjt.weights_or_none() is not None:
        # silently ignoring them would pool unweighted sums the caller did not ask for
        raise ValueError("this collection is not weighted (is_weighted=False) but the batch has weights, which "
                         "would be ignored; build the collection with is_weighted=True or drop weights= from the "
                         "KeyedJaggedTensor")


class TableBags(nn.Module):
    """The tables' ``nn.EmbeddingBag``s by name; any table name works (``items``, ``keys``, ``type``,
    ``training``, ...), where ``nn.ModuleDict`` refuses names of its own attributes. State-dict keys
    are ``<name>.weight``; look a table up with ``bags[name]``.

    Example:
        >>> bags = TableBags({"items": nn.EmbeddingBag(4, 2)})
        >>> bags["items"].weight.shape, list(bags.state_dict())
        (torch.Size([4, 2]), ['items.weight'])
    """

    def __init__(self, bags: dict):
        super().__init__()
        for name, bag in bags.items():
            # straight into _modules: add_module would refuse names that are attributes of a Module
            self._modules[name] = bag

    def __getitem__(self, name: str) -> nn.Module:
        return self._modules[name]

    def __contains__(self, name: str) -> bool:
        return name in self._modules

    def __iter__(self):
        return iter(self._modules)

    def __len__(self) -> int:
        return len(self._modules)


class EmbeddingBagCollection(nn.Module):
    """A set of embedding tables, each pooling the bags of its features.

    Initial values are a pure function of (``init_seed``, table name, row): see
    :mod:`~shardwise.embedding.collection.init`. ``device="meta"`` holds no storage: :func:`shard`
    then materialises each rank's own shards only, with the same values.

    ``forward(kjt)`` returns a KeyedTensor with one key per feature, in config order (tables in the
    given order, then each table's ``feature_names``); a feature absent from the batch pools to zeros.

    Example:
        >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig(100, 8, "t", feature_names=["f"])])
        >>> kt = ebc(KeyedJaggedTensor(["f"], torch.tensor([1, 2]), lengths=torch.tensor([2])))
        >>> kt.values().shape
        torch.Size([1, 8])
    """

    _sparse_grads = False   # sparse weight gradients (the touched rows); FusedEmbeddingBagCollection's

    def __init__(self, tables: Sequence[EmbeddingBagConfig], is_weighted: bool = False,
                 device: Optional[torch.device] = None, init_seed: int = 0):
        super().__init__()
        self._tables = check_tables(tables)
        self._is_weighted = bool(is_weighted)
        if not isinstance(init_seed, int) or isinstance(init_seed, bool):
            raise TypeError(f"init_seed={init_seed!r} must be an int")
        self.init_seed = init_seed
        bags = {}
        for t in self._tables:
            bag = nn.EmbeddingBag(t.num_embeddings, t.embedding_dim, mode="sum", device=device,
                                  _weight=torch.empty(t.num_embeddings, t.embedding_dim, device=device,
                                                     dtype=t.data_type.torch_dtype))
            if bag.weight.device.type != "meta":   # meta: no storage; shard() fills each rank's shards
                fill_rows(bag.weight.data, t, init_seed, 0, 0)
                if t.init_fn is not None:
                    t.init_fn(bag.weight.data)
            bags[t.name] = bag
        self.embedding_bags = TableBags(bags)

    @property
    def is_meta(self) -> bool:
        """True when the tables hold no storage (built with ``device="meta"``)."""
        return any(self.embedding_bags[t.name].weight.device.type == "meta" for t in self._tables)

    @property
    def tables(self) -> list[EmbeddingBagConfig]:
        return list(self._tables)

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        """The table configs (TorchRec's name for :attr:`tables`)."""
        return list(self._tables)

    @property
    def is_weighted(self) -> bool:
        return self._is_weighted

    def feature_names(self) -> list[str]:
        return [f for t in self._tables for f in t.feature_names]

    def forward(self, kjt: KeyedJaggedTensor) -> KeyedTensor:
        check_features(kjt, self.feature_names(), self._is_weighted)
        kjt, vbe = split_variable_batch(kjt)   # VBE: pool the deduplicated bags, then expand
        present = set(kjt.keys())
        batch = kjt.stride()
        outs, dims = [], []
        for t in self._tables:
            weight = self.embedding_bags[t.name].weight
            for f in t.feature_names:
                dims.append(t.embedding_dim)
                if f not in present:
                    outs.append(weight.new_zeros(batch, t.embedding_dim))
                    continue
                jt = kjt[f]
                psw = jt.weights_or_none() if self._is_weighted else None
                outs.append(pool_bags(weight, jt.values(), jt.offsets(), psw, t.pooling == "mean",
                                      self._sparse_grads))
        if vbe is not None:
            outs = [vbe.expand(f, o) for f, o in zip(self.feature_names(), outs)]
        return KeyedTensor(self.feature_names(), dims, torch.cat(outs, dim=1))
