"""A checkpoint save cut off anywhere never leaves a folder that loads as valid but is partial.

``save_checkpoint`` writes into ``.tmp-step_N``, then marks and renames it; ``latest`` returns only
marked ``step_N`` folders and ``load_checkpoint`` refuses unmarked ones. These tests cut a save at each
point where a process can die: with SIGKILL at random moments of a real save loop, inside the data
write, and between the two renames of a re-save. Single process (DCP without a process group).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from shardwise.train import checkpoint as ckpt

ROOT = Path(__file__).resolve().parents[2]


def _state(step: int) -> dict:
    # every element names the step: a mix of two saves, or a partly written one, cannot pass for either
    return {"w": torch.full((256, 512), float(step)), "b": torch.full((1000,), float(-step))}


def _save(root, step: int) -> Path:
    with warnings.catch_warnings():   # DCP warns that it runs without a process group
        warnings.simplefilter("ignore")
        return ckpt.save_checkpoint(root, step, _state(step), {"step": step})


def _load(path) -> tuple[dict, dict]:
    target = {k: torch.zeros_like(v) for k, v in _state(0).items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        meta = ckpt.load_checkpoint(path, target)
    return target, meta


def _assert_latest_is_whole(root) -> int:
    """The newest committed checkpoint loads completely and holds exactly its own step's values."""
    path = ckpt.latest(root)
    if path is None:
        return 0
    loaded, meta = _load(path)
    step = meta["step"]
    assert path.name == f"step_{step:08d}"
    for k, v in _state(step).items():
        assert torch.equal(loaded[k], v), f"{path}: {k} is not step {step}'s value"
    return step


def save_forever(root: str) -> None:
    """Subprocess body: save steps 1, 2, ... until killed; re-save each step once (the restart path)."""
    step = 0
    while True:
        step += 1
        _save(root, step)
        _save(root, step)
        print(step, flush=True)


def test_sigkill_during_a_save_loop_leaves_only_whole_checkpoints(tmp_path):
    # one kill (each writer pays a torch import); 0.5 s after the first save lands somewhere in a later
    # one, the loop does nothing but save
    cmd = [sys.executable, "-c", f"from tests.train.test_checkpoint_atomic import save_forever; "
                                 f"save_forever({str(tmp_path)!r})"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout.readline().strip() == "1", "the writer did not finish its first save"
        time.sleep(0.5)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    step = _assert_latest_is_whole(tmp_path)
    assert step >= 1
    for p in tmp_path.iterdir():   # every visible step folder is complete, not only the newest
        if p.name.startswith("step_"):
            loaded, meta = _load(p)
            assert torch.equal(loaded["w"], _state(meta["step"])["w"])
    # the next save cleans up whatever the kill left and commits normally
    _save(tmp_path, step + 1)
    assert _assert_latest_is_whole(tmp_path) == step + 1
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith((".tmp-", ".old-"))]


def test_a_save_killed_inside_the_data_write_is_never_loaded(tmp_path, monkeypatch):
    _save(tmp_path, 4)
    real_save = ckpt.dcp.save

    def half_write(state, checkpoint_id):
        real_save({"w": state["w"]}, checkpoint_id=checkpoint_id)   # some files land, then the process dies
        raise KeyboardInterrupt("killed mid-write")
    monkeypatch.setattr(ckpt.dcp, "save", half_write)
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, 8)
    monkeypatch.undo()
    assert _assert_latest_is_whole(tmp_path) == 4
    with pytest.raises(ValueError, match="not a committed checkpoint"):
        _load(tmp_path / ".tmp-step_00000008")


def test_a_resave_cut_between_its_two_renames_falls_back_to_a_whole_checkpoint(tmp_path, monkeypatch):
    # re-saving step 8 after a restart: the old step_8 is moved aside, then the new one moved in
    _save(tmp_path, 4)
    _save(tmp_path, 8)
    calls = []
    real_replace = os.replace

    def replace(src, dst):
        calls.append((Path(src).name, Path(dst).name))
        if len(calls) == 2:
            raise KeyboardInterrupt("killed between the renames")
        return real_replace(src, dst)
    monkeypatch.setattr(ckpt.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, 8)
    monkeypatch.undo()
    assert calls == [("step_00000008", ".old-step_00000008"), (".tmp-step_00000008", "step_00000008")]
    assert _assert_latest_is_whole(tmp_path) == 4, "no step_8 is visible; the older whole one is used"
    _save(tmp_path, 8)
    assert _assert_latest_is_whole(tmp_path) == 8
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000004", "step_00000008"]


def test_latest_skips_folders_without_marker_or_meta(tmp_path):
    _save(tmp_path, 4)
    unmarked = tmp_path / "step_00000009"
    unmarked.mkdir()
    (unmarked / "meta.json").write_text(json.dumps({"step": 9}))
    no_meta = tmp_path / "step_00000010"
    no_meta.mkdir()
    (no_meta / ckpt.MARKER).write_text("10\n")
    (tmp_path / "step_11").mkdir()   # not the step_%08d name
    assert ckpt.latest(tmp_path).name == "step_00000004"
    with pytest.raises(ValueError, match="not a committed checkpoint"):
        _load(unmarked)
