"""The input dist's per-id loops on CPU as numba loops: the batch's id range check and the slot copy.

Both run on every rank at every step. As tensor ops they cost a call per feature or per slot (a
table-wise DLRM batch: 26 of each, ~0.2 ms each way in a running rank) or four whole-batch passes
(the range check, ~50 µs); one serial loop does either in a few microseconds. The tensor-op paths
stay for other devices and for processes without numba (``batch_checks``, ``stages``).

Example:
    >>> import numpy as np
    >>> range_scan()(np.array([1, 4, 2]), np.array([2, 1]), np.array([5, 2]))   # the second key allows < 2
    2
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

__all__ = ["range_scan", "shifted_copy"]


def _loops(nb) -> dict:
    """The numba loops (compiled at their first call, cached on disk by numba)."""
    jit = nb.njit(cache=True, nogil=True)

    @jit
    def scan(values, per_key, limits):
        # where the first id outside [0, its key's limit) is (keys' ids one after the other), or -1
        at = 0
        for k in range(per_key.shape[0]):
            limit = limits[k]
            for i in range(at, at + per_key[k]):
                if values[i] < 0 or values[i] >= limit:
                    return i
            at += per_key[k]
        return -1

    @jit
    def copy(values, starts, lens, shifts, out):
        # slot j's lens[j] ids from starts[j], plus shifts[j], one slot after the other into out
        at = 0
        for j in range(starts.shape[0]):
            s, n, shift = starts[j], lens[j], shifts[j]
            for i in range(n):
                out[at + i] = values[s + i] + shift
            at += n

    return {"scan": scan, "copy": copy}


@functools.lru_cache(maxsize=1)
def _compiled() -> Optional[dict]:
    try:
        import numba
    except ImportError:   # numba missing: the tensor-op paths run instead
        return None
    return _loops(numba)


def range_scan() -> Optional[Callable]:
    """``scan(values, per_key, limits)``: the index of the first id outside [0, its key's limit), or -1
    (numpy arrays); None without numba."""
    loops = _compiled()
    return None if loops is None else loops["scan"]


def shifted_copy() -> Optional[Callable]:
    """``copy(values, starts, lens, shifts, out)``: each slot's ids plus its shift, one slot after the
    other into ``out`` (numpy arrays); None without numba."""
    loops = _compiled()
    return None if loops is None else loops["copy"]
