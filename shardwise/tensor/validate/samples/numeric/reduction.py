"""Validator samples for ``ops/numeric/reduction.py``: every reduction, scan and ordering signature."""

from __future__ import annotations

import torch
from torch.ops import aten

from ..base import S, _on


@_on(aten.sum.default, aten.mean.default)
def _reduce_all(op, m):
    out = [S(m.f(5, 3)), S(m.f(4, 6)), S(m.f(2))]
    return out + ([S(m.i(5, 3))] if op is aten.sum.default else [])


@_on(aten.sum.dim_IntList, aten.mean.dim)
def _reduce_dims(op, m):
    out = [S(m.f(5, 3), [1]), S(m.f(5, 3), [0], True), S(m.f(2, 3, 4), [-1, 0]), S(m.f(4, 6), [0, 1], True),
           S(m.f(4, 3), [0]), S(m.f(5, 3), [0], dtype=torch.float64)]
    return out + ([S(m.f(5, 3), []), S(m.i(5, 3), [0])] if op is aten.sum.dim_IntList else [])


@_on(aten.amax.default, aten.amin.default)
def _minmax(op, m):
    return [S(m.f(5, 3)), S(m.f(5, 3), [1], True), S(m.f(5, 3), [0]), S(m.fi(4, 6), [0, 1]), S(m.i(5, 3), [-1]),
            S(m.f(8, 3), [0])]


@_on(aten.any.default, aten.all.default)
def _bool_all(op, m):
    return [S(m.b(5, 3)), S(m.b(4, 6)), S(torch.ones(3, 4, dtype=torch.bool)), S(m.fi(5, 3))]


@_on(aten.any.dim, aten.all.dim)
def _bool_dim(op, m):
    return [S(m.b(5, 3), 1), S(m.b(5, 3), 0, True), S(torch.ones(4, 3, dtype=torch.bool), 0)]


@_on(aten.any.dims, aten.all.dims)
def _bool_dims(op, m):
    return [S(m.b(5, 3), [0]), S(m.b(2, 3, 4), [0, 2], True), S(m.b(5, 3))]


@_on(aten.argmax.default, aten.argmin.default)
def _arg(op, m):
    return [S(m.f(5, 3)), S(m.fi(5, 3), 0), S(m.f(5, 3), 1, True), S(m.f(2, 3, 4), -1)]


@_on(aten.max.default, aten.min.default, aten.median.default, aten.nanmedian.default, aten.prod.default,
     aten.nansum.default, aten.count_nonzero.default)
def _all_dims(op, m):
    out = [S(m.f(5, 3)), S(m.f(8, 3))]
    return out + ([S(m.fi(4, 3), 1)] if op is aten.count_nonzero.default else [])


@_on(aten.max.dim, aten.min.dim, aten.median.dim, aten.nanmedian.dim, aten.prod.dim_int, aten.mode.default)
def _one_dim(op, m):
    return [S(m.fi(5, 3), 0), S(m.f(5, 3), 1, True), S(m.f(2, 3, 4), -2)]


@_on(aten.kthvalue.default)
def _kth(op, m):
    return [S(m.f(5, 3), 2, 0), S(m.f(5, 3), 1), S(m.f(2, 3, 4), 2, 1, True)]


@_on(aten.var.correction, aten.std.correction, aten.var_mean.correction, aten.std_mean.correction)
def _var(op, m):
    return [S(m.f(5, 3)), S(m.f(5, 3), [1], correction=0), S(m.f(2, 3, 4), [0, 2], keepdim=True),
            S(m.f(8, 3), [0])]


@_on(aten.var.default, aten.std.default)
def _var_default(op, m):
    return [S(m.f(5, 3)), S(m.f(5, 3), False)]


@_on(aten.var.dim, aten.std.dim)
def _var_dim(op, m):
    return [S(m.f(5, 3), [1]), S(m.f(5, 3), [0], False, True)]


@_on(aten.var_mean.default, aten.std_mean.default)
def _var_mean_default(op, m):
    return [S(m.f(5, 3))]


@_on(aten.var_mean.dim, aten.std_mean.dim)
def _var_mean_dim(op, m):
    return [S(m.f(5, 3), [1]), S(m.f(5, 3), [0], True, True)]


@_on(aten.logsumexp.default, aten.nansum.default)
def _dims_required(op, m):
    return [S(m.f(5, 3), [1]), S(m.f(5, 3), [0], True), S(m.f(2, 3, 4), [0, 2])]


@_on(aten.linalg_vector_norm.default)
def _vector_norm(op, m):
    return [S(m.f(5, 3)), S(m.f(5, 3), 1, [0]), S(m.f(2, 3, 4), 3, [1, 2], True), S(m.f(5, 3), float("inf"), [1])]


@_on(aten.norm.Scalar)
def _norm_scalar(op, m):
    return [S(m.f(5, 3)), S(m.f(5, 3), 1)]


@_on(aten.norm.ScalarOpt_dim)
def _norm_dim(op, m):
    return [S(m.f(5, 3), 2, [1]), S(m.f(5, 3), 1, [0], True)]


@_on(aten.aminmax.default)
def _aminmax(op, m):
    return [S(m.f(5, 3)), S(m.f(5, 3), dim=0), S(m.f(5, 3), dim=1, keepdim=True)]


@_on(aten.count_nonzero.dim_IntList)
def _count_dims(op, m):
    return [S(m.fi(5, 3), [0]), S(m.fi(2, 3, 4), [1, 2])]




@_on(aten.cumsum.default, aten.cumprod.default, aten.logcumsumexp.default, aten.cummax.default,
     aten.cummin.default, aten._logcumsumexp.default)
def _scan(op, m):
    return [S(m.f(5, 3), 0), S(m.f(5, 3), 1), S(m.f(2, 3, 4), -1)]


@_on(aten.cumsum_.default, aten.cumprod_.default)
def _scan_(op, m):
    return [S(m.f(5, 3), 0), S(m.f(5, 3), 1)]


@_on(aten.sort.default, aten.argsort.default)
def _sort(op, m):
    return [S(m.f(5, 3)), S(m.f(5, 3), 0), S(m.f(5, 3), 0, True)]


@_on(aten.sort.stable, aten.argsort.stable)
def _sort_stable(op, m):
    return [S(m.fi(5, 3), stable=True, dim=0), S(m.fi(5, 3), stable=True, dim=1, descending=True)]


@_on(aten.topk.default)
def _topk(op, m):
    return [S(m.f(5, 3), 2), S(m.f(5, 3), 3, 0), S(m.f(5, 3), 2, 1, False)]


@_on(aten.norm.ScalarOpt_dim_dtype)
def _norm_dim_dtype(op, m):
    return [S(m.f(5, 3), 2, [1], False, dtype=torch.float64)]


@_on(aten.norm.ScalarOpt_dtype)
def _norm_dtype(op, m):
    return [S(m.f(5, 3), 2, dtype=torch.float64)]


@_on(aten._is_any_true.default, aten._is_all_true.default)
def _is_true(op, m):
    return [S(m.b(5, 3)), S(torch.ones(4, 3, dtype=torch.bool))]
