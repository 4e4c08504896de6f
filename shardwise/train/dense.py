"""Data-parallel steps for the dense part of the DLRM: compile-mode ``replicate`` or eager DDP.

``step`` takes this rank's pooled embeddings as a plain input and returns the gradient of the
rank's loss with respect to them; ``train`` runs the whole step, the embeddings' backward included.
The compiled step hands that gradient to the embeddings' backward afterwards (a traced graph has a
plain input); DDP runs one backward through both, so its gradient all-reduce (on a group of its own,
never interleaved with the embedding group's collectives) overlaps the embeddings' backward
all-to-all and fused update. Both give the sparse side exactly the same gradient.

Example:
    >>> from shardwise.tensor import init_device_mesh; from shardwise.train.model import DLRMDense
    >>> arch = DLRMDense(num_sparse=2, dim=4, bottom=(8,), top=(8,))
    >>> runner = make_dense_runner("ddp", arch, lr=1e-3, mesh=init_device_mesh("cpu", (1,)))
    >>> dense, pooled, labels = torch.ones(3, 13), torch.ones(3, 8), torch.tensor([1.0, 0.0, 1.0])
    >>> loss, logits, grad_pooled = runner.step(dense, pooled, labels)
    >>> logits.shape, grad_pooled.shape               # grad_pooled: what the embeddings' backward takes
    (torch.Size([3]), torch.Size([3, 8]))
    >>> loss, logits = runner.train(dense, pooled.requires_grad_(), labels)   # and the embeddings' backward
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.func import functional_call

from .model import DLRMDense

__all__ = ["make_dense_runner", "DDPRunner", "CompiledRunner"]


def _local(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor behind a replicated parameter/state (shardwise DTensor views in compile mode)."""
    return t.to_local() if hasattr(t, "to_local") else t.detach()


class _Runner:
    def __init__(self, arch: DLRMDense, lr: float, **adam):
        self.arch = arch
        self.optimizer = torch.optim.Adam(arch.parameters(), lr=lr, **adam)

    def state(self) -> dict:
        """Plain tensors: ``{"params": {name: t}, "opt": {name: {state name: t}}}``."""
        params = dict(self.arch.named_parameters())
        by_id = {id(p): n for n, p in params.items()}
        opt = {}
        for p, st in self.optimizer.state.items():
            opt[by_id[id(p)]] = {k: _local(v) if isinstance(v, torch.Tensor) else torch.tensor(float(v))
                                 for k, v in st.items()}
        return {"params": {n: _local(p) for n, p in params.items()}, "opt": opt}

    def predict(self, dense: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            params = {n: _local(p) for n, p in self.arch.named_parameters()}
            return functional_call(self.arch, params, (dense, pooled))


class DDPRunner(_Runner):
    """Eager DDP over its own process group (so its bucketed all-reduces stay off the embedding group)."""

    def __init__(self, arch: DLRMDense, lr: float, mesh):
        # fused Adam: one kernel per parameter instead of a dozen ops each (a third of the default
        # implementation's time for this arch on CPU, same values within float rounding)
        super().__init__(arch, lr, fused=True)
        from torch.nn.parallel import DistributedDataParallel as DDP

        self._group = dist.new_group(backend=dist.get_backend())
        dev = None if mesh.device_type == "cpu" else [torch.device(mesh.device_type, torch.cuda.current_device())]
        # The arch's only buffer (pair_index) is a constant every rank builds alike, so DDP's default
        # broadcast of buffers before every forward would be one collective per step for nothing.
        self.ddp = DDP(arch, process_group=self._group, device_ids=dev, forward_sync_buffers=False)

    def step(self, dense, pooled, labels):
        leaf = pooled.detach().requires_grad_(True)
        loss, logits = self.train(dense, leaf, labels)
        return loss, logits, leaf.grad

    def train(self, dense, pooled, labels):
        """One step through the dense part and on into the sharded embeddings: ``pooled`` keeps its
        autograd history, so one backward runs both, and DDP's gradient all-reduce (on its own group)
        is on the wire while the embeddings' backward all-to-all and fused update run. The
        embeddings receive exactly the gradient :meth:`step` would return."""
        logits = self.ddp(dense, pooled)
        loss = F.binary_cross_entropy_with_logits(logits, labels)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach(), logits.detach()

    def load(self, state: dict) -> None:
        _load_plain(self.arch, self.optimizer, state)


def _compiled_body(model, optimizer, dense, pooled, labels):
    pooled = pooled.detach().requires_grad_(True)
    logits = model(dense, pooled)
    loss = F.binary_cross_entropy_with_logits(logits, labels)
    # The compiled step differentiates only parameters in loss.backward(); the input gradient the
    # embeddings need is taken explicitly first (the graph keeps the shared forward once).
    (grad_pooled,) = torch.autograd.grad(loss, [pooled], retain_graph=True)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.detach(), logits.detach(), grad_pooled


class CompiledRunner(_Runner):
    """``shardwise.compile`` with ``DataParallel(style="replicate")``; each rank passes its own batch
    whole (``input_batch_dim=None``), the traced graph all-reduces and averages the gradients."""

    def __init__(self, arch: DLRMDense, lr: float, mesh):
        super().__init__(arch, lr)
        from ..compile import DataParallel, compile as sw_compile

        mode = DataParallel(mesh, style="replicate", input_batch_dim=(None, None, None))
        self._step = sw_compile(parallel_mode=mode)(_compiled_body)

    def step(self, dense, pooled, labels):
        return self._step(self.arch, self.optimizer, dense, pooled.detach(), labels)

    def train(self, dense, pooled, labels):
        """The compiled dense step, then the embeddings' backward from the gradient it returns."""
        loss, logits, grad_pooled = self.step(dense, pooled, labels)
        pooled.backward(grad_pooled)
        return loss, logits

    def load(self, state: dict) -> None:
        if self._step.state is not None:
            raise RuntimeError("load the dense state before the first compiled step (it owns the storage after)")
        _load_plain(self.arch, self.optimizer, state)


def _load_plain(arch, optimizer, state: dict) -> None:
    params = dict(arch.named_parameters())
    with torch.no_grad():
        for n, t in state["params"].items():
            params[n].copy_(t)
    for n, st in state["opt"].items():
        optimizer.state[params[n]] = {k: v.clone() for k, v in st.items()}


def make_dense_runner(kind: str, arch: DLRMDense, lr: float, mesh):
    """``"compile"`` -> :class:`CompiledRunner`, ``"ddp"`` -> :class:`DDPRunner`."""
    if kind == "compile":
        return CompiledRunner(arch, lr, mesh)
    if kind == "ddp":
        return DDPRunner(arch, lr, mesh)
    raise ValueError(f"dense_parallel={kind!r} must be 'compile' or 'ddp'")
