"""FusedEmbeddingBagCollection (TorchRec's ``torchrec.modules.fused_embedding_modules``): an unsharded
EmbeddingBagCollection whose optimizer runs inside backward, in one process with no process group.

Each table's weight gets a sparse gradient (the rows the batch touched); as soon as it is accumulated
a hook applies the optimizer's update to those rows only and drops the gradient, so no dense gradient
of a table is ever kept. The updates are the fused rules of :mod:`~shardwise.embedding.optim.rules`:
each applies its torch class's step to the touched rows (``torch.optim.SGD`` / ``Adagrad`` / ``Adam``
and :class:`~shardwise.embedding.RowWiseAdagrad`); ``Adam`` is ``torch.optim.SparseAdam``'s update.
``fused_optimizer()`` is a ``torch.optim.Optimizer`` over the weights whose ``param_groups`` the update
reads each time (an LR scheduler drives it); its ``step()`` does nothing, the update already ran.

Differences from TorchRec: no fbgemm TBE underneath (any ``embedding_dim``, and Adam works on CPU);
``location`` (UVM placement) is refused.

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

from ..collection.bag_collection import EmbeddingBagCollection
from ..collection.config import EmbeddingBagConfig
from ..optim.rules import STATE_DTYPE, resolve_optimizer

__all__ = ["FusedEmbeddingBagCollection", "FusedTablesOptimizer"]


class FusedTablesOptimizer(torch.optim.Optimizer):
    """The optimizer a :class:`FusedEmbeddingBagCollection` applies in backward (one param group; its
    hyper-parameters are read at every update). ``step()`` runs a closure if given and nothing else."""

    def __init__(self, weights: list, rule, hp: dict):
        super().__init__(weights, dict(hp))
        self._rule = rule
        fills = rule.init_values(hp)
        for w in weights:
            state = {"step": 0}
            for name, kind in rule.state_shapes.items():
                shape = w.shape if kind == "elem" else w.shape[:1]
                state[name] = torch.full(shape, float(fills[name]), dtype=STATE_DTYPE, device=w.device)
            self.state[w] = state

    @torch.no_grad()
    def step(self, closure=None):
        return None if closure is None else closure()

    @torch.no_grad()
    def apply_gradient(self, weight: torch.Tensor) -> None:
        """Update ``weight``'s touched rows from its sparse gradient, then drop the gradient."""
        grad, weight.grad = weight.grad, None
        if grad is None:
            return
        grad = grad.coalesce() if grad.is_sparse else grad.to_sparse().coalesce()
        state = self.state[weight]
        state["step"] += 1
        rows, values = grad.indices()[0], grad.values().to(weight.dtype)
        self._rule.update(weight.data, state, rows, values, self.param_groups[0])


class FusedEmbeddingBagCollection(EmbeddingBagCollection):
    """TorchRec's signature: ``FusedEmbeddingBagCollection(tables, optimizer_type, optimizer_kwargs,
    is_weighted=False, device=None, location=None)``; see the module docstring."""

    _sparse_grads = True

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
        rule, hp = resolve_optimizer(functools.partial(optimizer_type, **optimizer_kwargs))
        super().__init__(tables, is_weighted=is_weighted, device=device, init_seed=init_seed)
        if self.is_meta:
            raise ValueError("FusedEmbeddingBagCollection(device='meta'): it updates its own tables and needs "
                             "storage; build an EmbeddingBagCollection on meta and shard() it instead")
        self.optimizer_type, self.optimizer_kwargs = optimizer_type, dict(optimizer_kwargs)
        weights = [self.embedding_bags[t.name].weight for t in self._tables]
        self._optimizer = FusedTablesOptimizer(weights, rule, hp)
        for w in weights:
            w.register_post_accumulate_grad_hook(self._optimizer.apply_gradient)
            # what torch's apply_optimizer_in_backward records: shard()/DMP take the optimizer over, and
            # in_backward_optimizer_filter leaves these weights out of a dense optimizer
            w._optimizer_classes, w._optimizer_kwargs = [optimizer_type], [dict(optimizer_kwargs)]
            w._in_backward_optimizers = [self._optimizer]

    def fused_optimizer(self) -> FusedTablesOptimizer:
        return self._optimizer
