"""DLRM dense arch against explicit loops, rank AUC against pair counting, checkpoints."""

import itertools
import json

import pytest
import torch
from hypothesis import given, settings, strategies as st

from shardwise.train import checkpoint as ckpt
from shardwise.train.model import DenseArch, auc


def test_dense_arch_interaction_matches_loops():
    torch.manual_seed(0)
    arch = DenseArch(num_sparse=3, dim=4, bottom=(8,), top=(6,))
    dense, pooled = torch.randn(5, 13), torch.randn(5, 12)
    x = arch.bottom(dense)
    vecs = [x] + list(pooled.split(4, dim=1))
    dots = [(vecs[i] * vecs[j]).sum(1) for i, j in itertools.combinations(range(4), 2)]
    want = arch.top(torch.cat([x, torch.stack(dots, 1)], 1)).squeeze(1)
    torch.testing.assert_close(arch(dense, pooled), want)


def _pair_auc(s, y):
    pos = [a for a, l in zip(s, y) if l]
    neg = [a for a, l in zip(s, y) if not l]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=2, max_size=30))
def test_auc_matches_pair_counting(pairs):
    s, y = [float(a) for a, _ in pairs], [b for _, b in pairs]
    got = auc(torch.tensor(s), torch.tensor(y, dtype=torch.float32))
    if all(y) or not any(y):
        assert got != got   # nan
    else:
        assert got == pytest.approx(_pair_auc(s, y))


def test_checkpoint_ignores_cut_off_saves(tmp_path):
    state = {"w": torch.arange(6.0)}
    ckpt.save_checkpoint(tmp_path, 10, state, {"step": 10})
    # a save killed before commit: files present, no marker / still under the temp name
    (tmp_path / ".tmp-step_00000020").mkdir()
    (tmp_path / ".tmp-step_00000020" / "meta.json").write_text(json.dumps({"step": 20}))
    half = tmp_path / "step_00000030"
    half.mkdir()
    (half / "meta.json").write_text(json.dumps({"step": 30}))
    assert ckpt.latest(tmp_path).name == "step_00000010"
    with pytest.raises(ValueError, match="COMMITTED"):
        ckpt.load_checkpoint(half, {"w": torch.zeros(6)})
    target = {"w": torch.zeros(6)}
    assert ckpt.load_checkpoint(ckpt.latest(tmp_path), target) == {"step": 10}
    torch.testing.assert_close(target["w"], state["w"])
    ckpt.save_checkpoint(tmp_path, 40, {"w": torch.ones(6)}, {"step": 40})
    assert not (tmp_path / ".tmp-step_00000020").exists() and ckpt.latest(tmp_path).name == "step_00000040"
