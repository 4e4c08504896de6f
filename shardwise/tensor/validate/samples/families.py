"""Validator samples for ``ops/shape/structure.py``, ``shape/indexing.py``, ``nn/losses.py``,
``nn/spatial.py`` and the in-place shape ops of ``shape/view.py``: shapes whose kept dims do not divide
by the mesh sizes."""

from __future__ import annotations

import torch
from torch.ops import aten

from .base import S, _on


@_on(aten.tril.default, aten.triu.default, aten.tril_.default, aten.triu_.default)
def _triangle(op, m):
    return [S(m.f(5, 3)), S(m.f(3, 4, 5), 1), S(m.f(2, 5, 5), -1)]


@_on(aten.flip.default)
def _flip(op, m):
    return [S(m.f(5, 3), [0]), S(m.f(3, 4, 5), [1, 2])]


@_on(aten.roll.default)
def _roll(op, m):
    return [S(m.f(5, 3), [2], [0]), S(m.f(3, 4, 5), [1, -1], [1, 2]), S(m.f(5, 3), [4])]


@_on(aten.repeat.default)
def _repeat(op, m):
    return [S(m.f(5, 3), [1, 2]), S(m.f(5, 3), [2, 1, 3]), S(m.f(3), [2, 1])]


@_on(aten.diagonal.default, aten.diagonal_copy.default)
def _diagonal(op, m):
    return [S(m.f(5, 3)), S(m.f(3, 4, 5), 1, 1, 2), S(m.f(4, 3, 5), -1, 0, 2)]


@_on(aten.diag_embed.default)
def _diag_embed(op, m):
    return [S(m.f(5, 3)), S(m.f(3, 4), 1, 0, 2)]


@_on(aten.diag.default)
def _diag(op, m):
    return [S(m.f(5)), S(m.f(5, 3), 1)]


@_on(aten.diagonal_backward.default)
def _diagonal_backward(op, m):
    return [S(m.f(3), [5, 3], 0, 0, 1)]


@_on(aten.unfold.default)
def _unfold(op, m):
    return [S(m.f(5, 7), 1, 3, 2), S(m.f(6, 3), 0, 2, 2)]


@_on(aten.constant_pad_nd.default)
def _pad(op, m):
    return [S(m.f(5, 3), [1, 2]), S(m.f(3, 4, 5), [1, 1, 0, 2], 0.5)]


@_on(aten.repeat_interleave.self_int)
def _repeat_interleave(op, m):
    return [S(m.f(5, 3), 2, 0), S(m.f(5, 3), 3, 1), S(m.f(5, 3), 2)]


@_on(aten.glu.default)
def _glu(op, m):
    return [S(m.f(5, 4)), S(m.f(4, 5), 0)]


@_on(aten.glu_backward.default)
def _glu_backward(op, m):
    return [S(m.f(5, 2), m.f(5, 4), -1), S(m.f(2, 5), m.f(4, 5), 0)]


@_on(aten.gather.default)
def _gather(op, m):
    return [S(m.f(5, 3), 0, m.i(2, 3, hi=5)), S(m.f(5, 3), 1, m.i(5, 2, hi=3)), S(m.f(5, 3), 1, m.i(3, 3, hi=3))]


def _scatter_args(op, m):
    x = m.f(5, 3)
    idx0, idx1 = m.i(2, 3, hi=5), m.i(5, 2, hi=3)
    name = op.overloadpacket.__name__
    kw = {"reduce": "multiply"} if op._overloadname in ("reduce", "value_reduce") else {}
    if op._overloadname in ("value", "value_reduce"):
        return [S(x, 0, idx0, 1.5, **kw), S(x, 1, idx1, -1.0, **kw)]
    extra = ("sum",) if name.startswith("scatter_reduce") else ()
    return [S(x, 0, idx0, m.f(2, 3), *extra, **kw), S(x, 1, idx1, m.f(5, 2), *extra, **kw)]


_on(aten.scatter.src, aten.scatter.value, aten.scatter.reduce, aten.scatter.value_reduce, aten.scatter_.src,
    aten.scatter_.value, aten.scatter_.reduce, aten.scatter_.value_reduce, aten.scatter_add.default,
    aten.scatter_add_.default, aten.scatter_reduce.two, aten.scatter_reduce_.two)(_scatter_args)


@_on(aten.index_select.default)
def _index_select(op, m):
    return [S(m.f(5, 3), 0, m.i(4, hi=5)), S(m.f(5, 3), 1, m.i(2, hi=3))]


@_on(aten.index_add.default, aten.index_add_.default, aten.index_copy.default, aten.index_copy_.default)
def _index_add(op, m):
    return [S(m.f(5, 3), 0, torch.tensor([4, 0]), m.f(2, 3)), S(m.f(5, 3), 1, torch.tensor([2]), m.f(5, 1))]


@_on(aten.index_reduce.default, aten.index_reduce_.default)
def _index_reduce(op, m):
    return [S(m.f(5, 3), 0, torch.tensor([4, 0, 4]), m.f(3, 3), "amax")]


@_on(aten.index_fill.int_Scalar, aten.index_fill_.int_Scalar)
def _index_fill(op, m):
    return [S(m.f(5, 3), 0, torch.tensor([4, 1]), 2.0), S(m.f(5, 3), 1, torch.tensor([0]), -1.0)]


@_on(aten.index_fill.int_Tensor, aten.index_fill_.int_Tensor)
def _index_fill_tensor(op, m):
    return [S(m.f(5, 3), 1, torch.tensor([0, 2]), torch.tensor(3.0))]


@_on(aten.mse_loss.default, aten.huber_loss.default, aten.smooth_l1_loss.default)
def _loss(op, m):
    return [S(m.f(5, 3), m.f(5, 3)), S(m.f(4, 6), m.f(4, 6), 0), S(m.f(5, 3), m.f(5, 3), 2)]


@_on(aten.soft_margin_loss.default, aten.binary_cross_entropy_with_logits.default)
def _margin(op, m):
    t = m.b(4, 6).float()
    return [S(m.f(4, 6), t, reduction=1), S(m.f(5, 3), m.b(5, 3).float(), reduction=0),
            S(m.f(5, 3), m.b(5, 3).float(), reduction=2)]


@_on(aten.binary_cross_entropy.default)
def _bce(op, m):
    return [S(m.pos(4, 6) / 2, m.b(4, 6).float()), S(m.pos(5, 3) / 2, m.b(5, 3).float(), m.pos(3), 2),
            S(m.pos(5, 3) / 2, m.b(5, 3).float(), None, 0)]


@_on(aten.mse_loss_backward.default, aten.soft_margin_loss_backward.default)
def _loss_backward(op, m):
    return [S(m.f(), m.f(5, 3), m.f(5, 3), 2), S(m.f(5, 3), m.f(5, 3), m.f(5, 3), 0), S(m.f(), m.f(4, 6), m.f(4, 6), 1)]


@_on(aten.huber_loss_backward.default, aten.smooth_l1_loss_backward.default)
def _huber_backward(op, m):
    return [S(m.f(), m.f(5, 3), m.f(5, 3), 2, 1.0), S(m.f(5, 3), m.f(5, 3), m.f(5, 3), 0, 0.5)]


@_on(aten.binary_cross_entropy_backward.default)
def _bce_backward(op, m):
    return [S(m.f(), m.pos(5, 3) / 2, m.b(5, 3).float(), None, 2), S(m.f(5, 3), m.pos(5, 3) / 2, m.b(5, 3).float(), None, 0)]


@_on(aten.nll_loss2d_forward.default)
def _nll2d(op, m):
    x = torch.log_softmax(m.f(3, 4, 5, 2), 1)
    return [S(x, m.i(3, 5, 2, hi=4), None, r, -100) for r in (0, 1, 2)]


@_on(aten.nll_loss2d_backward.default)
def _nll2d_backward(op, m):
    x, t = torch.log_softmax(m.f(3, 4, 5, 2), 1), m.i(3, 5, 2, hi=4)
    return [S(m.f(3, 5, 2), x, t, None, 0, -100, torch.tensor(30.0)), S(m.f(), x, t, None, 2, -100, torch.tensor(30.0))]


@_on(aten.squeeze_.default, aten.squeeze_.dim, aten.squeeze_.dims, aten.squeeze_copy.default,
     aten.squeeze_copy.dim, aten.squeeze_copy.dims)
def _squeeze_(op, m):
    arg = {"default": (), "dim": (1,), "dims": ([1, 3],)}[op._overloadname]
    return [S(m.f(5, 1, 3, 1), *arg), S(m.f(1, 4, 1, 1), *arg)]


@_on(aten.unsqueeze_.default)
def _unsqueeze_(op, m):
    return [S(m.f(5, 3), 1), S(m.f(5, 3), 0)]


@_on(aten.t_.default)
def _t_(op, m):
    return [S(m.f(5, 3)), S(m.f(4))]


@_on(aten.transpose_.default)
def _transpose_(op, m):
    return [S(m.f(5, 3, 2), 0, 2)]


@_on(aten.convolution.default)
def _conv(op, m):
    x, w = m.f(5, 4, 7), m.f(6, 4, 3)
    base = ([1], [1], [1], False, [0], 1)
    return [S(x, w, m.f(6), *base), S(x, w, None, *base), S(m.f(3, 4, 6, 5), m.f(2, 2, 3, 3), None, [1, 1], [1, 1],
                                                              [1, 1], False, [0, 0], 2)]


@_on(aten.convolution_backward.default)
def _conv_backward(op, m):
    return [S(m.f(5, 6, 5), m.f(5, 4, 7), m.f(6, 4, 3), [6], [1], [0], [1], False, [0], 1, [True, True, True])]


@_on(aten.native_batch_norm.default, aten._native_batch_norm_legit.default)
def _batch_norm(op, m):
    return [S(m.f(4, 5, 3), m.f(5), m.f(5), torch.zeros(5), torch.ones(5), True, 0.1, 1e-5),
            S(m.f(6, 3), None, None, torch.zeros(3), torch.ones(3), False, 0.1, 1e-5)]


@_on(aten._native_batch_norm_legit.no_stats)
def _batch_norm_no_stats(op, m):
    return [S(m.f(4, 5, 3), m.f(5), m.f(5), True, 0.1, 1e-5)]


@_on(aten._native_batch_norm_legit_no_training.default)
def _batch_norm_eval(op, m):
    return [S(m.f(4, 5, 3), m.f(5), m.f(5), m.f(5), m.pos(5), 0.1, 1e-5)]


@_on(aten.native_group_norm.default)
def _group_norm(op, m):
    return [S(m.f(5, 4, 3), m.f(4), m.f(4), 5, 4, 3, 2, 1e-5)]


@_on(aten.native_group_norm_backward.default)
def _group_norm_backward(op, m):
    x = m.f(5, 4, 3)
    mean, rstd = m.f(5, 2), m.pos(5, 2)
    return [S(m.f(5, 4, 3), x, mean, rstd, m.f(4), 5, 4, 3, 2, [True, True, True])]


@_on(aten.reflection_pad2d.default, aten.replication_pad3d.default, aten.reflection_pad3d.default)
def _pad_nd(op, m):
    k = 2 if "2d" in str(op) else 3
    return [S(m.f(*([3, 5] + [4] * k)), [1, 2] * k)]


@_on(aten.upsample_nearest2d.default)
def _upsample2d(op, m):
    return [S(m.f(3, 5, 2, 3), [4, 6])]


@_on(aten.upsample_nearest3d.default)
def _upsample3d(op, m):
    return [S(m.f(3, 5, 2, 2, 3), [4, 4, 6])]


@_on(aten.upsample_nearest1d.vec, aten.upsample_linear1d.vec, aten._upsample_nearest_exact1d.vec)
def _upsample_vec1(op, m):
    extra = (False,) if "linear" in str(op) else ()
    return [S(m.f(3, 5, 4), [7], *extra, None)]


@_on(aten.upsample_nearest2d.vec, aten.upsample_bilinear2d.vec, aten.upsample_bicubic2d.vec,
     aten._upsample_nearest_exact2d.vec)
def _upsample_vec2(op, m):
    extra = (True,) if "linear" in str(op) or "cubic" in str(op) else ()
    return [S(m.f(3, 5, 2, 3), [4, 5], *extra, None)]


@_on(aten.upsample_nearest3d.vec, aten.upsample_trilinear3d.vec, aten._upsample_nearest_exact3d.vec)
def _upsample_vec3(op, m):
    extra = (False,) if "linear" in str(op) else ()
    return [S(m.f(3, 5, 2, 2, 3), [3, 4, 5], *extra, None)]


@_on(aten.fill.Tensor)
def _fill_tensor(op, m):
    return [S(m.f(5, 3), torch.tensor(2.5))]


@_on(aten.avg_pool1d.default, aten.adaptive_max_pool1d.default)
def _pool1d(op, m):
    return [S(m.f(4, 6, 9), [3])]


@_on(aten._upsample_nearest_exact2d.default, aten._upsample_bicubic2d_aa.default)
def _upsample_exact2d(op, m):
    extra = (False,) if "aa" in str(op) else ()
    return [S(m.f(4, 6, 2, 3), [4, 5], *extra)]


@_on(aten._upsample_nearest_exact3d.default)
def _upsample_exact3d(op, m):
    return [S(m.f(4, 2, 2, 2, 3), [3, 4, 5])]


@_on(aten.upsample_nearest2d_backward.default)
def _upsample_backward(op, m):
    return [S(m.f(4, 6, 4, 6), [4, 6], [4, 6, 2, 3])]


@_on(aten.reflection_pad2d_backward.default, aten.reflection_pad3d_backward.default,
     aten.replication_pad3d_backward.default)
def _pad_backward(op, m):
    k = 2 if "2d" in str(op) else 3
    return [S(m.f(*([4, 6] + [7] * k)), m.f(*([4, 6] + [4] * k)), [1, 2] * k)]


@_on(aten.index_put_.default, aten._unsafe_index_put.default, aten._index_put_impl_.default)
def _index_put(op, m):
    extra = {aten._unsafe_index_put.default: (True,), aten._index_put_impl_.default: (True, False)}.get(op, ())
    return [S(m.f(5, 3), [torch.tensor([4, 0, 4])], m.f(3, 3), *extra)]


@_on(aten.linspace.Scalar_Tensor, aten.logspace.Scalar_Tensor)
def _space(op, m):
    return [S(0.0, torch.tensor(2.0), 5)]


@_on(aten._embedding_bag_forward_only.default)
def _bag(op, m):
    return [S(m.f(10, 5), torch.tensor([1, 2, 4, 5, 4]), torch.tensor([0, 2]))]


@_on(aten.unsafe_split_with_sizes.default)
def _unsafe_split_sizes(op, m):
    return [S(m.f(5, 3), [2, 3]), S(m.f(5, 3), [1, 2], 1)]


@_on(aten._upsample_nearest_exact2d_backward.default, aten._upsample_bicubic2d_aa_backward.default)
def _upsample2d_backward(op, m):
    extra = (False,) if "aa" in str(op) else ()
    return [S(m.f(4, 6, 4, 5), [4, 5], [4, 6, 2, 3], *extra)]


@_on(aten._upsample_nearest_exact3d_backward.default)
def _upsample3d_backward(op, m):
    return [S(m.f(4, 2, 3, 4, 5), [3, 4, 5], [4, 2, 2, 2, 3])]
