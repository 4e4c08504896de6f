"""Fused SGD straight from a pooled lookup's occurrences: no grouping of the ids by row.

SGD's update is linear in the gradient, so ``w[row] -= lr * sum of the row's occurrence gradients``
equals one ``w[id] -= lr * weight * grad[bag]`` per occurrence, added in turn. The other rules need each
row's summed gradient first (their state is not linear in it), which takes a sort of the ids by row:
on CPU torch's comparison sort plus the per-row sums cost more than the update itself (~13 of ~20 ms
a batch on 100 tables of 1024 x 64, 206k ids). Compiled by inductor, the per-occurrence form is one
loop that reads each occurrence's bag gradient and adds it into the weight row in place.

Where numba is installed, the loop is numba's (``native_rows.native_occurrence_sgd``: it walks the
bags' offsets directly, no bag index per occurrence, and compiles in about a second instead of
inductor's several); the arithmetic is the same, bit for bit.
The loop runs on one thread (inductor option ``cpp.threads=1``, for this kernel only; numba's is
serial): with several, the adds to a row shared by two threads' occurrences would land in a varying
order, and a run would not repeat bit for bit. Rounding differs from the grouped update's by the order of the
sums (``w - lr*g1 - lr*g2`` against ``w - lr*(g1 + g2)``), about an ulp per duplicate.

Example:
    >>> import torch
    >>> sgd = OccurrenceSGD()
    >>> w = torch.zeros(3, 2)
    >>> sgd.eager(w, torch.tensor([2, 2, 0]), torch.tensor([0, 3]), None, torch.ones(1, 2), -0.5)   # lr 0.5
    >>> w[:, 0].tolist()
    [-0.5, 0.0, -1.0]
"""

from __future__ import annotations

from typing import Optional

import torch

from .native_rows import native_occurrence_sgd
from .row_update import COMPILE_MIN_ELEMENTS, compiles_on_scratch

__all__ = ["OccurrenceSGD", "bag_of_occurrences"]


def bag_of_occurrences(offsets: torch.Tensor, n: int) -> torch.Tensor:
    """The bag of each of ``n`` ids given bag ``offsets`` (with the last offset): a running count of the
    bag ends (repeat_interleave over many short bags costs several times more on CPU)."""
    ends = torch.zeros(n + 1, dtype=torch.int64, device=offsets.device)
    inner = offsets[1:-1]
    ends.index_add_(0, inner, torch.ones(inner.shape, dtype=torch.int64, device=offsets.device))
    return torch.cumsum(ends[:n], 0)


def _scatter_kernel(weight, ids, bag, grad, coeff):
    weight.index_put_((ids,), grad[bag] * coeff[0], accumulate=True)


def _scatter_weighted_kernel(weight, ids, bag, psw, grad, coeff):
    weight.index_put_((ids,), grad[bag] * (psw * coeff[0]).unsqueeze(1), accumulate=True)


class OccurrenceSGD:
    """SGD's update of a pooled lookup's rows from its occurrences (see the module docstring).

    ``applies(...)`` says whether a call takes this path (float32 weights and gradients on CPU, at
    least :data:`~shardwise.embedding.optim.row_update.COMPILE_MIN_ELEMENTS` occurrence elements, the
    kernel compiled); it depends on the call's shapes only. If inductor cannot build the kernel, a
    warning says so once and ``applies`` is False from then on (the caller's grouped update runs).
    """

    def __init__(self, min_elements: int = COMPILE_MIN_ELEMENTS):
        self.min_elements = min_elements
        self._kernels: dict[bool, object] = {}
        self._failed = False
        self.native = False   # numba's loop, looked up at the first call (None: numba is not installed)

    def applies(self, weight: torch.Tensor, ids: torch.Tensor, grad: torch.Tensor, weighted: bool) -> bool:
        if (self._failed or ids.device.type != "cpu" or weight.dtype != torch.float32
                or grad.dtype != torch.float32 or ids.numel() * weight.shape[1] < self.min_elements
                or torch.compiler.is_compiling()):
            return False
        if weight.is_contiguous() and self._native() is not None:
            return True
        return self._kernel(weighted) is not None

    def __call__(self, weight, ids, offsets, psw: Optional[torch.Tensor], grad, alpha: float) -> None:
        """``weight[ids[i]] += alpha * psw[i] * grad[bag of i]`` for every occurrence ``i`` (compiled)."""
        native = self._native() if weight.is_contiguous() else None
        if native is not None:
            native(weight, ids, offsets, psw, grad, alpha)
            return
        bag = bag_of_occurrences(offsets, ids.numel())
        coeff = torch.tensor([alpha], dtype=torch.float32)
        kernel = self._kernel(psw is not None)
        if psw is None:
            kernel(weight, ids, bag, grad.contiguous(), coeff)
        else:
            kernel(weight, ids, bag, psw.to(torch.float32), grad.contiguous(), coeff)

    @staticmethod
    def eager(weight, ids, offsets, psw, grad, alpha: float) -> None:
        """The same update in ATen ops (for tests and as documentation of the arithmetic)."""
        occ = grad.index_select(0, bag_of_occurrences(offsets, ids.numel()))
        if psw is not None:
            occ = occ * psw.unsqueeze(1)
        weight.index_put_((ids,), occ * alpha, accumulate=True)

    def _native(self):
        if self.native is False:
            self.native = native_occurrence_sgd()
        return self.native

    def _kernel(self, weighted: bool):
        if weighted not in self._kernels and not self._failed:
            fn = _scatter_weighted_kernel if weighted else _scatter_kernel
            compiled = torch.compile(fn, dynamic=True, options={"cpp.threads": 1})
            args = [torch.zeros(4, 2), torch.tensor([0, 2, 2]), torch.tensor([0, 0, 1])]
            args += [torch.ones(3)] if weighted else []
            if not compiles_on_scratch(compiled, (*args, torch.zeros(2, 2), torch.tensor([-0.1])),
                                       "the fused SGD scatter", "SGD updates group ids by row instead"):
                self._failed = True
                return None
            self._kernels[weighted] = compiled
        return self._kernels.get(weighted)
