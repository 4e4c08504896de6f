"""The launcher's failure account: each failed rank with its cause, then how to go on."""

import json

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from shardwise.train import checkpoint as ckpt
from shardwise.train.config import TrainConfig
from shardwise.train.launching.launch import describe_failure


def _error_file(tmp_path, text):
    path = tmp_path / "error.json"
    path.write_text(json.dumps({"message": {"message": text, "extraInfo": {"py_callstack": "...",
                                                                           "timestamp": "1"}}}))
    return str(path)


def _failures(tmp_path):
    return ChildFailedError("run_worker", {
        1: ProcessFailure(1, 4242, 17, str(tmp_path / "none.json")),                       # os._exit(17)
        2: ProcessFailure(0, 4343, -9, str(tmp_path / "none.json")),                       # SIGKILL
        3: ProcessFailure(1, 4444, 1, _error_file(tmp_path, "ValueError: rows=3 must be >= 8\nmore")),
    })


def test_names_every_failed_rank_and_its_cause(tmp_path):
    cfg = TrainConfig(out=str(tmp_path / "r"), checkpoint_every=4)
    text = describe_failure(_failures(tmp_path), cfg, max_restarts=2)
    assert "the job failed after 2 restarts:" in text
    assert "rank 1 (local rank 1, pid 4242) exited with code 17 without a Python error" in text
    assert "rank 2 (local rank 0, pid 4343) was killed by SIGKILL (signal 9)" in text
    assert "rank 3 (local rank 1, pid 4444) raised ValueError: rows=3 must be >= 8 (exit code 1)" in text
    assert "No checkpoint was committed before the failure (every 4 steps)" in text


@pytest.mark.parametrize("every, saved, want", [
    (4, True, "To continue from the last committed checkpoint (step_00000008 in"),
    (0, False, "No checkpoints were written (--checkpoint-every 0)"),
])
def test_says_how_to_go_on(tmp_path, every, saved, want):
    cfg = TrainConfig(out=str(tmp_path / "r"), checkpoint_every=every)
    if saved:
        import torch

        ckpt.save_checkpoint(cfg.checkpoint_path, 8, {"w": torch.zeros(2)}, {"step": 8})
    text = describe_failure(_failures(tmp_path), cfg)
    assert want in text and ("same command with --resume" in text) == saved and "after" not in text.splitlines()[0]


def test_a_bad_line_is_not_answered_with_resume(tmp_path):
    # the same line would fail again after --resume: the way on is to fix it or skip such lines
    cfg = TrainConfig(out=str(tmp_path / "r"), checkpoint_every=4)
    import torch

    ckpt.save_checkpoint(cfg.checkpoint_path, 8, {"w": torch.zeros(2)}, {"step": 8})
    bad = "ValueError: day.tsv line 7, field I3: 'x' is not an integer (or pass --skip-bad-lines to skip and count " \
          "malformed lines)"
    err = ChildFailedError("run_worker", {r: ProcessFailure(r, 100 + r, 1, _error_file(tmp_path, bad)) for r in (0, 1)})
    text = describe_failure(err, cfg)
    lines = text.splitlines()
    # one line for the cause both ranks share, the tracebacks in a file, no --resume advice
    assert lines[1] == f"  rank 0 (local rank 0, pid 100), rank 1 (local rank 1, pid 101) raised {bad} (exit code 1)"
    assert "rerun with --skip-bad-lines" in text and "same command with --resume" not in text
    assert (tmp_path / "r" / "failure.txt").read_text().count("== rank") == 2
