"""The collective timeout reaches the process group and bad values fail before any worker starts."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardwise.train.config import TrainConfig
from shardwise.train.worker import add_train_arguments, config_from_args

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 2.0


def test_collective_timeout_flag_and_validation():
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    ns = parser.parse_args(["--collective-timeout", "5"])
    assert config_from_args(ns).collective_timeout == 5.0
    assert config_from_args(parser.parse_args([])).collective_timeout == 600.0
    with pytest.raises(ValueError, match="collective_timeout=0 must be a positive number of seconds"):
        TrainConfig(collective_timeout=0)


def rank_main() -> None:
    """Subprocess body: join the group as a training worker does, from the parsed flag; the last rank
    then never enters the all-reduce the others wait in."""
    import torch
    import torch.distributed as dist

    from shardwise.train.worker import _init_process_group

    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    cfg = config_from_args(parser.parse_args(["--collective-timeout", str(TIMEOUT_S)]))
    _init_process_group(cfg.collective_timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == world - 1:
        time.sleep(120)   # present but absent: the parent kills it once the others reported
        return
    start = time.perf_counter()
    try:
        dist.all_reduce(torch.ones(4))
        out = {"kind": None}
    except Exception as e:   # the point: a waiting rank gets an error instead of hanging
        out = {"kind": type(e).__name__, "msg": str(e)[:500]}
    out["seconds"] = time.perf_counter() - start
    print(json.dumps(out), flush=True)
    os._exit(0)   # no destroy_process_group: it would wait for the absent rank too


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_waiting_worker_fails_within_the_configured_timeout():
    # 3 ranks, so "every other rank" is more than one; the harness's own group (60 s) is not involved
    world, port = 3, _free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        env.pop("TORCHELASTIC_RESTART_COUNT", None)
        procs.append(subprocess.Popen(
            [sys.executable, "-c", "from tests.train.test_config_timeout import rank_main; rank_main()"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
    try:
        results = [json.loads(p.communicate(timeout=90)[0].strip().splitlines()[-1]) for p in procs[:-1]]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, r in enumerate(results):
        assert r["kind"] is not None, f"rank {rank} finished the all-reduce although rank {world - 1} never joined"
        assert "timed out" in r["msg"].lower() or "timeout" in r["msg"].lower(), r
        # gloo checks the deadline on the operation itself; slack for 2 busy cores
        assert r["seconds"] < TIMEOUT_S + 8, r
        assert r["seconds"] >= TIMEOUT_S * 0.9, f"rank {rank} failed before the timeout, not because of it: {r}"


def test_torchrun_entry_checks_output_paths_before_joining_a_group(tmp_path, monkeypatch):
    # `torchrun -m shardwise.train.worker` skips the CLI: the worker itself must refuse a file as --out
    # before it joins the process group (no MASTER_ADDR here: joining would fail with another error)
    from shardwise.train import worker

    blocker = tmp_path / "a_file"
    blocker.write_text("keep me")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(worker, "run_worker", lambda *a: pytest.fail("the worker started training"))
    with pytest.raises(ValueError, match=r"--out .* is a file, not a folder"):
        worker.main(["--out", str(blocker)])
    assert blocker.read_text() == "keep me"
