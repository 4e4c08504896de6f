"""The fused optimizers' row update: one pass over the touched rows where it pays, the eager
update elsewhere.

:class:`RowUpdate` is what a :class:`~shardwise.embedding.optim.rules.FusedRule` calls ``update``:
``update(weight, state, rows, grad, hp)`` with ``rows`` unique and ``state`` the rule's buffers plus
``"step"``. On CPU, calls with at least :data:`COMPILE_MIN_ELEMENTS` gradient elements run the
rule's kernel compiled by ``torch.compile`` (inductor): each touched row of the weight and of every
state buffer is read from memory once, updated and written back once, all arithmetic in registers
(SGD: one in-place loop; Adagrad: the accumulator's in-place loop, then the weight's, which reads
the block's accumulator back from cache; Adam: the moments gathered into a block-sized temporary
and scattered back); the eager update makes a pass per element-wise op (2-3x the time on the
sharded benchmark's shape). In a process with one intra-op thread, those calls run the rule's
numba loop instead (``native_rows.py``: one pass over weight and state together, the same
arithmetic), and inductor's kernel is not compiled at all.
Smaller calls (unit-test sizes, the tail of a batch) stay eager: a compile costs seconds once per
process, which only pays off on real batches. The choice depends only on the call's size, so
replicas of a data-parallel table (same rows on every rank) always take the same path.

Calls larger than :data:`BLOCK_ELEMENTS` run in row blocks of about that size, so the kernel's
temporaries stay in cache. If the compile fails (no C++ compiler for inductor), a warning says so
once and the eager update runs from then on: slower, the same arithmetic.

Example:
    >>> import torch; from shardwise.embedding.optim.rules import resolve_optimizer
    >>> rule, hp = resolve_optimizer(torch.optim.SGD)            # lr 0.001
    >>> w = torch.zeros(4, 2); rule.update(w, {"step": 1}, torch.tensor([1, 3]), torch.ones(2, 2), hp)
    >>> w[:, 0]
    tensor([ 0.0000, -0.0010,  0.0000, -0.0010])
"""

from __future__ import annotations

import warnings
from typing import Callable, Optional

import torch

from . import native_rows

__all__ = ["RowUpdate", "store_compiles", "compiles_on_scratch", "COMPILE_MIN_ELEMENTS", "BLOCK_ELEMENTS", "STORE_COMPILE_MIN_ELEMENTS"]

COMPILE_MIN_ELEMENTS = 32 * 1024    # rows x width of one call from which the compiled kernel runs
# a rank's local weight elements (all of a store's buffers) from which shard() has the store call the
# compiled kernel directly (64 MiB of float32; unit tests' tables are far smaller): see store_compiles
STORE_COMPILE_MIN_ELEMENTS = 16 * 1024 * 1024
BLOCK_ELEMENTS = 512 * 1024         # rows x width per kernel call: 2 MiB of float32 temporaries
_STATE_DTYPE = torch.float32
# hyper-parameters of the scratch call that compiles a kernel (every rule's coefficients read from these)
_PROBE_HP = {"lr": 0.1, "lr_decay": 0.0, "eps": 1e-8, "betas": (0.9, 0.999), "weight_decay": 0.0}


class RowUpdate:
    """One rule's update of the touched rows (see the module docstring).

    ``eager(weight, state, rows, grad, hp)``: the rule's update in ATen ops; ``kernel(weight, *state
    buffers, rows, grad, coeffs)``: the same arithmetic as one compilable function whose ``coeffs``
    tensor is ``coeffs_of(hp, step) + [gradient scale]``; ``state_shapes``: the buffers in kernel
    order, ``{name: "elem" | "row"}`` (the weight's shape, or one value per row).
    ``compile_min_elements=None``: never compile (the eager update only).
    """

    def __init__(self, eager: Callable, kernel: Callable, coeffs_of: Callable, state_shapes: dict,
                 compile_min_elements: Optional[int] = COMPILE_MIN_ELEMENTS, native: Optional[str] = None):
        self.eager, self.kernel_fn, self.coeffs_of = eager, kernel, coeffs_of
        self.native_name = native   # the rule's one-loop numba kernel (optim/native_rows.py), if it has one
        self.state_shapes = dict(state_shapes)
        self.state_names = tuple(self.state_shapes)
        self.compile_min_elements = compile_min_elements
        self._compiled = None      # built at the first call that uses it: a compile costs seconds
        self._failed = False

    def __call__(self, weight: torch.Tensor, state: dict, rows: torch.Tensor, grad: torch.Tensor, hp: dict,
                 scale: float = 1.0) -> None:
        """Update ``weight`` and the rule's buffers in ``state`` on ``rows`` (unique) for the summed
        gradients ``grad`` (times ``scale``), as step ``state["step"]``."""
        large = self.compiles(rows, grad, weight)
        if large:   # the native loop first: where it runs, inductor's kernel is never compiled
            coeffs = torch.tensor(self.coeffs_of(hp, state["step"]) + [float(scale)], dtype=_STATE_DTYPE)
            buffers = [state[n] for n in self.state_names]
            if self.run_native(weight, buffers, rows, grad, coeffs):
                return
        kernel = self._kernel(weight.dtype, grad.shape[1]) if large else None
        if kernel is None:
            self.eager(weight, state, rows, grad if scale == 1.0 else grad * scale, hp)
            return
        # even blocks: no tail of a row or two (a size the dynamic compile specialises: a recompile)
        blocks = -(-grad.numel() // BLOCK_ELEMENTS)
        size = -(-rows.numel() // blocks)
        for a in range(0, rows.numel(), size):
            kernel(weight, *buffers, rows[a:a + size], grad[a:a + size], coeffs)

    def run_native(self, weight: torch.Tensor, buffers: list, rows: torch.Tensor, grad: torch.Tensor,
                   coeffs: torch.Tensor) -> bool:
        """Run the rule's one-loop native kernel if it applies here (numba installed, one intra-op
        thread, CPU float32 contiguous tensors; see optim/native_rows.py); False if it does not."""
        if self.native_name is None or torch.get_num_threads() != 1:
            return False
        kernel = native_rows.native_kernel(self.native_name)
        if kernel is None or not native_rows.native_applies(weight, *buffers, rows, grad, coeffs):
            return False
        kernel(weight, *buffers, rows, grad, coeffs)
        return True

    def compiles(self, rows: torch.Tensor, grad: torch.Tensor, weight: torch.Tensor) -> bool:
        """Whether a call of this size runs the compiled kernel (depends on the call's shape only)."""
        return (self.compile_min_elements is not None and not self._failed and rows.device.type == "cpu"
                and grad.dim() == 2 and grad.dtype == _STATE_DTYPE and weight.dtype.is_floating_point
                and grad.numel() >= self.compile_min_elements and not torch.compiler.is_compiling())

    def ready(self, dtype: torch.dtype, width: int) -> bool:
        """Whether the compiled kernel works here (compiling it now if it has not been): False where
        inductor cannot build it (warned once)."""
        return self._kernel(dtype, width) is not None

    def _kernel(self, dtype: torch.dtype, width: int):
        """The compiled kernel, or None once compiling it failed. It is compiled on scratch tensors
        of the weight's dtype and the call's width: a failure (no C++ compiler for inductor) then
        leaves the real rows untouched, and the eager update takes over with a warning."""
        if self._compiled is None and not self._failed:
            # dynamic: one compile serves every row count and width (no recompile per batch)
            compiled = torch.compile(self.kernel_fn, dynamic=True)
            scratch = [torch.zeros(4, width, dtype=dtype)] + [
                torch.zeros((4, width) if kind == "elem" else (4,), dtype=_STATE_DTYPE)
                for kind in self.state_shapes.values()]
            coeffs = torch.tensor(self.coeffs_of(_PROBE_HP, 1) + [1.0], dtype=_STATE_DTYPE)
            args = (*scratch, torch.tensor([0, 2]), torch.zeros(2, width, dtype=_STATE_DTYPE), coeffs)
            if not compiles_on_scratch(compiled, args, f"the fused update {self.kernel_fn.__name__}",
                                       "embedding updates run eagerly from now on"):
                self._failed = True
                return None
            self._compiled = compiled
        return self._compiled

    def __repr__(self) -> str:
        return f"RowUpdate({self.eager.__name__}, compiled from {self.compile_min_elements} elements)"


def compiles_on_scratch(compiled: Callable, args: tuple, what: str, instead: str) -> bool:
    """Run ``compiled`` once on scratch ``args`` (its compile happens here, touching no real row);
    False, with a warning saying what runs ``instead``, where inductor cannot build it (e.g. no C++
    compiler)."""
    try:
        compiled(*args)
    except Exception as exc:   # noqa: BLE001 -- whatever stops the compile, the uncompiled path is exact
        warnings.warn(f"shardwise: torch.compile of {what} failed ({type(exc).__name__}: {str(exc)[:300]}); "
                      f"{instead} (the same results, slower)", RuntimeWarning, stacklevel=4)
        return False
    return True


def store_compiles(rule, boxes, rank: int, device, dtype: torch.dtype) -> bool:
    """Whether a shard store of ``boxes`` on ``rank`` calls its rule's compiled kernel itself (on every
    update, per block of touched rows, the gradient scale inside the kernel: no per-chunk calls and
    no scaling pass, see docs/embedding.md) without ``compile_optimizer=True``: on CPU, for a rank
    holding at least :data:`STORE_COMPILE_MIN_ELEMENTS` weight elements, where the kernel compiles
    (it is compiled here, once per process). The boxes are shared data, so the replicas of a
    data-parallel table decide alike."""
    mine = [b for b in boxes if b.rank == rank]
    if rule is None or torch.device(device).type != "cpu" or not mine or not dtype.is_floating_point:
        return False
    if sum(b.row_size * b.col_size for b in mine) < STORE_COMPILE_MIN_ELEMENTS:
        return False
    return rule.update.ready(dtype, mine[0].col_size)
