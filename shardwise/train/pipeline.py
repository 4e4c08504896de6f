"""A training pipeline for models with a sharded embedding collection (TorchRec's
``TrainPipelineSparseDist`` is the peer): while batch i computes, batch i+1 is already on the device,
checked, routed, and its ids are on the wire.

One ``progress(iterator)`` call trains one batch and returns what the step returns:

1. batch i+1 is taken from the iterator, moved to the device and its input dist started
   (``start_input_dist``: the checks, the routing and the header all-to-all, asynchronous);
2. batch i runs: its lookup uses the ids that were sent during the previous call, then the dense
   forward, the backward (the fused optimizer updates the shards) and the dense optimizer;
3. batch i+1's ids all-to-all is started, to travel while the next call fetches batch i+2.

The ids of a batch do not depend on the weights, so the losses and weights are those of the plain
loop, step for step. A reshard between two calls changes the layout under the prefetched batch: the
next call finishes what was in flight for it and routes it again (on every rank alike).

Example::

    pipe = TrainPipeline(model, optimizer)           # model(batch) -> (loss, output), like TorchRec
    it = iter(loader)
    while True:
        try:
            loss, output = pipe.progress(it)
        except StopIteration:
            break
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, Optional

import torch

from ..embedding.sharded_collection import ShardedEmbeddingBagCollection
from ..sparse import KeyedJaggedTensor

__all__ = ["TrainPipeline", "TrainPipelineSparseDist", "move_to_device", "find_kjt"]


def move_to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor and KeyedJaggedTensor on ``device`` (tuples, lists, dicts and
    dataclasses are walked; any other object with its own ``to(device, non_blocking)`` moves itself;
    anything already there is kept as it is, the same object)."""
    if isinstance(batch, KeyedJaggedTensor):
        return batch if batch.values().device == device else batch.to(device)
    if isinstance(batch, torch.Tensor):
        return batch if batch.device == device else batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):
        return type(batch)(move_to_device(x, device) for x in batch)
    if isinstance(batch, tuple):   # a namedtuple
        return type(batch)(*(move_to_device(x, device) for x in batch))
    if isinstance(batch, dict):
        return {k: move_to_device(v, device) for k, v in batch.items()}
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return dataclasses.replace(batch, **{f.name: move_to_device(getattr(batch, f.name), device)
                                             for f in dataclasses.fields(batch) if f.init})
    if callable(getattr(batch, "to", None)) and not isinstance(batch, type):   # TorchRec's Pipelineable batches
        return batch.to(device, non_blocking=True)
    return batch


def find_kjt(batch: Any) -> KeyedJaggedTensor:
    """The first KeyedJaggedTensor in ``batch`` (searched like :func:`move_to_device`)."""
    found = _find(batch)
    if found is None:
        raise ValueError(f"TrainPipeline: no KeyedJaggedTensor in the batch (a {type(batch).__name__}); pass "
                         f"kjt_of=lambda batch: ... to say which input the sharded collection looks up")
    return found


def _find(x: Any) -> Optional[KeyedJaggedTensor]:
    if isinstance(x, KeyedJaggedTensor):
        return x
    items = x.values() if isinstance(x, dict) else x if isinstance(x, (list, tuple)) else \
        [getattr(x, f.name) for f in dataclasses.fields(x)] if dataclasses.is_dataclass(x) else []
    for item in items:
        found = _find(item)
        if found is not None:
            return found
    return None


def _sharded_in(model) -> ShardedEmbeddingBagCollection:
    found = [m for m in model.modules() if isinstance(m, ShardedEmbeddingBagCollection)] \
        if isinstance(model, torch.nn.Module) else []
    if len(found) != 1:
        raise ValueError(f"TrainPipeline: the model holds {len(found)} sharded embedding collections, it needs "
                         f"exactly one; pass sharded=<the sharded collection> (one per pipeline)")
    return found[0]


class _Slot:
    """A batch on the device and its input dist in flight."""

    def __init__(self, batch, kjt, pending):
        self.batch, self.kjt, self.pending = batch, kjt, pending


class TrainPipeline:
    """Train a model whose sparse part is one sharded collection (a :class:`ShardedEmbeddingBagCollection`
    or its subclass ``ShardedEmbeddingCollection``), the next
    batch's input dist overlapping the current batch's compute.

    ``model(batch)`` returns ``(loss, output)``; each call of :meth:`progress` runs ``loss.backward()``
    and ``optimizer.step()`` (the dense optimizer; the sharded collection updates itself in backward)
    and returns ``(loss, output)``. ``step=fn`` replaces that: ``fn(batch)`` trains one batch its own
    way and its return value is passed through. ``sharded`` defaults to the one sharded collection in
    ``model``; ``kjt_of(batch)`` picks the KeyedJaggedTensor it looks up (default: the first one in the
    batch); batches are moved to the collection's device.

    Example:
        >>> import functools; from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig, row_wise, shard
        >>> from shardwise.sparse import KeyedJaggedTensor
        >>> sharded = shard(EmbeddingBagCollection([EmbeddingBagConfig(10, 4, "t", feature_names=["f"])]),
        ...                 {"t": row_wise()}, optimizer=functools.partial(torch.optim.SGD, lr=0.1))
        >>> top = torch.nn.Linear(4, 1)                  # the dense part
        >>> def model(batch):                            # (ids, labels) -> (loss, output)
        ...     out = top(sharded(batch[0]).values()).squeeze(1)
        ...     return torch.nn.functional.binary_cross_entropy_with_logits(out, batch[1]), out
        >>> it = iter([(KeyedJaggedTensor(["f"], torch.tensor([i, 9]), lengths=torch.tensor([1, 1])),
        ...             torch.tensor([1.0, 0.0])) for i in range(3)])
        >>> pipe = TrainPipeline(model, torch.optim.Adam(top.parameters()), sharded=sharded)   # model: no module
        >>> loss, out = pipe.progress(it)                # batch 0 trains while batch 1's ids travel
        >>> out.shape
        torch.Size([2])
    """

    def __init__(self, model=None, optimizer=None, *, sharded: Optional[ShardedEmbeddingBagCollection] = None,
                 kjt_of: Optional[Callable] = None, step: Optional[Callable] = None,
                 device: Optional[torch.device] = None):
        if step is None and model is None:
            raise ValueError("TrainPipeline needs model= (model(batch) -> (loss, output)) or step= (step(batch))")
        self.model, self.optimizer, self._step = model, optimizer, step
        self.sharded = sharded if sharded is not None else _sharded_in(model)
        if not isinstance(self.sharded, ShardedEmbeddingBagCollection):
            raise TypeError(f"TrainPipeline: sharded= must be a ShardedEmbeddingBagCollection or "
                            f"ShardedEmbeddingCollection, got "
                            f"{type(self.sharded).__name__}")
        self.kjt_of = kjt_of or find_kjt
        self.device = device if device is not None else self.sharded._topo.device
        self._next: Optional[_Slot] = None
        self._done = False

    def _fetch(self, it: Iterator) -> Optional[_Slot]:
        try:
            raw = next(it)
        except StopIteration:
            return None
        batch = move_to_device(raw, self.device)
        kjt = self.kjt_of(batch)
        return _Slot(batch, kjt, self.sharded.start_input_dist(kjt))

    def progress(self, it: Iterator):
        """Train the next batch of ``it`` (every rank calls it alike); raises StopIteration when ``it``
        has no batch left."""
        if self._next is None:
            if not self._done:   # cold start (or a restart after the data ran out)
                self._next = self._fetch(it)
            if self._next is None:
                self._done = False
                raise StopIteration
        cur = self._next
        if cur.pending.stale:   # a reshard since the batch was routed: route it again
            cur.pending.drop()
            cur.pending = self.sharded.start_input_dist(cur.kjt)
        self._next = self._fetch(it)
        self._done = self._next is None
        result = self._run(cur)
        if self._next is not None:
            self._next.pending.advance()
        return result

    def _run(self, cur: _Slot):
        self.sharded._prefetched = cur.pending
        try:
            result = self._train(cur.batch)
        finally:
            unused = self.sharded._prefetched is cur.pending
            self.sharded._prefetched = None
            if unused:
                cur.pending.drop()
        if unused:
            raise ValueError("TrainPipeline: the step never looked up the batch's KeyedJaggedTensor with the sharded "
                             "collection (it must call sharded(kjt) on the very object kjt_of(batch) returns)")
        return result

    def _train(self, batch):
        if self._step is not None:
            return self._step(batch)
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        loss, output = self.model(batch)
        loss.backward()
        if self.optimizer is not None:
            self.optimizer.step()
        return loss.detach(), output

    def drain(self) -> None:
        """Finish and forget the prefetched batch (the iterator has moved past it): call before
        abandoning a pipeline in the middle of its data. Collective."""
        if self._next is not None:
            self._next.pending.drop()
        self._next, self._done = None, False


_NO_EFFECT = {"pipeline_postproc": False, "dmp_collection_sync_interval_batches": 1,
              "enqueue_batch_after_forward": False, "enable_inplace_copy_batch": False,
              "free_features_storage_early": False, "clear_data_dist_inputs": False}


class TrainPipelineSparseDist(TrainPipeline):
    """TorchRec's ``TrainPipelineSparseDist(model, optimizer, device)``: the same overlap as
    :class:`TrainPipeline`, TorchRec's contract. ``model(batch)`` (or ``custom_model_fwd(batch)``)
    returns ``(losses, output)``; while ``model.training``, each :meth:`progress` call runs
    ``optimizer.zero_grad()``, the forward, ``losses.sum(0).backward()`` and ``optimizer.step()``; in
    eval mode the forward alone. :meth:`progress` returns ``output`` (for ``DLRMTrain``:
    ``(loss, logits, labels)``), where :class:`TrainPipeline` returns ``(loss, output)``.

    Differences: ``apply_jit=True`` (TorchScript) is refused; ``execute_all_batches=False`` is refused
    (every batch is trained); ``context_type`` and TorchRec's memory and scheduling switches
    (``enqueue_batch_after_forward``, ``enable_inplace_copy_batch``, ...) are accepted and have no
    effect here: the batch order and values are the same either way.

    Example:
        >>> import functools
        >>> from shardwise.datasets import RandomRecDataset
        >>> from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig, row_wise, shard
        >>> from shardwise.models.dlrm import DLRM, DLRMTrain
        >>> ebc = shard(EmbeddingBagCollection([EmbeddingBagConfig(100, 4, "t", feature_names=["f"])]),
        ...             {"t": row_wise()}, optimizer=functools.partial(torch.optim.SGD, lr=0.1))
        >>> model = DLRMTrain(DLRM(ebc, dense_in_features=3, dense_arch_layer_sizes=[4], over_arch_layer_sizes=[4, 1]))
        >>> dense = [p for n, p in model.named_parameters() if "sparse_arch" not in n]
        >>> pipe = TrainPipelineSparseDist(model, torch.optim.SGD(dense, lr=0.1), torch.device("cpu"))
        >>> it = iter(RandomRecDataset(["f"], batch_size=2, num_dense=3, manual_seed=0, num_batches=2))
        >>> loss, logits, labels = pipe.progress(it)
        >>> logits.shape
        torch.Size([2])
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device,
                 execute_all_batches: bool = True, apply_jit: bool = False, context_type=None,
                 pipeline_postproc: bool = False, custom_model_fwd: Optional[Callable] = None, **switches):
        unknown = sorted(set(switches) - set(_NO_EFFECT))
        if unknown:
            raise TypeError(f"TrainPipelineSparseDist: unknown arguments {unknown}; TorchRec's are "
                            f"execute_all_batches, apply_jit, context_type, custom_model_fwd and {sorted(_NO_EFFECT)}")
        if apply_jit:
            raise ValueError("TrainPipelineSparseDist: apply_jit=True needs TorchScript, which shardwise does not "
                             "support; leave it False (torch.compile the dense part instead)")
        if not execute_all_batches:
            raise ValueError("TrainPipelineSparseDist: execute_all_batches=False (drop the last batches) is not "
                             "supported; every batch is trained")
        if not isinstance(device, torch.device):
            device = torch.device(device)
        super().__init__(model, optimizer, device=device)
        self._model_fwd = custom_model_fwd if custom_model_fwd is not None else model

    def _train(self, batch):
        training = self.model.training
        if training and self.optimizer is not None:
            self.optimizer.zero_grad()
        losses, output = self._model_fwd(batch)
        if training:
            torch.sum(losses, dim=0).backward()
            if self.optimizer is not None:
                self.optimizer.step()
        return output
