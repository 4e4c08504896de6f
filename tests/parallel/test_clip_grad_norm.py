"""torch.nn.utils.clip_grad_norm_ / get_total_norm on a TP Llama-style model: values equal the
single-process model's, and the collectives equal PyTorch DTensor's count on the same model (one
all-reduce for the total, plus one per pending-sum gradient of the sequence-parallel norms)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from shardwise.testing import run_on_ranks, worker_mesh

from .llama_tp_model import Config, Styles, batch, make, parallelize


def _backward(model, tokens, labels):
    logits = model(tokens)
    F.cross_entropy(logits.flatten(0, 1), labels.flatten()).backward()


def _counted_clip(lib, n_layers, mesh, foreach, norm_type):
    from shardwise.tensor import CollectiveCounter
    from torch.distributed.tensor.debug import CommDebugMode

    cfg = Config(n_layers=n_layers)
    model = parallelize(make(cfg), Styles(lib), mesh)
    _backward(model, *batch(cfg))
    counter = CollectiveCounter() if lib == "shardwise" else CommDebugMode()
    with counter:
        total = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5, norm_type=norm_type, foreach=foreach)
    count = counter.total if lib == "shardwise" else counter.get_total_counts()
    return model, total, count


def clip_counts(rank, world, n_layers, foreach, norm_type):
    mesh = worker_mesh((world,))
    cfg = Config(n_layers=n_layers)
    ref = make(cfg)
    _backward(ref, *batch(cfg))
    ref_total = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5, norm_type=norm_type)
    ours, total, ours_count = _counted_clip("shardwise", n_layers, mesh, foreach, norm_type)
    _, _, torch_count = _counted_clip("torch", n_layers, mesh, foreach, norm_type)
    grads = dict(ref.named_parameters())
    err = max((p.grad.full_tensor() - grads[n].grad).abs().max().item() for n, p in ours.named_parameters())
    return ours_count, torch_count, abs(total.full_tensor().item() - ref_total.item()), err, len(grads)


@pytest.mark.parametrize("n_layers", [2, 6])
def test_clip_grad_norm_collectives_equal_pytorch_dtensor(n_layers):
    for ours, theirs, total_err, err, n_params in run_on_ranks(clip_counts, 2, n_layers, True, 2.0):
        assert total_err < 1e-5 and err < 1e-6, (total_err, err)
        # 3 sequence-parallel norms' pending gradients per 2 layers + the final norm, and the total
        assert ours == theirs == 2 * n_layers + 2, (ours, theirs, n_params)


@pytest.mark.parametrize("norm_type", [1.0, 3.0, math.inf, 0.0, -math.inf])
def test_clip_grad_norm_orders_and_per_tensor_path(norm_type):
    for ours, theirs, total_err, err, _ in run_on_ranks(clip_counts, 2, 2, False, norm_type):
        assert total_err < 1e-4 and err < 1e-6, (norm_type, total_err, err)
        assert ours == theirs, (ours, theirs)
