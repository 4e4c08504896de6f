"""distribute_tensor and from_local(run_check=True) on sub-meshes of N-D meshes (world 4, gloo): results
equal plain torch, repeated calls create no process group and pickle nothing, and ranks that disagree
raise the same error (only on the sub-mesh where they disagree)."""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

from shardwise.testing.harness import run_on_ranks

_MESHES: dict = {}  # per worker process: building a mesh creates its groups (once, collectively)


def _meshes():
    from torch.distributed.device_mesh import init_device_mesh

    if not _MESHES:
        _MESHES["2x2"] = init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b"))
        _MESHES["2x1x2"] = init_device_mesh("cpu", (2, 1, 2), mesh_dim_names=("a", "b", "c"))
    m2, m3 = _MESHES["2x2"], _MESHES["2x1x2"]
    # 1-D slices, the whole 2-D mesh, and 2-D slices of a 3-D mesh: one spanning half the world
    return {"2x2[a]": m2["a"], "2x2[b]": m2["b"], "2x2": m2, "2x1x2[a,b]": m3["a", "b"],
            "2x1x2[a,c]": m3["a", "c"], "2x1x2[b,c]": m3["b", "c"]}


def _piece(full: torch.Tensor, mesh, placements) -> torch.Tensor:
    """This rank's piece by torch.chunk arithmetic (chunks of ceil(n/N); trailing ones short or empty)."""
    from shardwise.tensor import Shard

    coord = mesh.get_coordinate()
    x = full
    for m, p in enumerate(placements):
        if isinstance(p, Shard):
            n, parts = x.shape[p.dim], mesh.size(m)
            size = -(-n // parts)
            start = min(coord[m] * size, n)
            x = x.narrow(p.dim, start, min(size, n - start))
    return x


def _layouts(ndim: int) -> list:
    from shardwise.tensor import Replicate, Shard

    if ndim == 1:
        return [[Shard(0)], [Shard(1)], [Replicate()]]
    return [[Shard(0), Shard(1)], [Shard(0), Replicate()], [Replicate(), Shard(0)], [Shard(0), Shard(0)],
            [Replicate(), Replicate()]]


class _Forbidden:
    """Counts calls of torch.distributed functions a sub-mesh call must not make, while they run."""

    NAMES = ("new_group", "new_subgroups", "split_group", "all_gather_object", "broadcast_object_list",
             "gather_object", "scatter_object_list")

    def __enter__(self):
        self.calls, self.saved = [], {n: getattr(dist, n) for n in self.NAMES if hasattr(dist, n)}
        for name, fn in self.saved.items():
            setattr(dist, name, self._counting(name, fn))
        self.groups = len(dist.distributed_c10d._world.pg_map)
        return self

    def _counting(self, name, fn):
        def wrapper(*args, **kwargs):
            self.calls.append(name)
            return fn(*args, **kwargs)

        return wrapper

    def __exit__(self, *exc):
        for name, fn in self.saved.items():
            setattr(dist, name, fn)
        self.new_groups = len(dist.distributed_c10d._world.pg_map) - self.groups


def submesh_calls(rank, world):
    from shardwise.tensor import DTensor, distribute_tensor

    meshes = _meshes()
    base = torch.arange(35.0).reshape(5, 7)  # 5 rows over 2 ranks, 7 columns: uneven pieces
    bad = []
    with _Forbidden() as forbidden, warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")  # e.g. deprecated collectives
        for _ in range(2):  # repeated calls: nothing accumulates
            for name, mesh in meshes.items():
                flat = mesh.mesh.flatten().tolist()
                for src in (0, len(flat) - 1):
                    expected = base + flat[src]  # each rank passes its own data: the source's wins
                    for pl in _layouts(mesh.ndim):
                        d = distribute_tensor(base + rank, mesh, pl, src_data_rank=src)
                        if not (torch.equal(d.to_local(), _piece(expected, mesh, pl))
                                and torch.equal(d.full_tensor(), expected)):
                            bad.append(("distribute", name, src, [str(p) for p in pl]))
                for pl in _layouts(mesh.ndim):
                    local = _piece(base, mesh, pl)
                    d = DTensor.from_local(local.clone(), mesh, pl, run_check=True, shape=base.shape)
                    if not torch.equal(d.full_tensor(), base):
                        bad.append(("from_local", name, [str(p) for p in pl]))
    return {"bad": bad, "calls": forbidden.calls, "new_groups": forbidden.new_groups,
            "warnings": sorted({str(w.message) for w in warned})}


def submesh_disagreement(rank, world):
    """On the 2x1x2[a,b] slice, ranks {0, 2} and {1, 3} form two sub-meshes; only rank 2 passes another
    shape, so ranks 0 and 2 must raise the same error and ranks 1 and 3 succeed (and so on)."""
    from shardwise.tensor import DTensor, Replicate, Shard, distribute_tensor

    mesh = _meshes()["2x1x2[a,b]"]
    out = {}
    with _Forbidden() as forbidden:
        rows = 4 if rank == 2 else 5
        try:
            distribute_tensor(torch.ones(rows, 3), mesh, [Shard(0), Shard(1)])
            out["shape"] = None
        except ValueError as e:
            out["shape"] = str(e)
        try:
            distribute_tensor(torch.ones(5, 3), mesh, [Shard(0), Shard(1)], src_data_rank=2)
            out["src"] = None
        except ValueError as e:
            out["src"] = str(e)
        pl = [Shard(0), Shard(5)] if rank == 3 else [Shard(0), Shard(1)]
        try:  # only rank 3's own arguments are bad: its sub-mesh partner raises its error too
            distribute_tensor(torch.ones(5, 3), mesh, pl)
            out["placement"] = None
        except ValueError as e:
            out["placement"] = str(e)
        local = torch.ones(3, 3, dtype=torch.float64 if rank == 2 else torch.float32)
        try:
            DTensor.from_local(local, mesh, [Shard(0), Replicate()], run_check=True)
            out["dtype"] = None
        except ValueError as e:
            out["dtype"] = str(e)
    out["new_groups"] = forbidden.new_groups
    return out


def test_distribute_on_submeshes_matches_torch_without_new_groups():
    for r in run_on_ranks(submesh_calls, 4, timeout=300):
        assert not r["bad"], r["bad"]
        assert r["calls"] == [] and r["new_groups"] == 0 and r["warnings"] == [], r


def test_disagreement_on_a_submesh_raises_the_same_error_there():
    res = run_on_ranks(submesh_disagreement, 4, timeout=120)
    assert res[0]["shape"] == res[2]["shape"] and "ranks disagree on the shape" in res[0]["shape"]
    assert "rank 0 has (5, 3), rank 2 has (4, 3)" in res[0]["shape"]
    assert res[1]["shape"] is None and res[3]["shape"] is None
    assert all(r["src"] == res[0]["src"] and "src_data_rank=2" in r["src"] and "(0..1)" in r["src"] for r in res)
    assert res[1]["placement"] == res[3]["placement"] and res[0]["placement"] is None is res[2]["placement"]
    assert "distribute_tensor, rank 3: " in res[1]["placement"] and "S(5)" in res[1]["placement"]
    assert res[0]["dtype"] == res[2]["dtype"] and res[1]["dtype"] is None is res[3]["dtype"]
    assert "ranks disagree on the dtype (rank 0 has torch.float32; rank 2 has torch.float64)" in res[0]["dtype"]
    assert all(r["new_groups"] == 0 for r in res)


def test_texts_travel_as_bytes_in_tensors():
    for r in run_on_ranks(_texts, 2):
        assert r == [(0, "rank 0 ünïcode"), (1, "rank 1 is longer " + "x" * 300)]


def _texts(rank, world):
    from shardwise.tensor.checks.agreement import gather_texts, same_everywhere
    from shardwise.testing.harness import worker_mesh

    mesh = worker_mesh((world,), "cpu")
    text = "rank 0 ünïcode" if rank == 0 else "rank 1 is longer " + "x" * 300
    assert same_everywhere(mesh, "same") and not same_everywhere(mesh, text)
    return gather_texts(mesh, text)
