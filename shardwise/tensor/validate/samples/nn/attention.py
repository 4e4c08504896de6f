"""Validator samples for ``ops/nn/attention.py``: the CPU flash-attention kernel and its backward.

Head counts (5) and batch sizes (3) split unevenly over meshes of 2..4; query and key lengths differ
(cross attention); additive masks of every broadcast form: ``(L, S)``, ``(B, 1, L, S)`` and
``(B, H, L, S)`` (F.scaled_dot_product_attention turns a bool mask into such a float one);
grouped-query attention with 4 query heads on 2 k/v heads. The CUDA kernels have no CPU
implementation, so they have no samples here (tests/tensor/ops/nn/test_attention.py checks them on GPUs).
"""

from __future__ import annotations

from torch.ops import aten

from ..base import S, _on

_FWD = aten._scaled_dot_product_flash_attention_for_cpu.default
_BWD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def _cases(m):
    """(q, k, v, is_causal, keyword args) for the forward."""
    b, h, lq, lk, e = 3, 5, 6, 7, 4
    q, k, v = m.f(b, h, lq, e), m.f(b, h, lk, e), m.f(b, h, lk, e)
    sq = m.f(b, h, lq, e)
    gq, gk, gv = m.f(2, 4, lq, e), m.f(2, 2, lq, e), m.f(2, 2, lq, e)
    return [
        (sq, m.f(b, h, lq, e), m.f(b, h, lq, e), True, {}),
        (q, k, v, False, {"scale": 0.3}),
        (q, k, v, False, {"attn_mask": m.f(lq, lk)}),
        (q, k, v, False, {"attn_mask": m.f(b, 1, lq, lk)}),
        (q, k, v, False, {"attn_mask": m.f(b, h, lq, lk)}),
        (gq, gk, gv, True, {}),
    ]


@_on(_FWD)
def _flash_cpu(op, m):
    return [S(q, k, v, 0.0, causal, **kw) for q, k, v, causal, kw in _cases(m)]


@_on(_BWD)
def _flash_cpu_backward(op, m):
    out = []
    for q, k, v, causal, kw in _cases(m):
        o, lse = _FWD(q, k, v, 0.0, causal, **kw)
        out.append(S(m.f(*o.shape), q, k, v, o, lse, 0.0, causal, **kw))
    return out
