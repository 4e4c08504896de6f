"""The synthetic log's drift (--drift-at): off, the stream is today's exactly; on, the drifted features
carry more ids from the drift on, the same whichever way the stream is sliced."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shardwise.train import TrainConfig
from shardwise.train.data import SPARSE_NAMES, SyntheticClicks, default_cardinalities, to_model_inputs
from shardwise.train.synthetic.drift import DriftingClicks

CARDS = default_cardinalities(5000)


def test_before_the_drift_the_inputs_are_the_plain_logs():
    base = SyntheticClicks(0, CARDS)
    log = DriftingClicks(SyntheticClicks(0, CARDS), start=1024, features=["C3", "C12"], factor=8)
    got, want = log.model_inputs(100, 700, CARDS, "cpu"), to_model_inputs(base.batch(100, 700), CARDS, "cpu")
    for a, b in ((got[0], want[0]), (got[1].values(), want[1].values()), (got[1].lengths(), want[1].lengths()),
                 (got[2], want[2])):
        assert torch.equal(a, b)


def test_after_the_drift_the_drifted_features_carry_factor_ids_per_example():
    base = SyntheticClicks(0, CARDS)
    log = DriftingClicks(SyntheticClicks(0, CARDS), start=1000, features=["C3", "C12"], factor=8)
    dense, kjt, labels = log.model_inputs(1000, 300, CARDS, "cpu")
    plain = base.batch(1000, 300)
    per_key = dict(zip(kjt.keys(), kjt.length_per_key()))
    for j, name in enumerate(SPARSE_NAMES):
        present = int((plain.ids[:, j] >= 0).sum())
        assert per_key[name] == present + (7 * 300 if name in ("C3", "C12") else 0), name
    # every id is a row of its table; the plain features' ids are the plain log's
    for name, vals in zip(kjt.keys(), torch.split(kjt.values(), kjt.length_per_key())):
        assert vals.numel() == 0 or 0 <= int(vals.min()) and int(vals.max()) < CARDS[SPARSE_NAMES.index(name)]
    assert torch.equal(dense, torch.from_numpy(np.log1p(plain.dense)))
    # the drifted features still drive the labels: examples whose drifted ids have a high mean hidden
    # effect click more often (the model can learn the drifted log)
    b = log.batch(1000, 4096)
    eff = base.effects[11]
    mean_eff = (eff[b.ids[:, 11].clip(0)] + eff[b.extra[:, 1]].sum(axis=1)) / 8
    hi = mean_eff > np.median(mean_eff)
    assert b.labels[hi].mean() > b.labels[~hi].mean()


def test_the_stream_is_the_same_however_it_is_sliced():
    log = DriftingClicks(SyntheticClicks(3, CARDS), start=300, features=["C7"], factor=4)
    whole = log.batch(200, 600)
    again = DriftingClicks(SyntheticClicks(3, CARDS), start=300, features=["C7"], factor=4)
    parts = [again.batch(s, n) for s, n in ((200, 77), (277, 300), (577, 223))]
    for field in ("dense", "ids", "labels", "extra"):
        np.testing.assert_array_equal(getattr(whole, field), np.concatenate([getattr(p, field) for p in parts]))
    assert (whole.extra[:100] == -1).all() and (whole.extra[100:] >= 0).all()


def test_drift_settings_are_checked():
    with pytest.raises(ValueError, match="C99"):
        DriftingClicks(SyntheticClicks(0, CARDS), start=0, features=["C99"])
    with pytest.raises(ValueError, match="drift_factor=1 must be an int >= 2"):
        TrainConfig(drift_at=5, drift_factor=1)
    with pytest.raises(ValueError, match="--drift-at drifts the built-in synthetic log"):
        TrainConfig(drift_at=5, data="day_0.tsv")
    with pytest.raises(ValueError, match="C0"):
        TrainConfig(drift_at=5, drift_features=["C0"])
    assert TrainConfig().drift_at is None   # off unless asked for: benchmarks and golden values keep the plain stream
