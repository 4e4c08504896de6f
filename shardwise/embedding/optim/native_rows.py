"""The fused optimizers' row updates as one native loop (numba): each touched row of the weight and
of its state read once, updated in registers and written back once.

Inductor compiles the same kernels (``rules.py``) into one loop per mutated buffer: Adagrad's
accumulator, then its weight, each a pass over the touched rows (about 7 row widths of memory
traffic where 5 are needed). Numba compiles a plain loop as written, so one pass does it all: on
the sharded benchmark's table-wise shape, Adagrad's update runs at the floor of reading and writing
its touched rows once, where the inductor kernel took ~1.8x that (docs/embedding.md).

The loops are serial (``nogil``): numba's parallel threading layers are either absent from its
wheels (OpenMP) or unsafe when two Python threads launch parallel loops at once (workqueue), so a
process running one intra-op thread takes them (``RowUpdate`` decides) and processes with more
threads keep inductor's parallel loops. The arithmetic is the inductor kernel's, operation for
operation in float32 (tested bit for bit), so replicas taking different paths cannot diverge.
Row-wise Adagrad has no native loop: its row mean would sum in another order than inductor's.

Example:
    >>> import torch; from shardwise.embedding.optim.rules import sgd_kernel
    >>> kernel = native_kernel("sgd") or sgd_kernel          # the inductor kernel's arithmetic, uncompiled
    >>> w = torch.zeros(4, 2)
    >>> kernel(w, torch.tensor([1, 3]), torch.ones(2, 2), torch.tensor([0.5, 1.0]))   # coeffs: lr, scale
    >>> w[:, 0]
    tensor([ 0.0000, -0.5000,  0.0000, -0.5000])
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import numpy as np
import torch

__all__ = ["native_kernel", "native_occurrence_sgd", "native_group_by_row", "native_applies", "NATIVE_RULES"]

NATIVE_RULES = ("sgd", "adagrad", "adam", "adamw")


def _loops(nb) -> dict:
    """The numba loops (compiled lazily at their first call, cached on disk by numba)."""
    jit = nb.njit(cache=True, nogil=True, fastmath=False, error_model="numpy")

    @jit
    def sgd(w, rows, grad, c):
        lr, scale = -c[0], c[c.shape[0] - 1]
        for i in range(rows.shape[0]):
            r = rows[i]
            for j in range(grad.shape[1]):
                w[r, j] = w[r, j] + (grad[i, j] * scale) * lr

    @jit
    def adagrad(w, acc, rows, grad, c):
        lr, eps, scale = -c[0], c[1], c[c.shape[0] - 1]
        for i in range(rows.shape[0]):
            r = rows[i]
            for j in range(grad.shape[1]):
                g = grad[i, j] * scale
                a = acc[r, j] + g * g
                acc[r, j] = a
                w[r, j] = w[r, j] + (g / (np.sqrt(a) + eps)) * lr

    @jit
    def adam(w, m, v, rows, grad, c, decay):
        b1, b2, step_size, bias2, eps, scale = c[0], c[1], c[2], c[3], c[4], c[c.shape[0] - 1]
        one_b1, one_b2, neg = np.float32(1) - b1, np.float32(1) - b2, -step_size
        for i in range(rows.shape[0]):
            r = rows[i]
            for j in range(grad.shape[1]):
                g = grad[i, j] * scale
                mi = m[r, j] * b1 + g * one_b1
                vi = v[r, j] * b2 + g * g * one_b2
                m[r, j] = mi
                v[r, j] = vi
                step = mi / (np.sqrt(vi) / bias2 + eps)
                if decay:   # AdamW: the decayed weight minus the step
                    w[r, j] = w[r, j] * c[5] - step * step_size
                else:
                    w[r, j] = w[r, j] + step * neg

    @jit
    def occurrences(w, ids, offsets, psw, grad, alpha, weighted):
        # every occurrence in turn (bag order): the same adds, in the same order, on every run
        for b in range(offsets.shape[0] - 1):
            for i in range(offsets[b], offsets[b + 1]):
                r = ids[i]
                s = psw[i] * alpha if weighted else alpha
                for j in range(grad.shape[1]):
                    w[r, j] = w[r, j] + grad[b, j] * s

    @jit
    def group(ids, offsets):
        # a stable LSD radix sort of the ids (11-bit digits: two passes below 2**22 rows), then runs
        n = ids.shape[0]
        ends = np.zeros(n + 1, np.int64)   # the bag of each occurrence: bag_of_occurrences' running count
        for k in range(1, offsets.shape[0] - 1):
            ends[offsets[k]] += 1
        bag, top = np.empty(n, np.int64), 0
        for i in range(n):
            top += ends[i]
            bag[i] = top
        high = 0
        for i in range(n):
            if ids[i] < 0:
                return None
            high = max(high, ids[i])
        digits = 1
        while high >> (11 * digits):
            digits += 1
        count = np.zeros((digits, 2049), np.int64)   # every digit's histogram in one pass over the ids
        for i in range(n):
            for p in range(digits):
                count[p, ((ids[i] >> (11 * p)) & 2047) + 1] += 1
        order, spare = np.empty(n, np.int64), np.empty(n, np.int64)
        for p in range(digits):
            for d in range(2048):
                count[p, d + 1] += count[p, d]
            for i in range(n):
                at = i if p == 0 else spare[i]   # the first pass reads the ids in input order
                d = (ids[at] >> (11 * p)) & 2047
                order[count[p, d]] = at
                count[p, d] += 1
            order, spare = spare, order
        order = spare   # the last pass's output
        sorted_bag = np.empty(n, np.int64)
        rows, seg = np.empty(n, np.int64), np.zeros(n + 1, np.int64)
        u = 0
        for i in range(n):
            r = ids[order[i]]
            if u == 0 or rows[u - 1] != r:
                rows[u] = r
                u += 1
            seg[u] = i + 1
            sorted_bag[i] = bag[order[i]]
        return rows[:u], seg[:u + 1], sorted_bag, order

    return {"sgd": sgd, "adagrad": adagrad, "adam": adam, "occurrences": occurrences, "group": group}


@functools.lru_cache(maxsize=1)
def _compiled_loops() -> Optional[dict]:
    try:
        import numba
    except ImportError:   # numba missing: the inductor kernels run instead
        return None
    return _loops(numba)


def native_kernel(rule: str) -> Optional[Callable]:
    """``kernel(weight, *state buffers, rows, grad, coeffs)`` with the inductor kernel's signature
    and arithmetic (``coeffs``: the rule's coefficients + the gradient scale), running as one numba
    loop on CPU float32 contiguous tensors; None where numba is not installed or ``rule`` has none."""
    loops = _compiled_loops()
    if loops is None or rule not in NATIVE_RULES:
        return None
    if rule in ("adam", "adamw"):
        loop, decay = loops["adam"], rule == "adamw"
        return lambda w, m, v, rows, grad, c: loop(*_np(w, m, v, rows, grad, c), decay)
    loop = loops[rule]
    return lambda *args: loop(*_np(*args))


def native_occurrence_sgd() -> Optional[Callable]:
    """``loop(weight, ids, offsets, psw or None, grad, alpha)``: ``weight[ids[i]] += alpha * psw[i] *
    grad[bag of i]`` for every occurrence in bag order (``OccurrenceSGD``'s update, the same
    arithmetic as its inductor loop), reading the bag from ``offsets`` directly; None without numba."""
    loops = _compiled_loops()
    if loops is None:
        return None
    loop = loops["occurrences"]

    def run(w, ids, offsets, psw, grad, alpha: float) -> None:
        weights = psw.to(torch.float32).contiguous() if psw is not None else grad.new_empty(0)
        loop(*_np(w, ids.contiguous(), offsets.contiguous(), weights, grad.contiguous()), np.float32(alpha),
             psw is not None)
    return run


@functools.lru_cache(maxsize=1)
def native_group_by_row() -> Optional[Callable]:
    """``group(ids, offsets)``: ``group_by_row``'s (unique ids ascending, segment offsets, the bag of each
    occurrence in that order) plus the order itself, from one numba loop (a stable radix sort: the
    same permutation as the stable sort), or None for negative ids; None without numba. On a DLRM
    step's ~6,600 ids the stable ``torch.sort`` alone took ~0.24 ms of the update."""
    loops = _compiled_loops()
    if loops is None:
        return None
    loop = loops["group"]

    def run(ids: torch.Tensor, offsets: torch.Tensor):
        out = loop(ids.to(torch.int64).contiguous().numpy(), offsets.to(torch.int64).contiguous().numpy())
        return None if out is None else tuple(torch.from_numpy(a) for a in out)
    return run


def _np(*tensors: torch.Tensor) -> tuple:
    # views of the same memory: the loops write the weight and state in place
    return tuple(t.numpy() for t in tensors)


def native_applies(*tensors: torch.Tensor) -> bool:
    """Whether the native loop can take these tensors: CPU, float32 (indices int32/int64), contiguous,
    none requiring grad (numpy views need detached memory), outside a torch.compile trace."""
    for t in tensors:
        if t.device.type != "cpu" or not t.is_contiguous() or t.requires_grad:
            return False
        if t.dtype not in (torch.float32, torch.int64, torch.int32):
            return False
    return not torch.compiler.is_compiling()
