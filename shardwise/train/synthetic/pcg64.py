"""NumPy's ``SeedSequence`` -> ``PCG64`` seeding, PCG64's numbers and the ziggurat normal in numba.

The synthetic log seeds a new generator for every 256-example sub-block. Creating
``default_rng(SeedSequence(...))`` and handing the ``Generator`` to numba cost ~20 µs of a ~150 µs
sub-block (numba unboxes a ``Generator`` in ~8 µs per call); here the seeding is ~1 µs and the draw
loop reads the 128-bit state from registers instead of calling NumPy's bit generator per number.
The algorithms are NumPy's, step for step (``SeedSequence``'s hash mixing and ``generate_state``,
``pcg_setseq_128_srandom_r``, XSL-RR output, ``(next >> 11) * 2**-53`` doubles and the ziggurat of
``random_standard_normal`` with NumPy's tables), so the numbers are NumPy's, in NumPy's order:
``tests/train/test_data.py`` compares hundreds of sub-blocks with NumPy's own generator, and
``draw`` probes the tables once per process. Everything is module level so numba's disk
cache finds it again (a jitted closure over other jitted functions is recompiled in every process).

Example:
    >>> import numpy as np
    >>> st = seeded(np.array([7], np.uint64), 3)
    >>> ref = np.random.PCG64(np.random.SeedSequence([7, 3])).state["state"]
    >>> ref["state"] == int(st[0]) << 64 | int(st[1]) and ref["inc"] == int(st[2]) << 64 | int(st[3])
    True
"""

from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

__all__ = ["seeded", "draw", "arrange"]

_u64 = np.uint64
_M32, _MUL_LO, _MUL_HI = _u64(0xFFFFFFFF), _u64(4865540595714422341), _u64(2549297995355413924)
_jit = nb.njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
_inline = nb.njit(inline="always", nogil=True, cache=True)


@intrinsic
def _mulhi(typingctx, a, b):
    # the high 64 bits of a 64 x 64 product: one x86 ``mul`` (LLVM's i128); emulated with 32-bit
    # halves it made the generator 1.5x slower than NumPy's
    def codegen(context, builder, signature, args):
        wide = ir.IntType(128)
        p = builder.mul(builder.zext(args[0], wide), builder.zext(args[1], wide))
        return builder.trunc(builder.lshr(p, ir.Constant(wide, 64)), ir.IntType(64))
    return types.uint64(types.uint64, types.uint64), codegen


@_inline
def _hashmix(value, hc):
    value = (value ^ hc) & _M32
    hc = (hc * _u64(0x931E8875)) & _M32
    value = (value * hc) & _M32
    return value ^ (value >> _u64(16)), hc


@_inline
def _mix(x, y):
    r = (_u64(0xCA01F9DD) * x - _u64(0x4973F715) * y) & _M32
    return r ^ (r >> _u64(16))


@_inline
def _advance(hi, lo, inc_hi, inc_lo):
    # state = state * multiplier + increment (mod 2**128), in two 64-bit halves
    new_lo = lo * _MUL_LO
    new_hi = _mulhi(lo, _MUL_LO) + lo * _MUL_HI + hi * _MUL_LO
    lo = new_lo + inc_lo
    return new_hi + inc_hi + (_u64(1) if lo < new_lo else _u64(0)), lo


@_inline
def _pool(ent):
    """SeedSequence's entropy pool (4 words) of the 32-bit entropy words ``ent``."""
    pool, hc = np.empty(4, np.uint64), _u64(0x43B0D7E5)
    for i in range(4):
        pool[i], hc = _hashmix(ent[i] if i < ent.shape[0] else _u64(0), hc)
    for s in range(4):
        for d in range(4):
            if s != d:
                h, hc = _hashmix(pool[s], hc)
                pool[d] = _mix(pool[d], h)
    for s in range(4, ent.shape[0]):
        for d in range(4):
            h, hc = _hashmix(ent[s], hc)
            pool[d] = _mix(pool[d], h)
    return pool


@_jit
def seeded(prefix, index):
    """``PCG64(SeedSequence(prefix words + index's words))``'s state: [state hi, lo, increment hi, lo]."""
    n_index, v = 1, _u64(index)
    while v >> _u64(32):
        n_index, v = n_index + 1, v >> _u64(32)
    ent = np.empty(prefix.shape[0] + n_index, np.uint64)
    ent[:prefix.shape[0]] = prefix
    v = _u64(index)
    for i in range(n_index):
        ent[prefix.shape[0] + i], v = v & _M32, v >> _u64(32)
    pool = _pool(ent)
    words, hc = np.empty(8, np.uint64), _u64(0x8B51F9DD)
    for i in range(8):   # generate_state(4, uint64): 8 words, two per uint64, low word first
        x = (pool[i % 4] ^ hc) & _M32
        hc = (hc * _u64(0x58F38DED)) & _M32
        x = (x * hc) & _M32
        words[i] = x ^ (x >> _u64(16))
    init_hi, init_lo = words[0] | (words[1] << _u64(32)), words[2] | (words[3] << _u64(32))
    seq_hi, seq_lo = words[4] | (words[5] << _u64(32)), words[6] | (words[7] << _u64(32))
    inc_hi, inc_lo = (seq_hi << _u64(1)) | (seq_lo >> _u64(63)), (seq_lo << _u64(1)) | _u64(1)
    hi, lo = _advance(_u64(0), _u64(0), inc_hi, inc_lo)
    lo2 = lo + init_lo
    hi, lo = _advance(hi + init_hi + (_u64(1) if lo2 < init_lo else _u64(0)), lo2, inc_hi, inc_lo)
    st = np.empty(4, np.uint64)
    st[0], st[1], st[2], st[3] = hi, lo, inc_hi, inc_lo
    return st


# The state travels in local variables: kept in an array, every store to an output array could
# alias it, and LLVM reloaded and stored it around each number (4x slower than NumPy's generator).
@_inline
def _next64(hi, lo, inc_hi, inc_lo):
    hi, lo = _advance(hi, lo, inc_hi, inc_lo)
    v, rot = hi ^ lo, hi >> _u64(58)   # XSL-RR output of the new state
    return (v >> rot) | (v << ((_u64(64) - rot) & _u64(63))), hi, lo


@_inline
def _pcg_uniform(hi, lo, inc_hi, inc_lo):
    v, hi, lo = _next64(hi, lo, inc_hi, inc_lo)
    return (v >> _u64(11)) * (1.0 / 9007199254740992.0), hi, lo


@_jit
def _pcg_draws(st, tables, normals, uniforms):
    """``normals`` then ``uniforms`` filled from the PCG64 state ``st``: NumPy's standard_normal
    (its ziggurat, draw for draw, with its ``tables`` ki, wi, fi, r, 1/r) and random()."""
    hi, lo, inc_hi, inc_lo = st[0], st[1], st[2], st[3]
    ki, wi, fi, r, inv_r = tables
    for k in range(normals.shape[0]):
        while True:
            bits, hi, lo = _next64(hi, lo, inc_hi, inc_lo)
            idx = bits & _u64(0xFF)
            bits >>= _u64(8)
            rabs = (bits >> _u64(1)) & _u64(0x000FFFFFFFFFFFFF)
            x = rabs * wi[idx]
            if bits & _u64(1):
                x = -x
            if rabs < ki[idx]:
                break
            if idx == 0:   # the tail beyond r
                while True:
                    a, hi, lo = _pcg_uniform(hi, lo, inc_hi, inc_lo)
                    b, hi, lo = _pcg_uniform(hi, lo, inc_hi, inc_lo)
                    xx, yy = -inv_r * np.log1p(-a), -np.log1p(-b)
                    if yy + yy > xx * xx:
                        x = -(r + xx) if (rabs >> _u64(8)) & _u64(1) else r + xx
                        break
                break
            a, hi, lo = _pcg_uniform(hi, lo, inc_hi, inc_lo)
            if (fi[idx - 1] - fi[idx]) * a + fi[idx] < np.exp(-0.5 * x * x):
                break
        normals[k] = x
    for k in range(uniforms.shape[0]):
        uniforms[k], hi, lo = _pcg_uniform(hi, lo, inc_hi, inc_lo)


@_jit
def arrange(normals, uniforms, n, mu, log_cards1):
    """The sub-block's draws as the numpy version used them: n x 13 normals, then uniforms for
    missing dense values, ids, missing ids and labels; returned as exp's arguments (dense, then ids)
    and the uniforms that are compared rather than transformed."""
    nd, ns = mu.shape[0], log_cards1.shape[0]
    x = np.empty(n * (nd + ns))
    for i in range(n):
        for j in range(nd):
            x[i * nd + j] = normals[i * nd + j] * 1.2 + mu[j]   # what normal(mu, 1.2) computes
    a = n * nd
    u = np.empty(n * (nd + ns + 1))
    u[:a] = uniforms[:a]
    for i in range(n):
        for j in range(ns):
            x[a + i * ns + j] = uniforms[a + i * ns + j] * log_cards1[j]
    u[a:] = uniforms[a + n * ns:]
    return x, u


@_jit
def draw(prefix, index, tables, n, mu, log_cards1):
    """A sub-block's draws from ``PCG64(SeedSequence([*prefix, index]))`` (see :func:`arrange`)."""
    nd, ns = mu.shape[0], log_cards1.shape[0]
    normals, uniforms = np.empty(n * nd), np.empty(n * nd + 2 * n * ns + n)
    _pcg_draws(seeded(prefix, index), tables, normals, uniforms)
    return arrange(normals, uniforms, n, mu, log_cards1)
