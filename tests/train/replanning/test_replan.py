"""The plan a resumed run starts from (kept where its ranks still exist), and the run's segment counts."""

import pytest

from shardwise.embedding import EmbeddingBagConfig, GreedyShardingPlanner, data_parallel, row_wise, table_wise
from shardwise.train.replanning.replan import describe, keep_plan, placements
from shardwise.train.report import add_window, new_story, open_segment, run_counts

_TABLES = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=1000 * (i + 1), embedding_dim=8, feature_names=[f"f{i}"]) for i in range(5)]


def _planner(world, mb=64.0):
    return GreedyShardingPlanner(world, int(mb * 2**20), batch_size_per_rank=64, ids_per_bag=1.0)


def test_shrinking_keeps_what_still_fits_and_places_the_rest():
    saved = {"t0": table_wise(0), "t1": table_wise(2), "t2": row_wise(), "t3": data_parallel(), "t4": table_wise(1)}
    plan, moves = keep_plan(saved, 3, 2, _TABLES, _planner(2))
    assert plan["t0"] == table_wise(0) and plan["t4"] == table_wise(1) and plan["t3"] == data_parallel()
    assert set(moves) == {"t1", "t2"}   # t1 lived on rank 2; t2 was row-wise over ranks 0, 1, 2
    assert moves["t1"]["from"] == "table_wise[2]" and "rank 2 is gone (3 -> 2 ranks)" == moves["t1"]["why"]
    assert moves["t2"]["to"] == describe(plan["t2"]) and all(r < 2 for r in (plan["t2"].ranks or (0, 1)))
    # the planner's estimate of the result puts nothing on a missing rank
    assert len(_planner(2).estimate(plan, _TABLES).memory) == 2


def test_shrinking_where_no_table_keeps_its_ranks_places_every_table():
    # every table row-wise over the saved 2 ranks: none survives on 1 rank, all are placed afresh
    saved = {t.name: row_wise() for t in _TABLES}
    plan, moves = keep_plan(saved, 2, 1, _TABLES, _planner(1))
    assert set(moves) == set(saved) and all(m["why"] == "rank 1 is gone (2 -> 1 ranks)" for m in moves.values())
    assert all((ps.ranks or (0,)) == (0,) or ps == data_parallel() for ps in plan.values())


def test_growing_keeps_every_table_where_it_was():
    saved = {"t0": table_wise(0), "t1": table_wise(1), "t2": row_wise(), "t3": data_parallel(), "t4": row_wise()}
    plan, moves = keep_plan(saved, 2, 3, _TABLES, _planner(3))
    assert moves == {}
    # row-wise over "all ranks" of the saved run stays on ranks 0 and 1 (not spread onto the new rank 2)
    assert plan["t2"] == row_wise((0, 1)) and plan["t1"] == table_wise(1)
    est = _planner(3).estimate(plan, _TABLES)
    assert [(b.rank, b.row_size) for b, _, _ in est.shards["t2"]] == [(0, 1500), (1, 1500)]
    assert est.memory[2] == est.shards["t3"][2][1]   # the new rank holds only the replicated table
    assert placements(plan, 3) == placements(saved, 2)   # the report shows it as the same plan


def test_a_kept_layout_over_the_memory_budget_is_planned_afresh():
    # every table on rank 0 of 2 ranks; resumed on 1 rank whose budget holds the tables only when
    # ... they fit at all: shrink the budget below the kept layout's need, but not below one fresh plan's
    saved = {t.name: table_wise(0) for t in _TABLES}
    need = _planner(1).estimate(saved, _TABLES).memory[0]
    planner = _planner(2, mb=need * 0.6 / 2**20)
    plan, moves = keep_plan(saved, 2, 2, _TABLES, planner)
    assert plan == planner.plan(_TABLES)
    assert moves and all("planned afresh" in m["why"] and "over its" in m["why"] for m in moves.values())


@pytest.mark.parametrize("segments, want", [
    ([("start", "a", 0)], (0, 0)),
    ([("start", "a", 0), ("restart", "a", 1), ("restart", "a", 2)], (0, 2)),
    # restart 2 resumed from a checkpoint written before restart 1 could save: both restarts count
    ([("start", "a", 0), ("restart", "a", 2)], (0, 2)),
    # the first restart of launch a had no checkpoint: it starts over and is the story's only segment
    ([("restart", "a", 1)], (0, 1)),
    ([("start", "a", 0), ("resume", "b", 0), ("restart", "b", 1), ("resume", "c", 0)], (2, 1)),
])
def test_run_counts_resumes_and_restarts(segments, want):
    story = new_story()
    for step, (kind, launch, attempt) in enumerate(segments):
        open_segment(story, kind, 2, step * 10, {}, launch, attempt)
        add_window(story, "whole segment", step * 10, step * 10 + 5, [1.0, 3.0])
    counts = run_counts(story)
    assert (counts["resumes"], counts["restarts"]) == want and counts["segments"] == len(segments)
    assert [w["segment"] for w in story["windows"]] == list(range(len(segments)))
    assert story["windows"][0]["max_over_mean"] == 1.5


@pytest.mark.parametrize("flags, field, want", [
    (["--reshard-min-window", "25"], "reshard_min_window", 25), ([], "reshard_min_window", 10),
    (["--memory-per-rank-mb", "64"], "memory_per_rank_mb", 64.0), ([], "memory_per_rank_mb", None),
    (["--memory-per-rank", "6GiB"], "memory_per_rank_mb", 6144.0),
])
def test_reshard_window_and_memory_flags(flags, field, want):
    import argparse

    from shardwise.train.worker import add_train_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    assert getattr(config_from_args(parser.parse_args(flags)), field) == want


@pytest.mark.parametrize("kwargs, match", [
    ({"reshard_min_window": 0}, "reshard_min_window=0 must be an int >= 1"),
    ({"memory_per_rank_mb": float("nan")}, "memory_per_rank_mb=nan must be a positive number of MiB"),
])
def test_bad_reshard_settings_name_the_value_and_the_fix(kwargs, match):
    from shardwise.train.config import TrainConfig

    with pytest.raises(ValueError, match=match):
        TrainConfig(**kwargs)


def test_resume_refuses_a_checkpoint_without_a_run_story(tmp_path):
    import json

    from shardwise.train.checkpoint import MARKER, resume_point
    from shardwise.train.config import TrainConfig

    cfg = TrainConfig(out=str(tmp_path), resume=True)
    old = tmp_path / "checkpoints" / "step_00000010"
    old.mkdir(parents=True)
    (old / MARKER).write_text("10\n")
    (old / "meta.json").write_text(json.dumps({"step": 10, "config": cfg.to_json()}))
    with pytest.raises(ValueError, match="written by an older shardwise .* start a new run in another --out"):
        resume_point(cfg)
    (old / "meta.json").write_text(json.dumps({"step": 10, "config": cfg.to_json(), "story": {}}))
    assert resume_point(cfg) == old
