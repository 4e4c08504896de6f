"""A job checkpoint whose fused-optimizer state was saved under the older names ("sum", "step")
resumes into TorchRec's names ("<t>.momentum1", "<t>.step")."""

from __future__ import annotations

import torch

from shardwise.train.checkpoint import load_checkpoint, save_checkpoint


def test_older_fused_state_names_load_into_the_new_ones(tmp_path):
    acc, step = torch.arange(6.0).reshape(3, 2), torch.tensor(7.0)
    old = {"sparse_opt": {"state": {"embedding_bags.t.weight": {"sum": acc, "step": step}}}, "dense": {"w": torch.ones(2)}}
    path = save_checkpoint(tmp_path, 7, old, {"step": 7})
    new = {"sparse_opt": {"state": {"embedding_bags.t.weight": {"t.momentum1": torch.zeros(3, 2),
                                                                "t.step": torch.tensor(0.0)}}},
           "dense": {"w": torch.zeros(2)}}
    assert load_checkpoint(path, new) == {"step": 7}
    entry = new["sparse_opt"]["state"]["embedding_bags.t.weight"]
    assert torch.equal(entry["t.momentum1"], acc) and entry["t.step"].item() == 7.0
    assert torch.equal(new["dense"]["w"], torch.ones(2))
