"""Bad inputs for the DTensor core, built on every rank (see ``_runner.run_case``).

Cases whose name ends in ``_one_rank`` give only the last rank the bad input: the library must still
fail on every rank, not leave the others waiting in a collective.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shardwise.tensor import DTensor, MaskPartial, Partial, Replicate, Shard, distribute_tensor, rank_checks
from shardwise.testing import worker_mesh

from ._runner import short_timeout_mesh


def _mesh(world):
    return worker_mesh((world,))


def _module(world):
    """A module holding a sharded parameter, the state bad calls must leave alone."""
    lin = torch.nn.Linear(4, 4)
    lin.weight = torch.nn.Parameter(distribute_tensor(lin.weight.detach(), _mesh(world), [Shard(0)]))
    return lin


# ---- distribute_tensor ------------------------------------------------------------------------
def dist_shard_dim_out_of_range(rank, world):
    m = _module(world)
    return lambda: distribute_tensor(torch.ones(4, 3), _mesh(world), [Shard(2)]), m


def dist_too_many_placements(rank, world):
    m = _module(world)
    return lambda: distribute_tensor(torch.ones(4, 3), _mesh(world), [Shard(0), Replicate()]), m


def dist_placement_not_a_placement(rank, world):
    m = _module(world)
    return lambda: distribute_tensor(torch.ones(4, 3), _mesh(world), ["S(0)"]), m


def dist_of_a_dtensor(rank, world):
    m = _module(world)
    return lambda: distribute_tensor(m.weight, _mesh(world), [Replicate()]), m


def dist_shard_0d(rank, world):
    m = _module(world)
    return lambda: distribute_tensor(torch.tensor(1.0), _mesh(world), [Shard(0)]), m


def dist_shape_differs_one_rank(rank, world):
    # rank-local data of another shape: the broadcast from rank 0 must not silently mix sizes
    m = _module(world)
    rows = 5 if rank == world - 1 else 4
    return lambda: distribute_tensor(torch.ones(rows, 3), _mesh(world), [Shard(0)]), m


def dist_dtype_differs_one_rank(rank, world):
    m = _module(world)
    dtype = torch.float64 if rank == world - 1 else torch.float32
    return lambda: distribute_tensor(torch.ones(4, 3, dtype=dtype), _mesh(world), [Shard(0)]), m


def dist_placements_differ_one_rank(rank, world):
    m = _module(world)
    pl = [Shard(1)] if rank == world - 1 else [Shard(0)]
    return lambda: distribute_tensor(torch.ones(4, 4), _mesh(world), pl), m


# ---- DTensor.from_local -----------------------------------------------------------------------
def from_local_of_a_dtensor(rank, world):
    m = _module(world)
    return lambda: DTensor.from_local(m.weight, _mesh(world), [Shard(0)]), m


def from_local_not_a_tensor(rank, world):
    m = _module(world)
    return lambda: DTensor.from_local([[1.0, 2.0]], _mesh(world), [Shard(0)]), m


def from_local_shape_differs_one_rank(rank, world):
    m = _module(world)
    local = torch.ones(3 if rank == world - 1 else 2, 3)
    return lambda: DTensor.from_local(local, _mesh(world), [Shard(0)], run_check=True), m


def from_local_ndim_differs_one_rank(rank, world):
    # Shard(2) is valid only where the local piece has 3 dims: one rank's argument check fails first
    m = _module(world)
    local = torch.ones(2, 3, 2) if rank == world - 1 else torch.ones(2, 3)
    return lambda: DTensor.from_local(local, _mesh(world), [Shard(-1)], run_check=True), m


def from_local_bad_placement_one_rank(rank, world):
    m = _module(world)
    pl = [Shard(2)] if rank == world - 1 else [Shard(0)]
    return lambda: DTensor.from_local(torch.ones(2, 3), _mesh(world), pl, run_check=True), m


def from_local_bad_shape_arg(rank, world):
    m = _module(world)
    return lambda: DTensor.from_local(torch.ones(2, 3), _mesh(world), [Shard(0)], run_check=True,
                                      shape=(7, 3)), m


def from_local_dtype_differs_one_rank(rank, world):
    m = _module(world)
    local = torch.ones(2, 3, dtype=torch.float64 if rank == world - 1 else torch.float32)
    return lambda: DTensor.from_local(local, _mesh(world), [Shard(0)], run_check=True), m


def from_local_placements_differ_one_rank(rank, world):
    m = _module(world)
    pl = [Replicate()] if rank == world - 1 else [Shard(0)]
    return lambda: DTensor.from_local(torch.ones(2, 3), _mesh(world), pl, run_check=True), m


# ---- redistribute -----------------------------------------------------------------------------
def redist_no_placements(rank, world):
    m = _module(world)
    return lambda: m.weight.redistribute(_mesh(world), None), m


def redist_shard_dim_out_of_range(rank, world):
    m = _module(world)
    return lambda: m.weight.redistribute(_mesh(world), [Shard(3)]), m


def redist_wrong_count(rank, world):
    m = _module(world)
    return lambda: m.weight.redistribute(_mesh(world), [Replicate(), Replicate()]), m


def redist_other_mesh(rank, world):
    m = _module(world)
    other = worker_mesh((1, world))   # the same ranks, another layout
    return lambda: m.weight.redistribute(other, [Replicate(), Replicate()]), m


def _checked(fn):
    def call():
        with rank_checks(True):
            return fn()
    return call


def redist_targets_differ_one_rank(rank, world):
    # checked mode: without it the ranks would run mismatched collectives (see tensor/checks/agreement.py)
    mesh = short_timeout_mesh()
    w = distribute_tensor(torch.arange(16.0).view(4, 4), mesh, [Shard(0)])
    pl = [Shard(1)] if rank == world - 1 else [Replicate()]
    return _checked(lambda: w.redistribute(mesh, pl).full_tensor()), w


def redist_target_invalid_one_rank(rank, world):
    # checked mode: the rank with the bad argument still joins the check, so no rank is left waiting
    mesh = short_timeout_mesh()
    w = distribute_tensor(torch.arange(16.0).view(4, 4), mesh, [Shard(0)])
    pl = [Shard(3)] if rank == world - 1 else [Replicate()]
    return _checked(lambda: w.redistribute(mesh, pl)), w


def redist_noop_differs_one_rank(rank, world):
    # one rank's call is a no-op (same layout) and would issue no collective at all
    mesh = short_timeout_mesh()
    w = distribute_tensor(torch.arange(16.0).view(4, 4), mesh, [Shard(0)])
    pl = [Shard(0)] if rank == world - 1 else [Replicate()]
    return _checked(lambda: w.redistribute(mesh, pl)), w


# ---- ops: mismatched operands, embedding lookups ------------------------------------------------
def op_shape_mismatch(rank, world):
    m = _module(world)
    x = distribute_tensor(torch.ones(4, 3), _mesh(world), [Replicate()])
    return lambda: torch.mm(m.weight, x.transpose(0, 1)), m


def op_meshes_differ(rank, world):
    m = _module(world)
    other = worker_mesh((1, world))
    y = distribute_tensor(torch.ones(4, 4), other, [Replicate(), Replicate()])
    return lambda: m.weight + y, m


def _table(world):
    w = torch.randn(10, 3)
    return torch.nn.Parameter(distribute_tensor(w, _mesh(world), [Shard(0)]))


def _ids(rank, world, bad):
    # the batch is sharded: each rank holds its own row of ids, so one rank's data can be bad alone
    ids = torch.tensor([[1 + rank, 9 - rank]])
    if bad is not None and rank == world - 1:
        ids[0, 1] = bad
    return DTensor.from_local(ids, _mesh(world), [Shard(0)])


def embed_id_too_large_one_rank(rank, world):
    w = _table(world)
    ids = _ids(rank, world, 10)
    return lambda: F.embedding(ids, w), w


def embed_negative_id_one_rank(rank, world):
    w = _table(world)
    ids = _ids(rank, world, -1)
    return lambda: F.embedding(ids, w), w


def embed_float_ids(rank, world):
    w = _table(world)
    ids = distribute_tensor(torch.tensor([[1.0, 4.0]]), _mesh(world), [Replicate()])
    return lambda: F.embedding(ids, w), w


# ---- placements are values: pure constructors ---------------------------------------------------
def placement_bad_values():
    """(constructor call, expected exception, fragment) for placement values; no ranks needed."""
    return [
        (lambda: Shard("0"), TypeError, "dim must be an int"),
        (lambda: Shard(True), TypeError, "dim must be an int"),
        (lambda: Shard(1.0), TypeError, "dim must be an int"),
        (lambda: Partial("mean"), ValueError, "reduce_op must be one of"),
        (lambda: MaskPartial(num_embeddings=10.0), TypeError, "num_embeddings"),
        (lambda: MaskPartial(num_embeddings=10, mesh_dim="0"), TypeError, "mesh_dim"),
    ]
