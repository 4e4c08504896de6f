"""What ``shardwise train`` says before it launches anything: bad lines, a resume's batch and table
sizes, more processes than cores, a memory budget the tables cannot fit (each a message or refusal
with the value, the rule and a fix; no worker starts)."""

from __future__ import annotations

import json

import pytest

from shardwise.cli import main
from shardwise.train import TrainConfig
from shardwise.train.launching.prelaunch import cores_warning, resumed_batch

GOOD = "\t".join(["1"] + ["3"] * 13 + ["a1"] * 26)


@pytest.fixture
def launches(monkeypatch):
    """No worker starts: the launch records the config it was given and returns rank 0's metrics."""
    import shardwise.train.launching.launch as launch_mod

    seen = []

    def fake(cfg, *a, **k):
        seen.append(cfg)
        return {"bad_lines_skipped": 1}
    monkeypatch.setattr(launch_mod, "launch", fake)
    return seen


def test_a_bad_line_names_skip_bad_lines(tmp_path, capsys, launches):
    path = tmp_path / "day.tsv"
    path.write_text(f"{GOOD}\n{GOOD.replace('3', 'x', 1)}\n")
    assert main(["train", "--data", str(path), "--out", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "day.tsv line 2, field I1: 'x' is not an integer" in err and "--skip-bad-lines" in err, err
    assert main(["data", "prepare", str(path), "--out", str(tmp_path / "p")]) == 2
    assert "--skip-bad-lines" in capsys.readouterr().err
    # with the flag: the whole file's count before the launch, the run's count after it
    assert main(["train", "--data", str(path), "--out", str(tmp_path / "r"), "--quiet", "--skip-bad-lines", "--rows", "1000"]) == 0
    out, err = capsys.readouterr()
    assert "--skip-bad-lines: 1 malformed line(s) in the inputs (each file read in full before launch)" in err
    assert "1 malformed line(s) skipped in the lines this run read (1 in the whole inputs)" in out
    assert not launches[0].resume


def _checkpoint(tmp_path, world: int, **cfg) -> str:
    step = tmp_path / "r" / "checkpoints" / "step_00000012"
    step.mkdir(parents=True)
    (step / "COMMITTED").write_text("12\n")
    (step / "meta.json").write_text(json.dumps({"step": 12, "world": world, "story": {},
                                                "config": TrainConfig(**cfg).to_json()}))
    return str(tmp_path / "r")


def test_resume_keeps_the_global_batch_or_names_the_sizes_that_do(tmp_path, capsys, launches):
    out = _checkpoint(tmp_path, world=2, batch_size=128)
    assert main(["train", "--resume", "--out", out, "--quiet", "--nproc-per-node", "4"]) == 0
    assert launches[-1].batch_size == 64
    assert "--resume on 4 processes (saved on 2): 64 examples per process and step, keeping the saved run's " \
           "global batch of 256" in capsys.readouterr().err
    assert main(["train", "--resume", "--out", out, "--quiet", "--nproc-per-node", "3"]) == 2
    err = capsys.readouterr().err
    assert "global batch of 256 examples per step does not split evenly over 3; resume on 2 or 4 processes" in err
    assert len(launches) == 1


def test_resumed_batch():
    assert resumed_batch(512, 1) == 512 and resumed_batch(512, 8) == 64
    with pytest.raises(ValueError, match="resume on 4 or 8 processes"):
        resumed_batch(512, 6)
    with pytest.raises(ValueError, match="resume on 5 processes"):
        resumed_batch(5, 7)


def test_resume_with_other_table_sizes_names_the_features(tmp_path, capsys, launches):
    sizes = [100 + i for i in range(26)]
    out = _checkpoint(tmp_path, world=2, num_embeddings_per_feature=sizes)
    now = list(sizes)
    now[2], now[20] = 7, 9
    assert main(["train", "--resume", "--out", out, "--quiet", "--num-embeddings-per-feature",
                 ",".join(map(str, now))]) == 2
    err = capsys.readouterr().err
    assert "sizes that differ in 2 feature(s): C3: 102 (now 7), C21: 120 (now 9)" in err, err
    assert str(sizes) not in err and not launches


def test_more_processes_than_cores_warn(tmp_path, capsys, launches, monkeypatch):
    import shardwise.train.launching.host as host

    monkeypatch.setattr(host, "host_cores", lambda: 2)
    assert main(["train", "--out", str(tmp_path / "r"), "--quiet", "--nproc-per-node", "8"]) == 0
    assert "warning: 8 processes on 2 cores" in capsys.readouterr().err and len(launches) == 1
    assert main(["train", "--out", str(tmp_path / "r"), "--quiet", "--nproc-per-node", "2"]) == 0
    assert "warning" not in capsys.readouterr().err
    assert cores_warning(1, 1) is None and "--nproc-per-node 1" in cores_warning(2, 1)


@pytest.mark.parametrize("flags, typed", [(["--memory-per-rank", "1MiB"], "--memory-per-rank"),
                                          (["--memory-per-rank-mb", "1"], "--memory-per-rank-mb")])
def test_a_memory_budget_the_tables_cannot_fit_fails_before_launch(flags, typed, tmp_path, capsys, launches):
    assert main(["train", "--out", str(tmp_path / "r"), "--quiet", *flags]) == 2
    err = capsys.readouterr().err
    # the demo's 26 tables: 2,399,022 rows x 16, fp32 weights + one Adagrad accumulator each
    assert f"{typed} 1.0 MiB: the 26 tables need " in err and "in all (weights + Adagrad state)" in err, err
    assert f"Raise {typed} (e.g. {typed} " in err and not launches
    other = "--memory-per-rank-mb" if typed == "--memory-per-rank" else "--memory-per-rank "
    assert other not in err


def test_a_bad_line_found_in_the_job_gives_one_error_and_no_resume_advice(tmp_path, capfd, monkeypatch):
    # a log too large to be read before the launch (the limit lowered here): the bad line, in the second
    # file, is met by the job's readers on every rank; --resume would meet it again
    import shardwise.train.data as train_data

    monkeypatch.setattr(train_data, "_FULL_CHECK_BYTES", 0)
    good, bad = tmp_path / "a.tsv", tmp_path / "b.tsv"
    good.write_text(f"{GOOD}\n" * 256)
    bad.write_text(f"{GOOD}\n" * 10 + GOOD.replace("3", "x", 1) + "\n" + f"{GOOD}\n" * 100)
    out = tmp_path / "r"
    assert main(["train", "--nproc-per-node", "2", "--out", str(out), "--quiet", "--rows", "400", "--steps", "8",
                 "--batch-size", "32", "--checkpoint-every", "4", "--reshard-at", "0",
                 "--data", f"{good},{bad}"]) == 1
    err = capfd.readouterr().err
    # one line for the cause every rank shares (no launcher traceback wall), the way on without --resume
    assert "Traceback" not in err and err.count("raised ValueError") == 1, err
    assert "b.tsv line 11, field I1: 'x' is not an integer" in err and "rerun with --skip-bad-lines" in err
    assert "--resume alone would read the same line again" in err and "same command with --resume" not in err
    assert "Traceback" in (out / "failure.txt").read_text()
