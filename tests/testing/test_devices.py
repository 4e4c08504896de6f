"""Device and backend choice: the backend follows the device, the device follows the mesh or LOCAL_RANK.

There is no GPU on the CI machine, so the choices are tested as functions of their inputs; the one
test marked ``gpu`` runs on real ranks of whatever pool the session uses (`make test-gpu`: NCCL).
"""
from __future__ import annotations

import types
import unittest

import pytest
import torch
import torch.distributed as dist

from shardwise import _device
from shardwise.testing import gpu_shortage, pool_device_type, run_on_ranks, worker_device, worker_mesh
from shardwise.testing import harness


def test_backend_follows_the_device():
    assert _device.backend_for("cpu") == "gloo" and _device.backend_for("cuda") == "nccl"
    with pytest.raises(ValueError, match=r"device type 'xpu' has no known collective backend"):
        _device.backend_for("xpu")


def test_pool_device_comes_from_the_environment():
    assert pool_device_type({}) == "cpu"
    assert pool_device_type({"SHARDWISE_TEST_DEVICE": "cuda"}) == "cuda"
    with pytest.raises(ValueError, match=r"SHARDWISE_TEST_DEVICE='gpu' must be one of \('cpu', 'cuda'\)"):
        pool_device_type({"SHARDWISE_TEST_DEVICE": "gpu"})


def test_cuda_needs_one_gpu_per_rank():
    assert gpu_shortage("cpu", 4, 0) is None
    assert gpu_shortage("cuda", 2, 2) is None and gpu_shortage("cuda", 2, 8) is None
    assert "needs 3 GPUs, one per rank" in gpu_shortage("cuda", 3, 2)


def test_cuda_run_without_enough_gpus_is_skipped_with_the_reason(monkeypatch):
    monkeypatch.setenv("SHARDWISE_TEST_DEVICE", "cuda")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(unittest.SkipTest, match=r"world_size=2\) on CUDA: needs 2 GPUs, one per rank"):
        run_on_ranks(_backend_and_devices, 2)


def test_local_device_is_local_rank_not_the_backend(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert _device.local_device("cpu") == torch.device("cpu")
    assert _device.local_device("cuda") == torch.device("cuda", 3)
    assert _device.mesh_device(types.SimpleNamespace(device_type="cuda")) == torch.device("cuda", 3)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # LOCAL_RANK 3 is no index: one of 2 GPUs shown
    assert _device.local_device("cuda") == torch.device("cuda", 1)
    monkeypatch.delenv("LOCAL_RANK")
    assert _device.local_device("cuda") == torch.device("cuda", 1)


@pytest.mark.parametrize("device_types, cuda_available, expected", [
    (["cpu"], True, "cpu"),                  # gloo only: CPU even on a GPU machine
    (["cpu", "cuda"], True, "cuda"),         # "cpu:gloo,cuda:nccl" serves CUDA: the mesh is CUDA
    (["cuda"], True, "cuda"),
    (["cpu", "cuda"], False, "cpu"),         # no GPU in this process
])
def test_default_mesh_device_comes_from_the_group(monkeypatch, device_types, cuda_available, expected):
    group = types.SimpleNamespace(_device_types=[torch.device(t) for t in device_types])
    monkeypatch.setattr(dist.distributed_c10d, "_get_default_group", lambda: group)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda_available)
    assert _device.default_group_device_type() == expected


def _backend_and_devices(rank, world_size):
    mesh = worker_mesh((world_size,))
    t = torch.tensor([float(rank)], device=worker_device())
    dist.all_reduce(t)
    wrong = "cuda" if mesh.device_type == "cpu" else "cpu"
    try:
        worker_mesh((world_size,), device_type=wrong)
        refused = None
    except ValueError as exc:
        refused = str(exc)
    return {"backend": dist.get_backend(), "mesh": mesh.device_type, "device": str(t.device), "sum": t.item(),
            "mesh_device": str(_device.mesh_device(mesh)), "refused": refused}


@pytest.mark.gpu
def test_pool_backend_and_devices_follow_the_pool_device():
    device = harness.pool_device_type()
    for rank, r in enumerate(run_on_ranks(_backend_and_devices, 2)):
        assert r["sum"] == 1.0 and r["mesh"] == device
        if device == "cpu":
            assert r["backend"] == "gloo" and r["device"] == "cpu" and r["mesh_device"] == "cpu", r
        else:
            assert r["backend"] == "nccl" and r["device"] == r["mesh_device"] == f"cuda:{rank}", r
        assert "its backend serves" in r["refused"] and "SHARDWISE_TEST_DEVICE" in r["refused"], r
