"""`shardwise train` starts its workers with THP_MEM_ALLOC_ENABLE=1 unless the user set it: a worker's
torch then advises its big tensors' memory for transparent huge pages."""

import os
import subprocess
import sys

import pytest

import shardwise.train.launching.launch as launch_mod
from shardwise.cli import THP_ENV, main

# what a worker sees: the variable, and whether a 64 MiB tensor it wrote sits on huge pages
_PROBE = ("import os, torch; t = torch.empty(16 << 20).fill_(1); "
          "huge = [int(l.split()[1]) for l in open('/proc/self/smaps_rollup') if l.startswith('AnonHugePages')]; "
          "print(os.environ.get('THP_MEM_ALLOC_ENABLE'), bool(huge and huge[0] > 0))")


def _thp_mode() -> str:
    """The kernel's THP mode ('always', 'madvise', 'never'), '' where unknown (not Linux)."""
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return ""
    return text[text.index("[") + 1:text.index("]")]


def _train_env(monkeypatch, tmp_path, user_value):
    monkeypatch.setenv(THP_ENV, "restored after the test")
    if user_value is None:
        monkeypatch.delenv(THP_ENV)
    else:
        monkeypatch.setenv(THP_ENV, user_value)
    seen = []

    def fake_launch(cfg, *args):   # a worker process, started the way the launcher starts them
        seen.append(subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                                   check=True).stdout.split())
    monkeypatch.setattr(launch_mod, "launch", fake_launch)
    assert main(["train", "--device", "cpu", "--out", str(tmp_path / "r")]) == 0
    # the caller of main() keeps its own environment: set only while the workers start
    assert os.environ.get(THP_ENV) == user_value
    return seen


@pytest.mark.parametrize("user_value, want", [(None, "1"), ("0", "0")])
def test_workers_get_huge_pages_unless_the_user_says_otherwise(monkeypatch, tmp_path, user_value, want):
    [(value, huge)] = _train_env(monkeypatch, tmp_path, user_value)
    assert value == want
    mode = _thp_mode()
    if mode == "madvise":       # huge pages exactly where torch asks for them
        assert huge == str(want == "1")
    elif mode == "never":
        assert huge == "False"

