"""Device and thread choices of a worker: automatic rules, explicit flags, and the host count on real ranks."""

import argparse

import pytest
import torch

from shardwise.testing import run_on_ranks
from shardwise.train.config import TrainConfig
from shardwise.train.launching.host import choose_device, host_cores, ranks_on_this_host, threads_per_process
from shardwise.train.worker import add_train_arguments, config_from_args


def _count_hosts(rank, world, names):
    return ranks_on_this_host(torch.device("cpu"), hostname=None if names is None else names[rank])


@pytest.mark.parametrize("names, want", [
    (None, [2, 2]),                                  # both ranks on this machine
    (["node-a", "node-b"], [1, 1]),                  # as if on two machines
    (["h", "h" + "\0"], [1, 1]),                     # a name is not equal to itself padded
    (["x" * 300, "x" * 300], [2, 2]),                # long names are cut at the same place
])
def test_ranks_on_this_host_counts_names_across_ranks(names, want):
    assert run_on_ranks(_count_hosts, 2, names) == want


@pytest.mark.parametrize("cores, here, explicit, want", [
    (16, 4, None, 4), (2, 2, None, 1), (2, 4, None, 1), (8, 1, None, 8),
    # two single-process "nodes" on one 16-core host: 8 each, not 16 each (LOCAL_WORLD_SIZE would say 1)
    (16, 2, None, 8),
    (16, 4, 3, 3),                                   # --threads wins
])
def test_threads_per_process(cores, here, explicit, want):
    assert threads_per_process(cores, here, explicit) == want


def test_threads_flag_and_validation():
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    assert config_from_args(parser.parse_args(["--threads", "3"])).threads == 3
    assert config_from_args(parser.parse_args([])).threads is None
    with pytest.raises(ValueError, match="threads=0 must be a positive int"):
        TrainConfig(threads=0)
    assert host_cores() >= 1


@pytest.mark.parametrize("requested, procs, gpus, want", [
    (None, 2, 0, "cpu"), (None, 2, 1, "cpu"),        # NCCL refuses two ranks on one GPU
    (None, 2, 2, "cuda"), (None, 1, 8, "cuda"),
    ("cpu", 2, 8, "cpu"), ("cuda", 4, 4, "cuda"),
])
def test_choose_device(requested, procs, gpus, want):
    assert choose_device(requested, procs, gpus) == want


@pytest.mark.parametrize("procs, gpus, match", [
    (2, 1, "2 processes on this machine but 1 GPU.*--nproc-per-node 1 or --device cpu"),
    (2, 0, "but 0 GPU.*use a machine with GPUs or pass --device cpu"),
])
def test_cuda_without_a_gpu_per_process_is_refused(procs, gpus, match):
    with pytest.raises(ValueError, match=match):
        choose_device("cuda", procs, gpus)
    with pytest.raises(ValueError, match="--device 'tpu' must be one of"):
        choose_device("tpu", procs, gpus)


def test_cli_refuses_cuda_before_launching(tmp_path, capsys):
    from shardwise.cli import main

    gpus = torch.cuda.device_count()
    assert main(["train", "--device", "cuda", "--nproc-per-node", str(gpus + 1), "--out", str(tmp_path / "r")]) == 2
    assert "NCCL refuses two ranks on one GPU" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()   # nothing started, nothing written
