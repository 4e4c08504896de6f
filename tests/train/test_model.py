"""DLRM dense arch against explicit loops, rank AUC against pair counting, checkpoints."""

import itertools
import json

import pytest
import torch
from hypothesis import given, settings, strategies as st

from shardwise.train import checkpoint as ckpt
from shardwise.train.model import DLRMDense, auc


def test_dense_arch_interaction_matches_loops():
    torch.manual_seed(0)
    arch = DLRMDense(num_sparse=3, dim=4, bottom=(8,), top=(6,))
    dense, pooled = torch.randn(5, 13), torch.randn(5, 12)
    x = arch.dense_arch(dense)
    vecs = [x] + list(pooled.split(4, dim=1))
    dots = [(vecs[i] * vecs[j]).sum(1) for i, j in itertools.combinations(range(4), 2)]
    want = arch.over_arch(torch.cat([x, torch.stack(dots, 1)], 1)).squeeze(1)
    torch.testing.assert_close(arch(dense, pooled), want)


def _pre_zoo_layout(num_sparse, dim):
    """The arch as plain torch layers before it was built from the zoo (Linear/ReLU sequences)."""
    n = num_sparse + 1
    bottom = torch.nn.Sequential(torch.nn.Linear(13, 64), torch.nn.ReLU(), torch.nn.Linear(64, dim), torch.nn.ReLU())
    top = torch.nn.Sequential(torch.nn.Linear(dim + n * (n - 1) // 2, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32),
                              torch.nn.ReLU(), torch.nn.Linear(32, 1))
    return torch.nn.ModuleDict({"bottom": bottom, "top": top})


def test_zoo_built_arch_keeps_the_jobs_initial_values_outputs_and_gradients():
    torch.manual_seed(5)
    old = _pre_zoo_layout(3, 4)
    torch.manual_seed(5)
    arch = DLRMDense(num_sparse=3, dim=4)
    assert [p.shape for p in arch.parameters()] == [p.shape for p in old.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(arch.parameters(), old.parameters()))   # same draws, same order
    dense, pooled = torch.randn(6, 13), torch.randn(6, 12)
    x = old["bottom"](dense)
    feats = torch.cat([x.unsqueeze(1), pooled.reshape(6, 3, 4)], 1)
    iu = torch.triu_indices(4, 4, offset=1)
    want = old["top"](torch.cat([x, torch.bmm(feats, feats.transpose(1, 2))[:, iu[0], iu[1]]], 1)).squeeze(1)
    got = arch(dense, pooled)
    assert torch.equal(got, want)                                   # bit for bit
    got.sum().backward(), want.sum().backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(arch.parameters(), old.parameters()))


def test_a_pre_zoo_state_dict_loads_with_its_keys_mapped():
    old, arch = _pre_zoo_layout(2, 4), DLRMDense(num_sparse=2, dim=4)
    state = {f"{k}": v for k, v in old.state_dict().items()}
    assert "bottom.2.weight" in state and "top.4.bias" in state
    arch.load_state_dict(state)
    assert torch.equal(arch.over_arch.model[1].bias, old["top"][4].bias)
    assert torch.equal(arch.dense_arch.model._mlp[1]._linear.weight, old["bottom"][2].weight)


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


def test_a_job_checkpoint_from_before_the_zoo_resumes(tmp_path):
    # the job's dense state as it was saved before: {"params": {bottom.N...}, "opt": {name: Adam state}}
    torch.manual_seed(1)
    old = _pre_zoo_layout(2, 4)
    saved = {"dense": {"params": {k: v.detach().clone() for k, v in old.named_parameters()},
                       "opt": {k: {"step": torch.tensor(3.0), "exp_avg": torch.full_like(v, 0.5),
                                   "exp_avg_sq": torch.full_like(v, 0.25)} for k, v in old.named_parameters()}}}
    ckpt.save_checkpoint(tmp_path, 7, saved, {"step": 7})
    arch = DLRMDense(num_sparse=2, dim=4)
    template = {"dense": {"params": {n: torch.zeros_like(p) for n, p in arch.named_parameters()},
                          "opt": {n: {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                                      "exp_avg_sq": torch.zeros_like(p)} for n, p in arch.named_parameters()}}}
    assert ckpt.load_checkpoint(ckpt.latest(tmp_path), template) == {"step": 7}
    params = template["dense"]["params"]
    assert sorted(params) == sorted(n for n, _ in arch.named_parameters())          # today's names
    assert torch.equal(params["over_arch.model.1.weight"], old["top"][4].weight)
    assert torch.equal(params["dense_arch.model._mlp.0._linear.bias"], old["bottom"][0].bias)
    assert all(torch.equal(st["exp_avg_sq"], torch.full_like(st["exp_avg_sq"], 0.25)) and float(st["step"]) == 3.0
               for st in template["dense"]["opt"].values())
