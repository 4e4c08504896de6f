"""Bad-input matrix for the ``shardwise`` command and its Criteo TSV reader.

Every row must fail before any worker process starts: exit status 2, a message on stderr naming the
value, and no report folder or checkpoint written.
"""

import json

import pytest

from shardwise.cli import main

GOOD = "\t".join(["1"] + ["3"] * 13 + ["a1"] * 26)


def _with(pos, value):
    fields = GOOD.split("\t")
    fields[pos] = value
    return "\t".join(fields)


FLAG_ROWS = [
    (["--steps", "0"], "steps=0 must be a positive int"),
    (["--steps", "-5"], "steps=-5"),
    (["--batch-size", "0"], "batch_size=0"),
    (["--rows", "4"], "rows=4 must be >= 8"),
    (["--dim", "0"], "dim=0"),
    (["--checkpoint-every", "-1"], "checkpoint_every=-1"),
    (["--reshard-at", "-3"], "reshard_at=-3"),
    (["--nproc-per-node", "0"], "--nproc-per-node=0"),
    (["--max-restarts", "-1"], "--max-restarts=-1"),
    (["--nnodes", "2"], "needs --rdzv-endpoint"),
    (["--nnodes", "3:1"], "need 1 <= MIN <= MAX"),
    (["--nnodes", "two"], "must be N or MIN:MAX"),
    (["--node-rank", "1"], "--node-rank=1 must be in [0, 1)"),
    (["--nnodes", "2", "--rdzv-endpoint", "localhost:1", "--node-rank", "-1"], "--node-rank=-1 must be in [0, 2)"),
    (["--seed", "-1"], "seed=-1 must be an int in [0, 2**63)"),
    (["--seed", str(2**64)], "seed=18446744073709551616"),
    (["--collective-timeout", "0"], "collective_timeout=0.0 must be a positive number"),
    (["--collective-timeout", "-1"], "collective_timeout=-1.0"),
]


@pytest.mark.parametrize("flags, fragment", FLAG_ROWS)
def test_bad_train_flags_fail_before_any_worker_starts(flags, fragment, tmp_path, capsys, monkeypatch):
    import torch.distributed.launcher.api as launcher_api

    def no_launch(*a, **k):   # the elastic launcher is where worker processes would start
        raise AssertionError(f"workers were launched for bad flags {flags}")
    monkeypatch.setattr(launcher_api, "elastic_launch", no_launch)
    out = tmp_path / "report"
    assert main(["train", "--out", str(out), "--quiet", *flags]) == 2
    err = capsys.readouterr().err
    assert fragment in err, err
    assert not out.exists(), "a failed argument check must not write a report folder"


DATA_ROWS = [
    (f"{GOOD}\n{GOOD}\t\n", "line 2: expected 40 tab-separated fields"),
    (f"{GOOD}\n" + "\t".join(GOOD.split("\t")[:30]) + "\n", "line 2: expected 40 tab-separated fields"),
    (f"{_with(0, '2')}\n", "line 1, field label: '2' must be 0 or 1"),
    (f"{_with(0, '')}\n", "field label: '' must be 0 or 1"),
    (f"{GOOD}\n{GOOD}\n{_with(5, 'x')}\n", "line 3, field I5: 'x' is not an integer"),
    (f"{_with(13, '1e3')}\n", "field I13: '1e3' is not an integer"),
    (f"{_with(16, 'zz')}\n", "field C3: 'zz' is not a hex id"),
    (f"{_with(40 - 26, '-5')}\n", "field C1: '-5' is negative"),
    (f"{_with(20, 'f' * 17)}\n", "field C7: 'fffffffffffffffff' has 17 hex digits; ids must fit in 64 bits"),
    (f"{GOOD}\n{_with(3, '9' * 30)}\n", "line 2, field I3: '" + "9" * 30 + "' is outside the 64-bit integer range"),
    (f"{_with(1, '-' + '9' * 20)}\n", "field I1: '-" + "9" * 20 + "' is outside the 64-bit"),
    (f"{_with(2, '+5')}\n", "field I2: '+5' is not an integer"),
    (f"{_with(2, '1_000')}\n", "field I2: '1_000' is not an integer"),
    (f"{_with(30, '0x1f')}\n", "field C17: '0x1f' is not a hex id"),
    ("", "the file is empty"),
    ("\n\n", "no examples"),
]


@pytest.mark.parametrize("text, fragment", DATA_ROWS)
def test_malformed_criteo_files_are_rejected_with_line_and_field(text, fragment, tmp_path, capsys):
    path = tmp_path / "day.tsv"
    path.write_text(text)
    before = path.read_bytes()
    out = tmp_path / "report"
    assert main(["train", "--data", str(path), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert fragment in err, err
    assert not out.exists() and path.read_bytes() == before


def test_criteo_ids_of_64_bits_parse_and_stay_non_negative(tmp_path):
    # a 16-hex-digit hash with the top bit set must not turn negative: -1 marks a missing id
    from shardwise.train.data import CriteoTSV

    path = tmp_path / "day.tsv"
    path.write_text(f"{_with(14, 'f' * 16)}\n{_with(14, '7' + 'f' * 15)}\n{_with(3, str(2**63 - 1))}\n")
    data = CriteoTSV(path)
    assert data.ids[:2, 0].tolist() == [2**63 - 1, 2**63 - 1] and (data.ids >= 0).all()
    assert data.dense[2, 2] == float(2**63 - 1)


@pytest.mark.parametrize("flag", ["--out", "--checkpoint-dir"])
def test_an_output_path_that_is_a_file_fails_before_any_worker_starts(flag, tmp_path, capsys):
    # found late, it would throw the training away: at the first checkpoint or at the final report
    blocker = tmp_path / "a_file"
    blocker.write_text("keep me")
    for target, fragment in ((blocker, "is a file, not a folder"), (blocker / "sub", "is not a writable folder")):
        argv = ["train", "--quiet", flag, str(target)] + ([] if flag == "--out" else ["--out", str(tmp_path / "r")])
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"{flag} {str(target)!r}" in err and fragment in err, err
    assert blocker.read_text() == "keep me" and not (tmp_path / "r").exists()


def test_a_refused_resume_leaves_the_checkpoint_unchanged(tmp_path, capsys):
    # a committed checkpoint saved with other table sizes: --resume must refuse it, before any worker
    # starts, and leave every byte of it (and the report folder) alone
    from shardwise.train.config import TrainConfig

    from ._runner import digest

    step = tmp_path / "r" / "checkpoints" / "step_00000012"
    step.mkdir(parents=True)
    (step / "COMMITTED").write_text("12\n")
    (step / "meta.json").write_text(json.dumps({"step": 12, "config": TrainConfig(rows=4000).to_json()}))
    (step / "__0_0.distcp").write_bytes(b"shard bytes")
    before = digest([tmp_path / "r"])
    assert main(["train", "--resume", "--quiet", "--out", str(tmp_path / "r"), "--rows", "5000"]) == 2
    assert "--rows 4000 (now 5000)" in capsys.readouterr().err
    assert digest([tmp_path / "r"]) == before


def test_missing_data_file(tmp_path, capsys):
    assert main(["train", "--data", str(tmp_path / "nope.tsv"), "--out", str(tmp_path / "r")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_binary_garbage_names_the_line(tmp_path, capsys):
    path = tmp_path / "day.tsv"
    path.write_bytes((GOOD + "\n").encode() + b"\xff\xfe\x00garbage\n")
    assert main(["train", "--data", str(path), "--out", str(tmp_path / "r")]) == 2
    assert "day.tsv line 2" in capsys.readouterr().err


@pytest.mark.parametrize("argv, fragment", [
    (["plan", "--world", "0"], "--world=0"),
    (["plan", "--tables", "0"], "--tables=0"),
    (["plan", "--memory-mb", "-1"], "--memory-mb=-1.0 must be > 0"),
    (["plan", "--memory-mb", "nan"], "--memory-mb=nan must be > 0"),
    (["plan", "--memory-mb", "0.001"], "does not fit"),
    (["bench", "--only", "no_such_bench"], "no benchmark scripts"),
    (["validate", "--op", "no_such_op"], "no registered op matches ['no_such_op']"),
    (["validate", "--world-sizes", "0"], "each mesh must be a size >= 1"),
])
def test_other_subcommands_reject_bad_flags(argv, fragment, capsys):
    assert main(argv) == 2
    err = capsys.readouterr()
    assert fragment in err.err + err.out, err


def test_eval_fraction_of_text_logs_is_refused_before_launch(tmp_path, capsys):
    path = tmp_path / "day.tsv"
    path.write_text(GOOD + "\n")
    assert main(["train", "--data", str(path), "--eval-fraction", "0.1", "--out", str(tmp_path / "r")]) == 2
    assert "prepare them first" in capsys.readouterr().err
