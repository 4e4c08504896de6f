"""Hangs and cut-off checkpoints.

shardwise issues every collective on the process group of the mesh (the default group, or the group
a mesh was built from), so the collective timeout is torch's process-group timeout:
``init_process_group(timeout=...)`` / ``new_group(timeout=...)``, default 30 minutes for gloo.
These tests set it to 2 s and check that a rank that never joins makes the others fail, loudly and
in time, in a DTensor redistribute and in a sharded embedding forward.
"""

import time

import pytest
import torch
import torch.distributed as dist

from shardwise.testing import run_on_ranks

from ._runner import digest, short_timeout_mesh

TIMEOUT_S = 2.0


def _absent_rank(rank, world, what):
    """The last rank returns at once; the others run ``what`` and report how they failed."""
    mesh = short_timeout_mesh(TIMEOUT_S)
    if what == "redistribute":
        from shardwise.tensor import Shard, distribute_tensor

        x = distribute_tensor(torch.arange(8.0).view(4, 2), mesh, [Shard(0)], src_data_rank=None)
        call = x.full_tensor
    else:
        from ._cases_embedding import _kjt, _sharded

        s = _sharded(mesh=mesh)
        call = lambda: s(_kjt())   # noqa: E731
    if rank == world - 1:
        return None
    start = time.perf_counter()
    try:
        call()
    except Exception as e:   # the point: the waiting rank must get an error, not hang
        return {"kind": type(e).__name__, "msg": str(e), "seconds": time.perf_counter() - start}
    return {"kind": None, "seconds": time.perf_counter() - start}


@pytest.mark.parametrize("what", ["redistribute", "embedding_forward"])
def test_a_rank_that_never_joins_makes_the_others_fail_within_the_timeout(what):
    # 3 ranks: every rank left waiting must fail, not only the one that talks to the absent rank.
    # The harness timeout (30 s) is far above the group's 2 s: only a real hang reaches it.
    results = run_on_ranks(_absent_rank, 3, what, timeout=30)
    for rank, waiting in enumerate(results[:-1]):
        assert waiting["kind"] is not None, f"rank {rank} finished {what} although rank 2 never joined"
        assert "timed out" in waiting["msg"].lower() or "timeout" in waiting["msg"].lower(), waiting["msg"]
        if what == "redistribute":  # the core says what waited and which setting bounds the wait
            assert waiting["kind"] == "CollectiveTimeoutError", waiting
            assert "all_gather over mesh dim 0 (3 ranks) timed out" in waiting["msg"], waiting["msg"]
            assert "--collective-timeout" in waiting["msg"] and "SHARDWISE_CHECK_RANKS=1" in waiting["msg"]
        # gloo checks the deadline on the operation itself; allow scheduling slack on 2 busy cores
        assert TIMEOUT_S * 0.9 <= waiting["seconds"] < TIMEOUT_S + 8, waiting


# ---- checkpoints cut off between writing and committing --------------------------------------------
def _cut_off_save(rank, world, root):
    from pathlib import Path

    from shardwise.train import checkpoint as ckpt

    torch.manual_seed(0)   # a plain tensor is saved once, as a replicated value: the same on every rank
    state = {"w": torch.randn(2, 3)}
    ckpt.save_checkpoint(root, 4, state, {"step": 4})
    good = digest([Path(root) / "step_00000004"])

    def crash(kind, step):   # stands in for a kill between the DCP write and the commit
        if kind == "save":
            raise RuntimeError("killed mid-save")
    real, ckpt.fault_point = ckpt.fault_point, crash
    try:
        ckpt.save_checkpoint(root, 8, {"w": state["w"] * 10}, {"step": 8})
        cut = None
    except RuntimeError as e:
        cut = str(e)
    finally:
        ckpt.fault_point = real
    dist.barrier()
    newest = ckpt.latest(root)
    tmp = Path(root) / ".tmp-step_00000008"
    try:
        ckpt.load_checkpoint(tmp, {"w": torch.zeros_like(state["w"])})
        load_err = None
    except ValueError as e:
        load_err = str(e)
    loaded = {"w": torch.zeros_like(state["w"])}
    meta = ckpt.load_checkpoint(newest, loaded)
    return {"cut": cut, "tmp_written": tmp.is_dir() and any(tmp.glob("*.distcp")), "newest": newest.name,
            "load_err": load_err, "loaded_ok": torch.equal(loaded["w"], state["w"]), "meta": meta,
            "step4_unchanged": digest([Path(root) / "step_00000004"]) == good}


def test_a_save_cut_off_before_commit_never_loads_as_valid(tmp_path):
    results = run_on_ranks(_cut_off_save, 2, str(tmp_path), timeout=60)
    for r in results:
        assert r["cut"] == "killed mid-save"
        assert r["tmp_written"], "the fault must hit after the data files were written"
        assert r["newest"] == "step_00000004", "latest() returned the cut-off save"
        assert r["load_err"] and "not a committed checkpoint" in r["load_err"]
        assert r["loaded_ok"] and r["meta"] == {"step": 4} and r["step4_unchanged"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tmp-step_00000008", "step_00000004"]
