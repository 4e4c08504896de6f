"""The `shardwise` command end to end: help, plan, errors, and 2-process DLRM training runs."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from shardwise.cli import _is_ratio_line, main
from shardwise.train.data import SyntheticClicks, default_cardinalities
from shardwise.train.launching.host import host_cores


@pytest.mark.parametrize("cmd", [[], ["train"], ["plan"], ["bench"], ["validate"]])
def test_help_for_every_subcommand(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        main(cmd + ["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "usage:" in out and (not cmd or cmd[0] in out)
    if cmd == ["train"]:
        for flag in ("--nproc-per-node", "--rdzv-endpoint", "--resume", "--reshard-at", "--dense-parallel",
                     "--max-restarts", "--checkpoint-every", "--data", "--seed", "--out", "--batch-size"):
            assert flag in out


def test_python_dash_m_entry():
    out = subprocess.run([sys.executable, "-m", "shardwise", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "train" in out.stdout and "validate" in out.stdout


def test_plan_prints_a_table(capsys):
    assert main(["plan", "--tables", "3", "--rows", "5000", "--dim", "8", "--world", "2"]) == 0
    out = capsys.readouterr().out
    assert all(f"t{i}" in out for i in range(3)) and "sharding" in out and "rank 1" in out


def test_bad_arguments_are_reported(capsys):
    assert main(["plan", "--world", "0"]) == 2
    assert "--world=0" in capsys.readouterr().err
    assert main(["bench", "--only", "no_such_bench"]) == 2
    assert main(["train", "--steps", "0"]) == 2
    assert "steps=0" in capsys.readouterr().err


def test_bench_ratio_filter():
    assert _is_ratio_line({"bench": "compile_dp", "config": "ratios", "x": 1})
    assert _is_ratio_line({"replicate_vs_ddp_time": 1.1})
    assert not _is_ratio_line({"bench": "ebc", "step_ms": 3.0})


def test_malformed_file_names_line_and_field(tmp_path, capsys):
    good = "\t".join(["1"] + ["3"] * 13 + ["a1"] * 26)
    bad = "\t".join(["0"] + ["3"] * 12 + ["3.5"] + ["a1"] * 26)
    path = tmp_path / "bad.tsv"
    path.write_text(f"{good}\n{good}\n{bad}\n")
    assert main(["train", "--data", str(path), "--out", str(tmp_path / "r")]) == 2
    assert "line 3, field I13: '3.5' is not an integer" in capsys.readouterr().err


# the demo's story on a short run: from step 2 on, the largest table (C12, 4000 rows: never replicated)
# gets 12 ids per example; whichever rank holds it is then the busiest, and the reshard at step 12 moves
# other tables off it. How many it moves is the planner's call: it applies only moves that lower its
# estimated step time, priced with the cost figures. Measured at start-up on a loaded machine (lookup
# calls ~0.6 ms instead of ~0.1) they made it keep 5 of 6 moves out (max/mean 1.24 after); the runs
# of the story plan with figures recorded on a quiet 2-core machine (--calibration), so they are the same
# whatever the load while the tests run
_QUIET_FIGURES = {"lookup_s_per_call": 1.03e-4, "lookup_s_per_id": 1.06e-7, "lookup_s_per_byte": 8.2e-10,
                  "all_to_all_s_per_byte": 0.0, "all_to_all_s_per_message": 1.95e-3,
                  "all_reduce_s_per_byte": 1.18e-9, "all_reduce_s_per_message": 9.1e-5,
                  "source": "recorded by shardwise train on a quiet 2-core machine"}


@pytest.fixture(scope="module")
def drift(tmp_path_factory):
    """The story's flags: the drift, and the recorded cost figures to plan with."""
    path = tmp_path_factory.mktemp("calibration") / "metrics.json"
    path.write_text(json.dumps({"calibration": _QUIET_FIGURES}))   # as an earlier run's metrics.json holds it
    return ("--drift-at", "2", "--drift-features", "C12", "--drift-factor", "12", "--calibration", str(path))


def _train(out, *extra, rows=True):
    # no row-wise: the planner's uniform-rows estimate would not see a hot row block, nor a gain in moving it
    args = ["train", "--nproc-per-node", "2", "--out", str(out), "--quiet", *(["--rows", "4000"] if rows else []),
            "--sharding-types", "table_wise,data_parallel", *extra]
    assert main(args) == 0
    return json.loads((out / "metrics.json").read_text())


@pytest.fixture(scope="module")
def run_a(tmp_path_factory, drift):
    out = tmp_path_factory.mktemp("run") / "a"
    # a global batch of 192: a resume keeps it, on 1, 2 or 3 processes
    return out, _train(out, "--steps", "24", "--batch-size", "96", "--checkpoint-every", "12", "--reshard-at", "12",
                       *drift)


def test_two_process_run_writes_a_sane_report(run_a, capsys):
    out, m = run_a
    for name in ("metrics.json", "loss.png", "load.png", "plan.md"):
        assert (out / name).stat().st_size > 100, name
    assert (out / "loss.png").read_bytes()[:4] == b"\x89PNG"
    assert m["world_size"] == 2 and m["steps"] == 24 and len(m["loss"]["value"]) == 24
    assert m["loss"]["last"] < m["loss"]["first"] - 0.03
    assert m["auc"]["eval"] > 0.6
    assert m["throughput"]["examples_per_s"] > 0
    first_plan = m["segments"][0]["plan"]
    assert len(first_plan) == 26 and {p["type"] for p in first_plan.values()} <= {"table_wise", "data_parallel"}
    assert [(s["kind"], s["world_size"], s["first_step"], s["last_step"]) for s in m["segments"]] == [
        ("start", 2, 0, 24)]
    # the planner's figures are the given ones (rank 0's copy, broadcast); its estimate is recorded as one
    cal, est = m["calibration"], m["plan_estimate"]
    assert {k: cal[k] for k in _QUIET_FIGURES if k != "source"} == {k: v for k, v in _QUIET_FIGURES.items()
                                                                     if k != "source"}
    assert cal["world_size"] == 2 and cal["source"].startswith(f"given ({_QUIET_FIGURES['source']})"), cal
    assert est["estimated_step_ms"] == max(est["estimated_step_ms_per_rank"]) > 0
    assert "not a measurement" in est["estimate_note"] and est["measured_step_ms"] > 0
    # `shardwise plan --rows 4000` plans the very tables this `train --rows 4000` trained
    assert main(["plan", "--rows", "4000", "--batch-size", "128", "--json"]) == 0
    assert [t["rows"] for t in json.loads(capsys.readouterr().out)["tables"]] == m["table_sizes"]
    assert m["resumes"] == 0 and m["restarts"] == 0 == m["elastic_restarts"]
    # both ranks run on this host: they share its cores
    assert m["segments"][0]["threads_per_process"] == max(1, host_cores() // 2)
    rs = m["reshard"]
    assert rs["at_step"] == 12 and rs["status"] == "applied", rs
    windows = m["load_windows"]
    assert [(w["segment"], w["first_step"], w["last_step"]) for w in windows] == [(0, 0, 2), (0, 2, 12), (0, 12, 24)]
    assert all(len(w["per_rank"]) == 2 for w in windows)
    # median step times: none in steps 0-2 (start-up steps are not timed), then measured ones
    assert windows[0]["step_ms"] is None and windows[1]["step_ms"] > 0 and windows[2]["step_ms"] > 0
    # the demo's headline, on a shorter run: the drift loads the rank holding C12 (measured max/mean
    # ~1.3 under the start-up plan), and the live reshard evens the measured load out (~1.0)
    drift, before, after = windows
    assert drift["label"] == "before the drift" and drift["max_over_mean"] < 1.1, windows
    assert before["label"] == "before reshard" and after["label"] == "after reshard"
    assert before["max_over_mean"] > 1.2 and after["max_over_mean"] < before["max_over_mean"] - 0.1, windows
    assert after["max_over_mean"] < 1.08, windows
    r = m["reshards"][0]
    assert r["changes"] and all(v["type"] in ("table_wise", "data_parallel") for v in r["changes"].values())
    assert max(r["estimated_after"]) < max(r["estimated_before"]) and r["step_ms_before"] == before["step_ms"]
    around = m["step_ms_around_reshards"]
    assert [(x["step"], x["before_ms"], x["before_steps"], x["after_steps"]) for x in around] == [
        (12, before["step_ms"], [2, 12], [12, 22])] and around[0]["after_ms"] > 0
    # each rank's process holds more than its tables (the dense model, batches, torch itself)
    mem = m["memory_per_rank"]
    assert [x["rank"] for x in mem] == [0, 1] and all(x["peak_rss_bytes"] > x["tables_bytes"] > 0 for x in mem)
    plan_md = (out / "plan.md").read_text()
    assert "| t_C1 |" in plan_md and "## segment 1 (start): 2 ranks, steps 0-24" in plan_md


def test_resume_continues_the_same_loss_curve(run_a, drift, tmp_path):
    out_a, m = run_a
    # as if killed after step 12: only that checkpoint survives (the step-24 one is not there)
    b = tmp_path / "b"
    shutil.copytree(out_a / "checkpoints" / "step_00000012", b / "checkpoints" / "step_00000012")
    mb = _train(b, "--steps", "24", "--batch-size", "96", "--checkpoint-every", "12", "--reshard-at", "12",
                "--resume", *drift)
    # the load window restarts with the new processes: the reshard waits for --reshard-min-window
    # (default 10) measured steps, so it comes at step 22 instead of 12; a layout change only reorders
    # float sums, so the curve stays the same to rounding
    np.testing.assert_allclose(mb["loss"]["value"], m["loss"]["value"], rtol=0, atol=1e-5)
    assert mb["reshard"]["at_step"] == 22 and mb["reshard"]["status"] == m["reshard"]["status"]
    assert [(s["kind"], s["first_step"], s["last_step"]) for s in mb["segments"]] == [
        ("start", 0, 12), ("resume", 12, 24)]
    assert mb["resumes"] == 1 and mb["segments"][1]["moves"] == {}
    # the first segment's measured load up to the checkpoint, then the resumed segment's own windows
    assert [(w["segment"], w["label"], w["first_step"], w["last_step"]) for w in mb["load_windows"]] == [
        (0, "before the drift", 0, 2), (0, "after the drift (up to the checkpoint)", 2, 12), (1, "before reshard", 12, 22),
        (1, "after reshard" if m["reshard"]["status"] == "applied" else "after reshard check (no-change)", 22, 24)]
    assert mb["load_windows"][1]["per_rank"] == pytest.approx(m["load_windows"][1]["per_rank"])
    plan_md = (b / "plan.md").read_text()   # the resumed segment's plan is not shown a second time
    assert plan_md.count("Plan in force:") == 1 and "every table where it was at the end of the previous" in plan_md


def test_criteo_file_with_missing_values_trains(text_logs_run):
    out, data, m = text_logs_run
    assert m["steps"] == 8 and all(np.isfinite(m["loss"]["value"]))
    assert m["data"] == data and m["reshard"]["status"] == "off"
    # the skip count covers the one malformed line (counted again where a reader restarts before the end
    # of its first pass), not the ~550 lines with missing values: those were parsed, not dropped
    assert 1 <= m["bad_lines_skipped"] < 10, m["bad_lines_skipped"]
    # an earlier run's checkpoint in the same --out: a fresh run moved it aside for no later --resume to mix in
    assert (out / "checkpoints.prev" / "step_00000099" / "COMMITTED").is_file()
    assert not (out / "checkpoints").exists()


def test_resume_on_another_world_size(run_a, drift, tmp_path):
    out_a, m = run_a
    c = tmp_path / "c"
    shutil.copytree(out_a / "checkpoints" / "step_00000024", c / "checkpoints" / "step_00000024")
    mc = _train(c, "--steps", "28", "--batch-size", "96", "--checkpoint-every", "0", "--reshard-at", "12",
                "--resume", "--world-size", "1", *drift)
    assert mc["world_size"] == 1 and mc["steps"] == 28
    assert mc["loss"]["value"][:24] == m["loss"]["value"]
    # the tables moved onto one rank and kept what they learned: no jump back to the untrained loss
    assert max(mc["loss"]["value"][24:]) < m["loss"]["first"] - 0.02
    saved, seg = m["reshards"][0]["plan_after"], mc["segments"][1]
    assert [(s["kind"], s["world_size"], s["first_step"]) for s in mc["segments"]] == [("start", 2, 0), ("resume", 1, 24)]
    # the live plan of the saved run is kept where its ranks still exist; the rest is placed on rank 0, with why
    stays = {t for t, p in saved.items() if p["type"] == "data_parallel" or p["ranks"] == [0]}
    # (the saved plan may keep nothing on rank 0 alone: then every table is placed again, each with why)
    assert all(seg["plan"][t] == saved[t] for t in stays)
    assert set(seg["moves"]) == set(saved) - stays
    assert all(mv["why"] == "rank 1 is gone (2 -> 1 ranks)" for mv in seg["moves"].values())
    assert all(len(w["per_rank"]) == mc["segments"][w["segment"]]["world_size"] for w in mc["load_windows"])
    # on another world size the reshard is due again, after a full window: 4 steps are not enough
    assert mc["reshard"]["status"] == "not-reached" and len(mc["reshards"]) == 1


def test_resume_on_more_ranks_keeps_the_plan_then_rebalances(run_a, drift, tmp_path):
    out_a, m = run_a
    g = tmp_path / "g"
    shutil.copytree(out_a / "checkpoints" / "step_00000024", g / "checkpoints" / "step_00000024")
    mg = _train(g, "--steps", "32", "--batch-size", "96", "--checkpoint-every", "0", "--reshard-at", "12",
                "--reshard-min-window", "4", "--resume", "--world-size", "3", *drift)
    seg = mg["segments"][1]
    assert (seg["kind"], seg["world_size"], seg["moves"]) == ("resume", 3, {})   # nothing had to move
    assert max(mg["loss"]["value"][24:]) < m["loss"]["first"] - 0.02
    # the new rank starts with only the replicated tables; the second reshard (4 steps into the
    # segment) spreads the measured load over all three ranks
    r = mg["reshards"][-1]
    assert (r["segment"], r["step"], r["status"]) == (1, 28, "applied"), r
    before, after = [w for w in mg["load_windows"] if w["segment"] == 1]
    assert before["per_rank"][2] < min(before["per_rank"][:2])
    assert after["max_over_mean"] < before["max_over_mean"] - 0.1, (before, after)


def test_killed_mid_save_restarts_and_continues_the_curve(run_a, drift, tmp_path, monkeypatch, capfd):
    _, m = run_a
    # the last rank dies after writing its step-12 files, before the commit; the elastic launcher
    # restarts the group, which resumes from step 6 (the cut-off save must not count). This run never
    # reshards while run_a does at step 12: with one id per bag a layout change only reorders float
    # sums, so the curves must still agree -- before step 12 exactly, after it to rounding.
    monkeypatch.setenv("SHARDWISE_TRAIN_FAULT", "save:12")
    d = tmp_path / "d"
    md = _train(d, "--steps", "18", "--batch-size", "96", "--checkpoint-every", "6", "--reshard-at", "0",
                "--max-restarts", "1", *drift)
    assert md["elastic_restarts"] == 1 == md["restarts"] and m["elastic_restarts"] == 0
    # announced on the console (by the restarted rank 0, even with --quiet)
    assert "elastic restart 1 of 1: a worker failed and the group was restarted; resuming from the checkpoint " \
           "of step 6" in " ".join(capfd.readouterr().out.split())
    assert [(s["kind"], s["attempt"], s["first_step"]) for s in md["segments"]] == [("start", 0, 0), ("restart", 1, 6)]
    assert md["loss"]["value"][:12] == m["loss"]["value"][:12]
    np.testing.assert_allclose(md["loss"]["value"][12:], m["loss"]["value"][12:18], rtol=0, atol=1e-5,
                               err_msg=f"the curve changed after run_a's reshard ({m['reshard']['status']})")
    assert sorted(p.name for p in (d / "checkpoints").iterdir()) == ["step_00000006", "step_00000012", "step_00000018"]


def test_resume_needs_a_matching_checkpoint(run_a, tmp_path, capsys):
    assert main(["train", "--resume", "--out", str(tmp_path / "empty")]) == 2
    assert "no committed checkpoint" in capsys.readouterr().err
    out_a, _ = run_a
    assert main(["train", "--resume", "--out", str(out_a), "--rows", "5000", "--steps", "30"]) == 2
    err = capsys.readouterr().err   # the features whose sizes differ, not two lists of 26 numbers
    assert "saved with other table sizes: C2 (" in err and " saved, " in err and "more; resume with the same" in err


def test_a_dead_worker_is_named_with_the_way_to_resume(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("SHARDWISE_TRAIN_FAULT", "step:5")   # the last rank dies after step 5, no restarts
    out = tmp_path / "e"
    args = ["train", "--nproc-per-node", "2", "--out", str(out), "--quiet", "--rows", "400", "--steps", "8",
            "--batch-size", "32", "--checkpoint-every", "4", "--reshard-at", "0"]
    assert main(args) == 1
    err = capfd.readouterr().err
    assert "shardwise train: the job failed:" in err
    assert "rank 1 (local rank 1, pid" in err and "exited with code 17 without a Python error" in err
    assert "last committed checkpoint (step_00000004 in" in err and "run the same command with --resume" in err
    # the advice works: the resumed job finishes, and its story says so
    monkeypatch.delenv("SHARDWISE_TRAIN_FAULT")
    assert main(args + ["--resume"]) == 0
    m = json.loads((out / "metrics.json").read_text())
    assert m["steps"] == 8 and m["resumes"] == 1 and m["restarts"] == 0
    assert [(s["kind"], s["first_step"], s["last_step"]) for s in m["segments"]] == [("start", 0, 4), ("resume", 4, 8)]


def _write_log(path, seed: int, n: int) -> None:
    """A Criteo-format log (missing values included); ``.gz`` paths are gzip-compressed."""
    import gzip

    data = SyntheticClicks(seed, default_cardinalities(300)).batch(0, n)
    rng = np.random.default_rng(seed)
    lines = []
    for d, ids, y in zip(data.dense, data.ids, data.labels):
        ints = ["" if rng.random() < 0.2 else str(int(v)) for v in d]
        cats = ["" if i < 0 or rng.random() < 0.2 else format(int(i) * 2654435761 % 2**32, "08x") for i in ids]
        lines.append("\t".join([str(int(y)), *ints, *cats]))
    text = "\n".join(lines) + "\n"
    if str(path).endswith(".gz"):
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)


def _logs_with_a_bad_line(paths: list, seeds_rows: list) -> list:
    """``_write_log`` for each (seed, rows), then one malformed line appended to the last (plain) file."""
    for path, (seed, rows) in zip(paths, seeds_rows):
        _write_log(path, seed, rows)
    with open(paths[-1], "a") as f:
        f.write("1\tnot-a-number" + "\t" * 38 + "\n")
    return paths


@pytest.fixture(scope="module")
def text_logs_run(tmp_path_factory):
    """One 2-process run on Criteo-format text logs, read by three tests (each launch costs ~10 s of
    process start-up on 2 cores; the flags below are independent of one another): two files at once
    (gzip and plain), missing values, a malformed line skipped, --memory-per-rank, and an earlier run's
    checkpoint left in --out. ``(out, --data, metrics)``."""
    tmp = tmp_path_factory.mktemp("text_logs")
    logs = _logs_with_a_bad_line([tmp / "day_0.tsv.gz", tmp / "day.tsv"], [(3, 150), (1, 400)])
    out = tmp / "r"
    old = out / "checkpoints" / "step_00000099"
    old.mkdir(parents=True)
    (old / "COMMITTED").write_text("99\n")
    (old / "meta.json").write_text("{}")
    data = f"{logs[0]},{logs[1]}"
    m = _train(out, "--data", data, "--skip-bad-lines", "--memory-per-rank", "64MiB", "--steps", "8",
               "--batch-size", "32", "--checkpoint-every", "0", "--reshard-at", "0", "--dense-parallel", "ddp")
    return out, data, m


def test_table_sizes_and_held_out_eval_from_the_user(tmp_path, text_logs_run):
    train, held = tmp_path / "day_0.tsv.gz", tmp_path / "day_1.tsv"
    _write_log(train, 1, 300)
    _write_log(held, 2, 120)
    sizes = [7 + 13 * i for i in range(26)]
    m = _train(tmp_path / "r", "--data", str(train), "--eval-data", str(held), "--steps", "6", "--batch-size", "32",
               "--num-embeddings-per-feature", ",".join(map(str, sizes)), "--max-rows", "200",
               "--checkpoint-every", "0", "--reshard-at", "0", "--dense-parallel", "ddp")
    want = [min(n, 200) for n in sizes]
    assert m["table_sizes"] == want
    assert [r["rows"] for r in m["plan_end"]] == want            # the plan is of those tables
    assert m["data"] == str(train) and m["eval_data"] == f"held-out file {held}"
    assert m["auc"]["eval"] is None or 0.0 <= m["auc"]["eval"] <= 1.0
    assert m["memory_per_rank_source"].startswith("measured on rank 0") and m["memory_per_rank_bytes"] > 2**20
    _, _, mf = text_logs_run   # a run with --memory-per-rank and no held-out data
    assert mf["memory_per_rank_bytes"] == 64 << 20 and mf["memory_per_rank_source"] == "--memory-per-rank"
    assert mf["eval_data"].startswith("first rows of") and "also trained on" in mf["eval_data"]
    # no --calibration: the planner's figures were measured at start-up (rank 0's, broadcast)
    cal = mf["calibration"]
    assert cal["world_size"] == 2 and "measured on rank 0" in cal["source"] and cal["lookup_s_per_call"] > 0


def test_prepare_then_train_with_bad_lines_skipped(tmp_path, capsys, text_logs_run):
    logs = _logs_with_a_bad_line([tmp_path / "day_0.tsv.gz", tmp_path / "day_1.tsv"], [(3, 150), (4, 150)])
    prepared = tmp_path / "prepared"
    assert main(["data", "prepare", str(logs[0]), str(logs[1]), "--out", str(prepared), "--skip-bad-lines",
                 "--categorify", "--min-count", "2"]) == 0
    sizes = json.loads((prepared / "manifest.json").read_text())["table_sizes"]
    # the folder's sizes are the default: no --num-embeddings-per-feature needed
    m = _train(tmp_path / "r", "--data", str(prepared), "--eval-fraction", "0.1", "--steps", "4", "--batch-size",
               "32", "--checkpoint-every", "0", "--reshard-at", "0", "--dense-parallel", "ddp", rows=False)
    assert m["table_sizes"] == sizes
    assert m["eval_data"] == f"last 30 of 300 rows of {prepared} (held out)" and m["eval_rows"] == 30
    # the text logs themselves, several files at once, the bad line skipped and counted
    _, data, m2 = text_logs_run
    assert "," in data and m2["steps"] == 8 and m2["bad_lines_skipped"] >= 1
