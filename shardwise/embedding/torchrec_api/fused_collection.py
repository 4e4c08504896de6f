"""FusedEmbeddingBagCollection (TorchRec's ``torchrec.modules.fused_embedding_modules``): an unsharded
EmbeddingBagCollection whose optimizer runs inside backward, in one process with no process group.

The tables are stacked into one buffer per (dtype, embedding width) (see
:mod:`~shardwise.embedding.collection.stacked`): a forward is one ``embedding_bag`` call per buffer over
the batch as it comes, and its backward applies the optimizer to the touched rows of the whole buffer at
once, so many small tables cost what one table of their total size costs. No weight gradient is ever
kept. Each ``embedding_bags[name].weight`` is a view of its rows in the buffer (read it, copy into it,
``load_state_dict`` it). The updates are the fused rules of :mod:`~shardwise.embedding.optim.rules`:
each applies its torch class's step to the touched rows (``torch.optim.SGD`` / ``Adagrad`` / ``Adam``
and :class:`~shardwise.embedding.RowWiseAdagrad`); ``Adam`` is ``torch.optim.SparseAdam``'s update.
``fused_optimizer()`` is a ``torch.optim.Optimizer`` over the weights whose ``param_groups`` the update
reads each time (an LR scheduler drives it); its ``step()`` does nothing, the update already ran.

Differences from TorchRec: no fbgemm TBE underneath (any ``embedding_dim``, and Adam works on CPU);
``location`` (UVM placement) is refused. As with TorchRec's kernel (one step counter per batched
lookup), the optimizer's step counter (Adam's bias correction, Adagrad's ``lr_decay``) counts the
backward passes of a buffer, including those where one of its tables had no ids; torch's SparseAdam
counts per table.

Example:
    >>> from shardwise.embedding import EmbeddingBagConfig
    >>> from shardwise.sparse import KeyedJaggedTensor
    >>> febc = FusedEmbeddingBagCollection([EmbeddingBagConfig(10, 4, "t", feature_names=["f"])],
    ...                                    optimizer_type=torch.optim.SGD, optimizer_kwargs={"lr": 0.5})
    >>> kjt = KeyedJaggedTensor(["f"], torch.tensor([1, 2]), lengths=torch.tensor([2]))
    >>> before = febc.embedding_bags["t"].weight.detach().clone()
    >>> febc(kjt).values().sum().backward()               # SGD ran here, on rows 1 and 2
    >>> (febc.embedding_bags["t"].weight.detach() - before).sum(dim=1).tolist()[:3]
    [0.0, -2.0, -2.0]
"""

from __future__ import annotations

import functools
from typing import Any, Optional, Sequence

import torch

from ...sparse import KeyedJaggedTensor, KeyedTensor
from ..collection.bag_collection import EmbeddingBagCollection, check_features
from ..collection.config import EmbeddingBagConfig
from ..collection.stacked import StackedTables
from ..collection.variable_batch import split_variable_batch
from ..optim.rules import resolve_optimizer

__all__ = ["FusedEmbeddingBagCollection", "FusedTablesOptimizer"]


class FusedTablesOptimizer(torch.optim.Optimizer):
    """The optimizer a :class:`FusedEmbeddingBagCollection` applies in backward (one param group; its
    hyper-parameters are read at every update). ``step()`` runs a closure if given and nothing else.
    ``state[weight]`` holds views of the table's rows in the stacked optimizer state (and ``step``);
    ``load_state_dict`` copies into them."""

    def __init__(self, weights: list, names: list, stack: StackedTables, hp: dict):
        super().__init__(weights, dict(hp))
        self._stack, self._names = stack, list(names)
        self._slot_weights: dict = {}
        for w, name in zip(weights, names):
            self._slot_weights.setdefault(stack.slot_of(name), []).append(w)
            self.state[w] = self._views(name)

    def _views(self, name: str) -> dict:
        slot = self._stack.slot_of(name)
        state = {"step": self._stack.step_of(slot)}
        store = self._stack._slots[slot].store
        for what in store.rule.state_shapes if store.rule is not None else ():
            state[what] = self._stack.table_view(name, what)
        return state

    def synced(self, slot: int) -> None:
        """After an update of ``slot``: its tables' ``step`` as the stacked update counted it."""
        step = self._stack.step_of(slot)
        for w in self._slot_weights[slot]:
            self.state[w]["step"] = step

    @torch.no_grad()
    def step(self, closure=None):
        return None if closure is None else closure()

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's ``load_state_dict`` (hyper-parameters, state), then the state copied into the stacked
        buffers the update uses; a buffer's step counter becomes the largest of its tables'."""
        super().load_state_dict(state_dict)
        steps: dict = {}
        for w, name in zip(self.param_groups[0]["params"], self._names):
            loaded, views = self.state[w], self._views(name)
            for what, view in views.items():
                if what != "step" and what in loaded:
                    view.copy_(loaded[what])
            slot = self._stack.slot_of(name)
            steps[slot] = max(steps.get(slot, 0), int(loaded.get("step", 0)))
            self.state[w] = views
        for slot, step in steps.items():
            self._stack.set_step(slot, step)
            self.synced(slot)
        self._stack.hp = self.param_groups[0]


class FusedEmbeddingBagCollection(EmbeddingBagCollection):
    """TorchRec's signature: ``FusedEmbeddingBagCollection(tables, optimizer_type, optimizer_kwargs,
    is_weighted=False, device=None, location=None)``; see the module docstring."""

    def __init__(self, tables: Sequence[EmbeddingBagConfig], optimizer_type: type, optimizer_kwargs: dict,
                 is_weighted: bool = False, device: Optional[torch.device] = None, location: Any = None,
                 init_seed: int = 0):
        if location is not None:
            raise ValueError(f"FusedEmbeddingBagCollection(location={location!r}): UVM / host-mapped placement "
                             f"needs fbgemm's CUDA kernels, which shardwise does not use; leave location=None "
                             f"(tables live on `device`), or shard the tables over more ranks")
        if not isinstance(optimizer_kwargs, dict):
            raise TypeError(f"FusedEmbeddingBagCollection: optimizer_kwargs must be a dict, e.g. {{'lr': 0.1}}, "
                            f"got {optimizer_kwargs!r}")
        if device is not None and torch.device(device).type == "meta":
            raise ValueError("FusedEmbeddingBagCollection(device='meta'): it updates its own tables and needs "
                             "storage; build an EmbeddingBagCollection on meta and shard() it instead")
        rule, hp = resolve_optimizer(functools.partial(optimizer_type, **optimizer_kwargs))
        # the tables' storage is the stacked buffers: built on meta here, then each weight becomes a view
        super().__init__(tables, is_weighted=is_weighted, device="meta", init_seed=init_seed)
        self._stack = StackedTables(self._tables, init_seed, device if device is not None else "cpu", rule, hp)
        self.optimizer_type, self.optimizer_kwargs = optimizer_type, dict(optimizer_kwargs)
        names = [t.name for t in self._tables]
        for name in names:
            self.embedding_bags[name].weight = torch.nn.Parameter(self._stack.table_view(name))
        weights = [self.embedding_bags[n].weight for n in names]
        self._ptrs = [w.data_ptr() for w in weights]
        self._optimizer = FusedTablesOptimizer(weights, names, self._stack, hp)
        self._stack.hp = self._optimizer.param_groups[0]   # what an LR scheduler changes
        self._stack.on_update = self._optimizer.synced
        # the leaf every lookup hangs on, so that backward reaches the stacked update
        self._anchor = torch.zeros((), device=weights[0].device, requires_grad=True)
        for w in weights:
            # what torch's apply_optimizer_in_backward records: shard()/DMP take the optimizer over, and
            # in_backward_optimizer_filter leaves these weights out of a dense optimizer
            w._optimizer_classes, w._optimizer_kwargs = [optimizer_type], [dict(optimizer_kwargs)]
            w._in_backward_optimizers = [self._optimizer]

    def fused_optimizer(self) -> FusedTablesOptimizer:
        return self._optimizer

    def forward(self, kjt: KeyedJaggedTensor) -> KeyedTensor:
        check_features(kjt, self.feature_names(), self._is_weighted)
        self._check_storage()
        kjt, vbe = split_variable_batch(kjt)   # VBE: pool the deduplicated bags, then expand
        features = self.feature_names()
        dims = [t.embedding_dim for t in self._tables for _ in t.feature_names]
        if vbe is None:
            return KeyedTensor(features, dims, self._stack.lookup(kjt, self._anchor, self._is_weighted))
        pooled = self._stack.lookup(kjt, self._anchor, self._is_weighted, per_feature=True)
        return KeyedTensor(features, dims, torch.cat([vbe.expand(f, pooled[f]) for f in features], dim=1))

    def _check_storage(self) -> None:
        # a weight replaced (load_state_dict(assign=True), weight.data = ...) is copied back into its
        # rows and viewed again: the lookup reads the stacked buffers only
        grad = torch.is_grad_enabled()
        bags = self.embedding_bags._modules
        for t, ptr in zip(self._tables, self._ptrs):
            w = bags[t.name]._parameters["weight"]
            if w.data_ptr() != ptr or w.shape != (t.num_embeddings, t.embedding_dim):
                view = self._stack.table_view(t.name)
                with torch.no_grad():
                    view.copy_(w.detach())
                w.data = view
            if grad and not w.requires_grad:
                raise ValueError(f"FusedEmbeddingBagCollection: table {t.name!r} has requires_grad=False, but the "
                                 f"fused update trains every table it looks up; keep frozen tables in a plain "
                                 f"EmbeddingBagCollection")
