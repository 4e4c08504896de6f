"""RowWiseAdagrad: Adagrad with one accumulator per embedding row (TorchRec's ``torchrec.optim.RowWiseAdagrad``)."""

from __future__ import annotations

import torch

__all__ = ["RowWiseAdagrad"]


class RowWiseAdagrad(torch.optim.Optimizer):
    """Adagrad with one accumulator per embedding row (the mean of the row's squared gradient):
    ``acc[r] += mean(g[r]**2); w[r] -= lr * g[r] / (sqrt(acc[r]) + eps)``.

    Saves ``dim``x the optimizer memory of Adagrad. Works densely on ordinary 2-D parameters (the
    reference its fused sharded version is tested against); passed to ``shard(..., optimizer=)`` or
    ``apply_optimizer_in_backward`` it becomes the embeddings' fused update.

    Example:
        >>> import functools
        >>> opt = functools.partial(RowWiseAdagrad, lr=0.1)   # pass to shard(..., optimizer=opt)
        >>> w = torch.nn.Parameter(torch.ones(3, 2))
        >>> w.grad = torch.tensor([[1.0, 1.0], [0.0, 0.0], [2.0, 2.0]])
        >>> opt([w]).step(); w.detach()[:, 0]   # each row moves by lr: g / sqrt(its mean g**2)
        tensor([0.9000, 1.0000, 0.9000])
    """

    def __init__(self, params, lr: float = 1e-2, lr_decay: float = 0.0, weight_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0, eps: float = 1e-10, *, maximize: bool = False, **unused):
        # TorchRec's signature; the update here (and fused) has no decay terms, so those must stay off
        if lr <= 0 or eps < 0 or initial_accumulator_value < 0:
            raise ValueError(f"RowWiseAdagrad: lr={lr} must be > 0, eps={eps} and initial_accumulator_value="
                             f"{initial_accumulator_value} >= 0")
        off = {k: v for k, v in (("lr_decay", lr_decay), ("weight_decay", weight_decay), ("maximize", maximize)) if v}
        if off or unused:
            raise ValueError(f"RowWiseAdagrad: {({**off, **unused})} not supported (the row-wise update has no "
                             f"lr_decay, weight_decay or maximize and takes no FBGEMM-only settings); leave them out")
        super().__init__(params, dict(lr=lr, eps=eps, initial_accumulator_value=initial_accumulator_value))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.dim() != 2:
                    raise ValueError(f"RowWiseAdagrad needs 2-D parameters (rows x dim), got shape {tuple(p.shape)}")
                state = self.state[p]
                if not state:
                    state["sum"] = torch.full((p.shape[0],), float(group["initial_accumulator_value"]),
                                              dtype=p.dtype, device=p.device)
                grad = p.grad.to_dense() if p.grad.is_sparse else p.grad
                state["sum"].add_(grad.pow(2).mean(dim=1))
                p.sub_(group["lr"] * grad / (state["sum"].sqrt() + group["eps"]).unsqueeze(1))
        return loss
