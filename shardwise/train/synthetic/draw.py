"""The synthetic click log's draw and the model inputs' bag layout as numba loops.

Every rank draws its slice of the synthetic log at every step, so the draw is on the job's
critical path: as ~30 numpy calls on 256-row arrays it cost ~0.2 ms of CPU per sub-block, plus
~0.06 ms to lay the ids out as bags, most of it per-call overhead. Here a sub-block's generator is
seeded and all its uniforms and normals drawn in one loop: NumPy's ``SeedSequence`` mixing and
``PCG64`` (XSL-RR, 128-bit state) written out in numba, with NumPy's ziggurat for the normals, so
the numbers are NumPy's, in NumPy's order; creating a ``Generator`` per sub-block and handing it to
numba cost more (~20 µs of a ~150 µs sub-block) than seeding it here. The exponentials stay one
vectorised numpy call (NumPy's SIMD ``exp`` is ~2.5x faster than a scalar libm call per element),
and the rest is one more loop. The arithmetic is the numpy version's operation for operation, so the
examples are the same bit for bit (tested against NumPy's own generator over hundreds of sub-blocks,
and probed once per process: where the probe differs, say a numba release that moved its copy of
the ziggurat tables, the draw falls back to NumPy's ``Generator``). The loops are ``nogil``.

Example:
    >>> import numpy as np
    >>> values, lengths, offsets, per_key = bag_parts(np.array([[3, -1], [9, 0]]), np.array([5, 2]))
    >>> values.tolist(), lengths.tolist(), per_key.tolist()     # key-major; 9 folds to 9 % 5
    ([3, 4, 0], [1, 1, 0, 1], [2, 1])
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = ["draw_sub_block", "bag_parts", "seed_words"]

_MASK32 = 0xFFFFFFFF


def seed_words(*ints: int) -> np.ndarray:
    """The 32-bit words ``numpy.random.SeedSequence(ints)`` hashes (each int's words, low first; 0 is
    one word), for the entropy that leads every sub-block's seed."""
    words = []
    for v in ints:
        if v < 0:
            raise ValueError(f"seed part {v} is negative; a SeedSequence takes non-negative ints")
        words.append(v & _MASK32)
        v >>= 32
        while v:
            words.append(v & _MASK32)
            v >>= 32
    return np.asarray(words, dtype=np.uint64)


def _loops(nb) -> dict:
    """The numba loops (compiled at their first call, cached on disk by numba)."""
    jit = nb.njit(cache=True, nogil=True, fastmath=False, error_model="numpy")

    @jit
    def finish(ex, u, n, last_row, missing_rate):
        ns = last_row.shape[0]
        nd = ex.shape[0] // n - ns
        dense = np.empty((n, nd), np.float32)
        for i in range(n):
            for j in range(nd):
                v = np.floor(ex[i * nd + j]) - 1.0
                v = v if v > 0.0 else 0.0
                dense[i, j] = 0.0 if u[i * nd + j] < 0.05 else v     # missing dense values read as 0
        ids = np.empty((n, ns), np.int64)
        a = n * nd
        for i in range(n):
            for j in range(ns):
                # floor(exp(u ln(card+1))) - 1: a Zipf(1) law, row k drawn with probability ~ 1/(k+1)
                x = np.floor(ex[a + i * ns + j]) - 1.0
                ids[i, j] = -1 if u[a + i * ns + j] < missing_rate else np.int64(min(x, last_row[j]))
        return dense, ids

    @jit
    def labels(logit, ids, flat, offsets, u):
        # each example's hidden effects added feature by feature, in the order the numpy version
        # adds them, so the float64 sums and with them the labels are the same
        n, ns = ids.shape
        first = u.shape[0] - n
        out = np.empty(n, np.float32)
        for i in range(n):
            s = logit[i]
            for j in range(ns):
                s += flat[ids[i, j] + offsets[j]]
            out[i] = 1.0 if u[first + i] < 1.0 / (1.0 + np.exp(-s)) else 0.0
        return out

    @jit
    def bags(ids, cards):
        n, ns = ids.shape
        values = np.empty(n * ns, np.int64)
        lengths = np.empty(n * ns, np.int64)
        offsets = np.empty(n * ns + 1, np.int64)
        per_key = np.empty(ns, np.int64)
        offsets[0] = 0
        k = 0
        for j in range(ns):
            c = cards[j]
            for i in range(n):
                v = ids[i, j]
                p = j * n + i
                lengths[p] = 1 if v >= 0 else 0
                if v >= 0:
                    values[k] = v % c if v >= c else v
                    k += 1
                offsets[p + 1] = k
            per_key[j] = offsets[(j + 1) * n] - offsets[j * n]
        return values[:k], lengths, offsets, per_key

    return {"finish": finish, "labels": labels, "bags": bags}


@functools.lru_cache(maxsize=1)
def _compiled() -> dict:
    import numba

    from . import pcg64

    return {**_loops(numba), "draw": pcg64.draw, "arrange": pcg64.arrange}


@functools.lru_cache(maxsize=1)
def _ziggurat_tables():
    """NumPy's ziggurat tables for the inline normals (numba's copy of them), or None where they are
    missing or a probe of 13,312 normals and 28,672 uniforms drawn with them differs from NumPy's
    ``Generator`` on the same seed: the draw then uses the ``Generator`` itself, the same numbers."""
    try:
        from numba.np.random import _constants as c
        tables = (np.ascontiguousarray(c.ki_double, np.uint64), np.ascontiguousarray(c.wi_double, np.float64),
                  np.ascontiguousarray(c.fi_double, np.float64), float(c.ziggurat_nor_r), float(c.ziggurat_nor_inv_r))
    except (ImportError, AttributeError, TypeError, ValueError):
        return None
    prefix, mu, log_cards1 = seed_words(0x9B0BE, 1), np.zeros(13), np.ones(1)
    inline = _compiled()["draw"](prefix, 2, tables, 1024, mu, log_cards1)
    return tables if all(np.array_equal(a, b) for a, b in zip(inline, _numpy_draw(prefix, 2, 1024, mu, log_cards1))) \
        else None


def _numpy_draw(prefix: np.ndarray, index: int, n: int, mu: np.ndarray, log_cards1: np.ndarray) -> tuple:
    """The draw from NumPy's own ``Generator`` (its array fills give the numbers one call per number
    gives, in the same order)."""
    rng = np.random.default_rng(np.random.SeedSequence([*prefix.tolist(), index]))
    normals = rng.standard_normal(n * len(mu))
    uniforms = rng.random(n * len(mu) + 2 * n * len(log_cards1) + n)
    return _compiled()["arrange"](normals, uniforms, n, mu, log_cards1)


def draw_sub_block(prefix: np.ndarray, index: int, n: int, mu: np.ndarray, log_cards1: np.ndarray,
                   last_row: np.ndarray, missing_rate: float, bias: float, dense_w: np.ndarray,
                   flat_effects: np.ndarray, effect_offsets: np.ndarray) -> tuple:
    """``(dense float32 [n, 13], ids int64 [n, 26], labels float32 [n])`` drawn from
    ``default_rng(SeedSequence([*prefix, index]))`` (``prefix``: :func:`seed_words` of the leading
    ints) as ``SyntheticClicks`` defines them (``mu``/``dense_w``: per dense feature; ``log_cards1``:
    ln(rows + 1) and ``last_row``: rows - 1, per table; the hidden effects laid end to end after one
    0.0 each)."""
    loops, tables = _compiled(), _ziggurat_tables()
    if tables is not None and 0 <= index < 1 << 63:
        x, u = loops["draw"](prefix, index, tables, n, mu, log_cards1)
    else:
        x, u = _numpy_draw(prefix, index, n, mu, log_cards1)
    np.exp(x, out=x)
    dense, ids = loops["finish"](x, u, n, last_row, missing_rate)
    logit = bias + np.log1p(dense) @ dense_w    # one BLAS call: the numpy version's sum, in its order
    return dense, ids, loops["labels"](logit, ids, flat_effects, effect_offsets, u)


def bag_parts(ids: np.ndarray, cards) -> tuple:
    """The bags of ``ids`` [n, features] (missing = -1), key-major, one id or none per bag: ``(values,
    lengths [features * n], offsets [features * n + 1], values per feature)``; ids at or beyond their
    table's size ``cards[f]`` (a sequence of ints) fold modulo it."""
    return _compiled()["bags"](np.ascontiguousarray(ids, dtype=np.int64), np.ascontiguousarray(cards, dtype=np.int64))
