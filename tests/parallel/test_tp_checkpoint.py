"""torch.distributed.checkpoint: a tensor-parallel Llama-style model saved at one TP degree loads into
another (2 -> 1, 1 -> 2) with every value equal to the single-process model's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from shardwise.testing import run_on_ranks, worker_mesh

from .llama_tp_model import Config, Llama, Styles, batch, parallelize


def _trained_reference() -> Llama:
    """Initialised with seed 0 and one AdamW step: values no fresh model has."""
    cfg = Config()
    model = Llama(cfg)
    model.init_weights(0)
    tokens, labels = batch(cfg)
    F.cross_entropy(model(tokens).flatten(0, 1), labels.flatten()).backward()
    torch.optim.AdamW(model.parameters(), lr=1e-2).step()
    return model


def save_tp(rank, world, path):
    import torch.distributed.checkpoint as dcp

    model = parallelize(_trained_reference(), Styles("shardwise"), worker_mesh((world,)))
    placements = {n: str(p.placements) for n, p in model.named_parameters()}
    dcp.save(model.state_dict(), checkpoint_id=path)
    return placements


def load_tp(rank, world, path):
    import torch.distributed.checkpoint as dcp

    model = Llama(Config())
    model.init_weights(7)  # other values everywhere, so a key DCP skipped would show
    parallelize(model, Styles("shardwise"), worker_mesh((world,)))
    state = model.state_dict()
    dcp.load(state, checkpoint_id=path)
    model.load_state_dict(state)
    ref = dict(_trained_reference().named_parameters())
    errs = {n: (p.full_tensor() - ref[n]).abs().max().item() for n, p in model.named_parameters()}
    tokens, _ = batch(Config())
    logits_err = (model(tokens) - Llama.forward(_trained_reference(), tokens)).abs().max().item()
    return errs, logits_err, model.output.weight is model.tok_embeddings.weight


@pytest.mark.parametrize("save_world,load_world", [(2, 1), (1, 2)], ids=["tp2-to-tp1", "tp1-to-tp2"])
def test_dcp_loads_tp_model_into_another_degree(tmp_path, save_world, load_world):
    path = str(tmp_path / "ckpt")
    placements = run_on_ranks(save_tp, save_world, path)[0]
    assert "(Shard(dim=0),)" in placements.values() and "(Shard(dim=1),)" in placements.values()
    for errs, logits_err, tied in run_on_ranks(load_tp, load_world, path):
        assert tied and len(errs) == 20, (tied, sorted(errs))
        assert max(errs.values()) == 0.0, errs  # bytes saved, bytes loaded
        assert logits_err < 1e-5, logits_err
