"""``shardwise validate``: exit status 0 on success, 2 on bad arguments (the failing case, status 1, is in
test_checker.py), and the printed report."""

from __future__ import annotations

from shardwise.tensor.validate import main


def test_bad_arguments_exit_2():
    assert main(["--op", "no_such_op"]) == 2
    assert main(["--world-sizes", "2,x"]) == 2


def test_main_prints_and_succeeds(capsys):
    assert main(["--op", "aten.mm.default", "--world-sizes", "2,3"]) == 0
    out = capsys.readouterr().out
    assert "aten.mm.default" in out and "0 failures" in out
