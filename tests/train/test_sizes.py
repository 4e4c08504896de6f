"""Table sizes from the data (a categorified folder's manifest) or the flags, and each refusal."""

import json

import pytest

from shardwise.cli import main
from shardwise.data import prepare
from shardwise.train.checkpoint import resume_point
from shardwise.train.config import TrainConfig
from shardwise.train.data import default_cardinalities
from shardwise.train.sizes import job_tables

from ..data.common import write_log


@pytest.fixture
def folders(tmp_path):
    log = write_log(tmp_path / "a.tsv", 120, seed=9)
    m = prepare([log], tmp_path / "cat", categorify=True, min_count=2)
    prepare([log], tmp_path / "raw")
    return log, tmp_path / "cat", tmp_path / "raw", m["table_sizes"]


def test_the_synthetic_log_keeps_the_demo_sizes():
    assert job_tables(TrainConfig()).sizes == default_cardinalities(100_000)
    assert job_tables(TrainConfig(rows=500)).sizes == default_cardinalities(500)
    assert job_tables(TrainConfig(num_embeddings_per_feature=[9] * 26)).sizes == [9] * 26


def test_a_categorified_folder_gives_the_sizes(folders):
    _, cat, _, sizes = folders
    t = job_tables(TrainConfig(data=str(cat)))
    assert t.sizes == sizes and t.vocab_digest.startswith("sha256:") and not t.folded
    assert job_tables(TrainConfig(data=str(cat), num_embeddings_per_feature=sizes)).sizes == sizes
    capped = job_tables(TrainConfig(data=str(cat), max_rows=3))
    assert capped.sizes == [min(s, 3) for s in sizes] and capped.folded


def test_flags_that_disagree_with_the_folder_are_refused(folders, capsys):
    _, cat, _, sizes = folders
    other = list(sizes)
    other[2] += 1
    other[20] = 5 if sizes[20] != 5 else 6
    with pytest.raises(ValueError, match=rf"C3 \({sizes[2]} in the data, {sizes[2] + 1} given\), C21 "):
        job_tables(TrainConfig(data=str(cat), num_embeddings_per_feature=other))
    argv = ["train", "--data", str(cat), "--rows", "4000", "--out", str(cat.parent / "r")]
    assert main(argv) == 2       # before any process starts
    assert "--rows 4000 shapes the synthetic log's tables" in capsys.readouterr().err
    assert not (cat.parent / "r").exists()


def test_raw_ids_need_sizes(folders, capsys):
    log, _, raw, _ = folders
    for data, fragment in ((log, "holds raw ids"), (raw, "was prepared without --categorify, so it holds raw ids")):
        assert main(["train", "--data", str(data), "--out", str(log.parent / "r")]) == 2
        err = capsys.readouterr().err
        assert fragment in err and "--num-embeddings-per-feature" in err and "--categorify" in err, err
    t = job_tables(TrainConfig(data=str(log), rows=1000))
    assert t.sizes == default_cardinalities(1000) and t.folded


def test_a_resume_with_other_sizes_names_the_features(folders, tmp_path):
    _, cat, _, sizes = folders
    step = tmp_path / "r" / "checkpoints" / "step_00000004"
    step.mkdir(parents=True)
    (step / "COMMITTED").write_text("4\n")
    saved = list(sizes)
    saved[4] += 7
    meta = {"step": 4, "story": {}, "table_sizes": saved, "config": TrainConfig(data=str(cat)).to_json()}
    (step / "meta.json").write_text(json.dumps(meta))
    cfg = TrainConfig(data=str(cat), out=str(tmp_path / "r"), resume=True)
    with pytest.raises(ValueError, match=rf"other table sizes: C5 \({sizes[4] + 7} saved, {sizes[4]} now\); "):
        resume_point(cfg)
    meta["table_sizes"] = sizes
    (step / "meta.json").write_text(json.dumps(meta))
    assert resume_point(cfg) == step


def test_a_resume_of_an_older_synthetic_run_without_rows(tmp_path):
    """Runs saved before --rows defaulted to None saved rows=100000: resuming them without --rows works."""
    step = tmp_path / "r" / "checkpoints" / "step_00000004"
    step.mkdir(parents=True)
    (step / "COMMITTED").write_text("4\n")
    old = json.loads(TrainConfig().to_json())
    old["rows"] = 100000
    (step / "meta.json").write_text(json.dumps({"step": 4, "story": {}, "config": json.dumps(old)}))
    assert resume_point(TrainConfig(out=str(tmp_path / "r"), resume=True)) == step
    with pytest.raises(ValueError, match=r"--rows 100000 \(now 5000\)"):
        resume_point(TrainConfig(out=str(tmp_path / "r"), resume=True, rows=5000))
