"""Ops where sharding is not sensible (factorizations, FFTs, distances, data-dependent lookups): an
explicit all-Replicate strategy, so their inputs are gathered by a planned, counted redistribute like
any other (never through the opt-in gather fallback), and the output is replicated.

Registered as data: the linalg and FFT families by their aten names, the rest listed."""

from __future__ import annotations

import torch
from torch.ops import aten

from ..propagation.registry import RULES, is_out_variant, register_rule
from ..propagation.schema import LocalPlan
from .common import replicate_strategy
from .shape.indexing import REPLICATED as _INDEXING

__all__ = ["FAMILIES", "LISTED", "replicate_only_ops"]

# every aten op whose name starts so (linalg_solve, _linalg_svd, fft_rfft, _fft_c2c, ...)
FAMILIES = ("linalg_", "_linalg_", "fft_", "_fft_")
LISTED = [
    aten.cholesky, aten.cholesky_inverse, aten.cholesky_solve, aten.geqrf, aten.ormqr, aten.triangular_solve,
    aten.lu_unpack, aten._cdist_forward, aten._cdist_backward, aten._pdist_forward, aten._pdist_backward,
    aten._trilinear, aten.addbmm, aten.addmv, aten.addr, aten.vdot, aten.trace, aten.dist, aten.renorm,
    aten.block_diag, aten._chunk_cat, aten._ctc_loss, aten._embedding_bag, aten._embedding_bag_forward_only,
    aten._prelu_kernel, aten._prelu_kernel_backward, aten.log_sigmoid_forward, aten.log_sigmoid_backward,
    aten.multi_margin_loss, aten.multilabel_margin_loss_forward, aten.im2col, aten.col2im,
    aten.grid_sampler_2d, aten.grid_sampler_3d, aten.segment_reduce, aten.allclose, aten.linspace,
    aten.logspace, aten.as_strided, aten.as_strided_copy, aten.as_strided_scatter, aten.resize_,
    aten.resize_as_, aten.diagonal_scatter, aten.select_scatter, aten.slice_scatter, aten.nonzero_static,
    aten.hash_tensor, aten.kron, aten.cross, aten.logdet, aten.matrix_exp, aten.inverse, aten.pinverse,
    aten.det, aten.slogdet, aten.svd, aten.qr, aten.cov, aten.corrcoef, aten.trapezoid, aten.cumulative_trapezoid,
    aten.view_as_complex, aten.view_as_real, aten.multilabel_margin_loss_backward,
    aten.multi_margin_loss_backward, aten.upsample_nearest1d_backward, aten.upsample_nearest2d_backward,
    aten.upsample_bilinear2d_backward, aten.upsample_linear1d_backward, aten.upsample_bicubic2d_backward,
    aten.upsample_trilinear3d_backward, aten._upsample_nearest_exact1d_backward,
    aten._upsample_nearest_exact2d_backward, aten._upsample_nearest_exact3d_backward,
    aten._upsample_bilinear2d_aa_backward, aten._upsample_bicubic2d_aa_backward, aten.grid_sampler_2d_backward, aten.grid_sampler_3d_backward,
] + _INDEXING


def replicate_only_ops() -> list:
    """The overloads given the replicate-only rule (those without a rule of their own)."""
    found = []
    names = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::")]
    family = {n[len("aten::"):].partition(".")[0] for n in names if n[len("aten::"):].startswith(FAMILIES)}
    packets = [getattr(aten, n) for n in sorted(family)] + [p for p in LISTED if hasattr(p, "overloads")]
    overloads = [getattr(p, o) for p in packets for o in p.overloads()] + [p for p in LISTED if not hasattr(p, "overloads")]
    for ov in overloads:
        if ov in RULES or ov in found or is_out_variant(ov) or decomposes_before_dispatch(ov):
            continue
        if any("Tensor" in str(a.type) for a in ov._schema.arguments):
            found.append(ov)
    return found


def decomposes_before_dispatch(ov) -> bool:
    """A CompositeImplicitAutograd op (linalg_det, fft_fft) is decomposed before a tensor subclass sees
    it: a rule for it would never run."""
    try:
        return ov.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd)
    except RuntimeError:  # a TorchScript-only overload (index_put.hacked_twin): never dispatched either
        return True


def replicate_only_rule(schema, mesh_size):
    return [replicate_strategy(schema)]


register_rule(*replicate_only_ops())(replicate_only_rule)


def _conj_local(schema, decision, out_specs, mesh, coord):
    # the conjugate bit would sit on the local tensor only (a DTensor's wrapper does not carry it), and
    # ops that refuse conjugated views (view_as_real) would see it: the conjugate is materialised
    return LocalPlan(kernel=lambda op, args, kwargs: aten.conj_physical(args[0]))


register_rule(aten._conj.default, local=_conj_local)(replicate_only_rule)
