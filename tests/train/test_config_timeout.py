"""The collective timeout reaches the process group and bad values fail before any worker starts."""

from __future__ import annotations

import pytest

from shardwise.train.config import TrainConfig
import argparse

from shardwise.train.worker import add_train_arguments, config_from_args


def test_collective_timeout_flag_and_validation():
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    ns = parser.parse_args(["--collective-timeout", "5"])
    assert config_from_args(ns).collective_timeout == 5.0
    assert config_from_args(parser.parse_args([])).collective_timeout == 600.0
    with pytest.raises(ValueError, match="collective_timeout=0 must be a positive number of seconds"):
        TrainConfig(collective_timeout=0)
