"""``shardwise validate``: exit status 0 on success, 2 on bad arguments (the failing case, status 1, is in
test_checker.py), and the printed report."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shardwise.tensor.validate import main


def test_bad_arguments_exit_2():
    assert main(["--op", "no_such_op"]) == 2
    assert main(["--world-sizes", "2,x"]) == 2


def test_main_prints_and_succeeds(capsys):
    assert main(["--op", "aten.mm.default", "--world-sizes", "2,3"]) == 0
    out = capsys.readouterr().out
    assert "aten.mm.default" in out and "0 failures" in out


def test_the_module_entry_point_runs_only_as_a_script(capsys):
    # before the __name__ guard, importing the module ran the whole validation and exited
    sys.modules.pop("shardwise.tensor.validate.__main__", None)
    try:
        importlib.import_module("shardwise.tensor.validate.__main__")
    except SystemExit as e:
        pytest.fail(f"importing shardwise.tensor.validate.__main__ ran the command (exit status {e.code})")
    assert capsys.readouterr().out == ""
    proc = subprocess.run([sys.executable, "-m", "shardwise.tensor.validate", "--op", "aten.mm.default",
                           "--world-sizes", "2"], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[3])))
    assert proc.returncode == 0 and "aten.mm.default" in proc.stdout, proc.stderr[-3000:]
