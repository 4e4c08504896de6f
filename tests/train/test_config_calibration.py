"""``shardwise train --calibration FILE``: recorded cost figures instead of the start-up measurement."""

from __future__ import annotations

import argparse
import json

import pytest

from shardwise.embedding import Calibration
from shardwise.train.config import TrainConfig
from shardwise.train.worker import add_train_arguments, config_from_args


def _parse(*argv):
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    return config_from_args(parser.parse_args(list(argv)))


def test_a_metrics_json_or_a_calibration_file_is_read_into_the_config(tmp_path):
    cal = Calibration(**{**Calibration.nominal().to_json(), "lookup_s_per_call": 3e-4, "source": "run 7"})
    metrics = tmp_path / "metrics.json"
    metrics.write_text(json.dumps({"steps": 10, "calibration": cal.to_json()}))
    cfg = _parse("--calibration", str(metrics))
    assert Calibration.from_json(cfg.calibration) == cal
    # the config travels to the workers as JSON: the figures go with it, not the path
    assert TrainConfig.from_json(cfg.to_json()).calibration == cal.to_json()
    # figures without a source are labelled with the file they came from, not as nominal figures
    bare = tmp_path / "figures.json"
    bare.write_text(json.dumps({k: v for k, v in cal.to_json().items() if k not in ("source", "world_size", "device")}))
    assert Calibration.from_json(_parse("--calibration", str(bare)).calibration).source == f"read from {bare}"
    assert _parse().calibration is None   # default: measured at start-up


def test_bad_calibration_is_refused_before_launch(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--calibration", str(tmp_path / "missing.json")])
    assert "--calibration" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"lookup_s_per_id": 1.0}))
    with pytest.raises(SystemExit):
        parser.parse_args(["--calibration", str(bad)])
    assert "a calibration needs the fields" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"calibration: .*must be a finite number >= 0"):
        TrainConfig(calibration={**Calibration.nominal().to_json(), "lookup_s_per_id": -1.0})
