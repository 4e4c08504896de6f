"""A Llama-style decoder (RMSNorm, rotary via complex multiply, SwiGLU, tied output) trained with
torchtitan's Llama3 TP plan on 2 gloo ranks equals single-process training, in two variants:
attention on local tensors (use_local_output=True, as Llama3), whose collectives per step equal
PyTorch DTensor's on the same plan, and attention on head-sharded DTensors (use_local_output=False,
as torchtitan's Qwen3 plan), which PyTorch's DTensor cannot run on CPU (no SDPA rule)."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from shardwise.testing import run_on_ranks, worker_mesh

from .llama_tp_model import Config, Llama, Styles, batch, make, parallelize

# Switches for the two pieces from h-28b, both on: loss_parallel (the loss computed on Shard(-1) logits
# without gathering them, torchtitan's default), and clip_grad_norm_'s default path (foreach=None, as
# torchtitan calls it: ours takes the per-tensor vector norms, whose pending norms reduce once).
LOSS_PARALLEL = True
CLIP_FOREACH = None
STEPS = 3


def _build(lib, cfg, mesh, attention, meta_init):
    if not meta_init:
        return parallelize(make(cfg), lib, mesh, attention, LOSS_PARALLEL)
    with torch.device("meta"):
        model = Llama(cfg)
    parallelize(model, lib, mesh, attention, LOSS_PARALLEL)
    model.to_empty(device="cpu")
    model.output.weight = model.tok_embeddings.weight
    model.init_weights(0)  # each sharded parameter draws its slice of the single-process values
    return model


def _loss_parallel(logits):
    """The library's loss_parallel() for class-sharded DTensor logits, else nothing."""
    if not LOSS_PARALLEL or not hasattr(logits, "placements"):
        return contextlib.nullcontext()
    if type(logits).__module__.startswith("shardwise"):
        from shardwise.parallel import loss_parallel
    else:
        from torch.distributed.tensor.parallel import loss_parallel
    return loss_parallel()


def _step(model, opt, tokens, labels, clip_foreach=CLIP_FOREACH):
    logits = model(tokens)
    with _loss_parallel(logits):  # backward inside the block, as PyTorch asks
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=clip_foreach)
    opt.step()
    opt.zero_grad()
    return loss.item() if not hasattr(loss, "full_tensor") else loss.full_tensor().item()


def _adamw(model, fused):
    return torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused or None, foreach=None if fused else True)


def train(rank, world, attention, fused, meta_init):
    mesh = worker_mesh((world,))
    cfg = Config()
    tokens, labels = batch(cfg)
    ref = Llama(cfg)
    ref.init_weights(0)
    model = _build(Styles("shardwise"), cfg, mesh, attention, meta_init)
    init_err = max((p.full_tensor() - q).abs().max().item()
                   for p, q in zip(model.parameters(), ref.parameters()))
    ref_opt, opt = torch.optim.AdamW(ref.parameters(), lr=1e-2), _adamw(model, fused)
    ref_losses = [_step(ref, ref_opt, tokens, labels) for _ in range(STEPS)]
    losses = [_step(model, opt, tokens, labels) for _ in range(STEPS)]
    param_err = max((p.full_tensor() - q).abs().max().item() for p, q in zip(model.parameters(), ref.parameters()))
    tied = model.output.weight is model.tok_embeddings.weight
    return init_err, max(abs(a - b) for a, b in zip(losses, ref_losses)), param_err, tied


@pytest.mark.parametrize("attention", ["local", "heads"])
@pytest.mark.parametrize("fused,meta_init", [(True, True), (False, False)], ids=["fused-meta", "foreach-eager"])
def test_llama_tp_trains_like_single_process(attention, fused, meta_init):
    for init_err, loss_err, param_err, tied in run_on_ranks(train, 2, attention, fused, meta_init):
        assert init_err == 0.0, init_err  # the same draws, sliced
        assert tied
        assert loss_err < 1e-5 and param_err < 1e-5, (loss_err, param_err)


_TORCH_KINDS = {"all_gather_into_tensor": "all_gather", "all_reduce": "all_reduce",
                "reduce_scatter_tensor": "reduce_scatter", "all_to_all_single": "all_to_all"}


def step_collectives(rank, world, lib_name, attention):
    from torch.distributed.tensor.debug import CommDebugMode

    from shardwise.tensor import CollectiveCounter

    mesh = worker_mesh((world,))
    cfg = Config()
    tokens, labels = batch(cfg)
    lib = Styles(lib_name)
    model = Llama(cfg)
    model.init_weights(0)
    parallelize(model, lib, mesh, attention, LOSS_PARALLEL)
    opt = _adamw(model, True)
    counter = CollectiveCounter() if lib_name == "shardwise" else CommDebugMode()
    # foreach clipping: the path PyTorch's DTensor takes by default (it is in torch's foreach types).
    # Ours by default takes the per-tensor path: as many collectives (6), but the 5 pending norm-weight
    # gradients' norms reduce-scatter where PyTorch's all-reduce
    try:
        _step(model, opt, tokens, labels, clip_foreach=True)  # warm-up: optimizer state, plan caches
        with counter:
            _step(model, opt, tokens, labels, clip_foreach=True)
    except NotImplementedError as e:  # PyTorch's DTensor on the head-sharded variant
        return f"{type(e).__name__}: {str(e).splitlines()[0]}"
    if lib_name == "shardwise":
        return dict(counter.counts)
    counts = {}
    for op, n in counter.get_comm_counts().items():
        kind = _TORCH_KINDS[str(op).split(".")[-1]]
        counts[kind] = counts.get(kind, 0) + n
    return counts


def test_local_attention_collectives_equal_pytorch_dtensor():
    ours = run_on_ranks(step_collectives, 2, "shardwise", "local")
    theirs = run_on_ranks(step_collectives, 2, "torch", "local")
    assert ours[0] == theirs[0] and ours[0], (ours, theirs)


def test_head_sharded_attention_runs_where_pytorch_dtensor_cannot():
    ours = run_on_ranks(step_collectives, 2, "shardwise", "heads")
    theirs = run_on_ranks(step_collectives, 2, "torch", "heads")
    assert isinstance(ours[0], dict) and ours[0], ours
    assert isinstance(theirs[0], str) and "scaled_dot_product" in theirs[0], theirs
