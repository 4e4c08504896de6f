"""Checked mode (rank_checks): agreeing ranks run as usual; on a 2-D mesh one disagreeing rank makes
every rank raise the same error listing all four requests."""

import pytest
import torch

from shardwise.tensor import Replicate, Shard, distribute_tensor, rank_checks
from shardwise.testing import run_on_ranks, worker_mesh


def _two_d(rank, world):
    mesh = worker_mesh((2, 2))
    full = torch.arange(32.0).view(8, 4)
    x = distribute_tensor(full, mesh, [Shard(0), Shard(1)])
    with rank_checks(True):
        agreed = x.redistribute(mesh, [Replicate(), Shard(0)]).full_tensor()
        target = [Replicate(), Replicate()] if rank == 3 else [Shard(1), Replicate()]
        try:
            x.redistribute(mesh, target)
            err = None
        except ValueError as e:
            err = str(e)
    torch.testing.assert_close(agreed, full)
    torch.testing.assert_close(x.full_tensor(), full)  # nothing moved, x still usable
    return err


def test_disagreement_on_a_2d_mesh_raises_everywhere():
    errs = run_on_ranks(_two_d, 4)
    assert len(set(errs)) == 1 and errs[0] is not None
    for r in range(4):
        assert f"rank {r}: (S(0), S(1)) -> " in errs[0]
    assert "rank 3: (S(0), S(1)) -> (R, R)" in errs[0] and "rank 0: (S(0), S(1)) -> (S(1), R)" in errs[0]


def test_rank_checks_rejects_non_bool():
    with pytest.raises(TypeError, match="pass True or False"):
        with rank_checks("yes"):
            pass
