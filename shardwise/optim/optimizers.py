"""``in_backward_optimizer_filter`` at TorchRec's path (``torchrec.optim.optimizers``): split a model's
parameters into those an optimizer runs on in backward (fused embedding tables, torch's
``apply_optimizer_in_backward``) and the rest, for a dense optimizer."""

from __future__ import annotations

from typing import Iterator

__all__ = ["in_backward_optimizer_filter"]


def in_backward_optimizer_filter(named_parameters: Iterator, include: bool = False) -> Iterator:
    """The ``(name, parameter)`` pairs without an optimizer applied in backward (``include=True``:
    only those with one) -- what a dense optimizer should get from ``model.named_parameters()``
    (TorchRec's).

    Example:
        >>> import torch
        >>> from torch.distributed.optim import _apply_optimizer_in_backward
        >>> lin = torch.nn.Linear(2, 1)
        >>> _apply_optimizer_in_backward(torch.optim.SGD, [lin.bias], {"lr": 0.1})
        >>> [n for n, _ in in_backward_optimizer_filter(lin.named_parameters())]
        ['weight']
    """
    for name, param in named_parameters:
        if hasattr(param, "_in_backward_optimizers") == include:
            yield name, param
