"""Per-parameter placement decisions (single process)."""
from __future__ import annotations

import pytest
import torch

from shardwise.compile.layout import choose_layouts


def test_fully_shard_pads_to_equal_chunks_with_chunk_semantics():
    lay = choose_layouts("fully_shard", {"w": torch.empty(5, 3), "s": torch.empty(())}, world=4)
    w = lay["w"]
    assert w.sharded and w.local_shape == (2, 3) and w.padded_rows == 8
    assert [w.valid_rows(r) for r in range(4)] == [c.shape[0] for c in torch.empty(5, 3).chunk(4)] + [0]
    assert not lay["s"].sharded  # 0-dim parameters cannot be sharded


def test_default_uses_threshold_and_rule():
    params = {"big": torch.empty(100, 10), "small": torch.empty(10), "emb.weight": torch.empty(50, 4)}
    lay = choose_layouts("default", params, world=2, threshold=500)
    assert lay["big"].sharded and not lay["small"].sharded and not lay["emb.weight"].sharded
    rule = lambda fqn, p: True if fqn.startswith("emb") else (False if fqn == "big" else None)  # noqa: E731
    lay = choose_layouts("default", params, world=2, threshold=500, rule=rule)
    assert not lay["big"].sharded and lay["emb.weight"].sharded and not lay["small"].sharded


def test_rule_must_return_bool_or_none():
    with pytest.raises(TypeError, match="shard_rule"):
        choose_layouts("default", {"w": torch.empty(4)}, world=2, rule=lambda f, p: "yes")
