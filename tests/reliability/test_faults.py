"""A worker killed mid-run: the elastic launcher restarts the group, it resumes from the last committed
checkpoint, and the final weights equal an uninterrupted run's.

Two 2-process ``shardwise train`` runs start side by side: the reference, and one whose worker gets
SIGKILL from this test once the first checkpoint is committed. Training from a checkpoint is
deterministic (same data cursor, same plan, same world size), so whichever checkpoint the restarted
group resumed from, every tensor of the final checkpoint must match the reference bit for bit.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

# enough steps after the first checkpoint that the kill lands mid-run even on a fast machine (20
# steps took 0.35 s: the kill could come after the last one); the restart segment's first step checks it
STEPS, EVERY = 40, 5
ARGS = ["--nproc-per-node", "2", "--quiet", "--rows", "2000", "--batch-size", "64", "--steps", str(STEPS),
        "--checkpoint-every", str(EVERY), "--reshard-at", "0", "--dense-parallel", "ddp", "--max-restarts", "1",
        # one plan for both runs: the planner's choice among more types follows each run's own timing
        # micro-benchmark, and another layout would sum floats in another order
        "--sharding-types", "table_wise"]


def _start(out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("SHARDWISE_TRAIN_FAULT", None)
    log = open(out.parent / f"{out.name}.log", "w")
    return subprocess.Popen([sys.executable, "-m", "shardwise", "train", "--out", str(out), *ARGS],
                            stdout=log, stderr=subprocess.STDOUT, env=env)


def _children(pid: int) -> list:
    """(pid, cmdline) of the processes whose parent is ``pid``."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            found.append((int(d.name), cmd))
    return found


def _kill_a_worker_after_first_checkpoint(proc: subprocess.Popen, out: Path, deadline: float) -> int:
    first = out / "checkpoints" / f"step_{EVERY:08d}" / "COMMITTED"
    while not first.exists():
        assert proc.poll() is None, f"run ended before its first checkpoint: {_log(out)}"
        assert time.monotonic() < deadline, "no checkpoint within the time limit"
        time.sleep(0.05)
    workers = [p for p, cmd in _children(proc.pid) if "spawn_main" in cmd]
    assert len(workers) == 2, f"expected 2 worker processes under the launcher, got {_children(proc.pid)}"
    os.kill(workers[-1], signal.SIGKILL)
    return workers[-1]


def _log(out: Path) -> str:
    path = out.parent / f"{out.name}.log"
    return path.read_text()[-3000:] if path.exists() else ""


def _tensors(ckpt: Path, tmp: Path) -> dict:
    target = tmp / f"{ckpt.parent.parent.name}-{ckpt.name}.pt"
    dcp_to_torch_save(str(ckpt), str(target))
    flat = {}

    def walk(prefix, obj):
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(f"{prefix}/{k}", v)
        elif isinstance(obj, torch.Tensor):
            flat[prefix] = obj
    walk("", torch.load(target, weights_only=False))
    return flat


@pytest.mark.slow
def test_killed_worker_restarts_and_matches_an_uninterrupted_run(tmp_path):
    faulty, ref = tmp_path / "faulty", tmp_path / "ref"
    procs = {"faulty": _start(faulty), "ref": _start(ref)}
    try:
        _kill_a_worker_after_first_checkpoint(procs["faulty"], faulty, time.monotonic() + 240)
        for name, p in procs.items():
            assert p.wait(timeout=300) == 0, f"{name} run failed: {_log(tmp_path / name)}"
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    m_f = json.loads((faulty / "metrics.json").read_text())
    m_r = json.loads((ref / "metrics.json").read_text())
    assert m_f["elastic_restarts"] == 1 and m_r["elastic_restarts"] == 0
    resumed_at = [seg["first_step"] for seg in m_f["segments"] if seg["kind"] == "restart"]
    assert len(resumed_at) == 1 and EVERY <= resumed_at[0] < STEPS, f"the kill did not land mid-run: {resumed_at}"
    assert m_f["steps"] == m_r["steps"] == STEPS
    final = f"step_{STEPS:08d}"
    got, want = _tensors(faulty / "checkpoints" / final, tmp_path), _tensors(ref / "checkpoints" / final, tmp_path)
    assert sorted(got) == sorted(want) and len(got) > 26
    differ = [k for k in want if not torch.equal(got[k], want[k])]
    assert not differ, f"{len(differ)} tensors differ from the uninterrupted run, e.g. {differ[:3]}"
    # no cut-off or stale folders survive the restart
    assert all(p.name.startswith("step_") for p in (faulty / "checkpoints").iterdir())
