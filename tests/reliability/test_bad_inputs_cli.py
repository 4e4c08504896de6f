"""Bad-input matrix for the ``shardwise`` command and its Criteo TSV reader.

Every row must fail before any worker process starts: exit status 2, a message on stderr naming the
value, and no report folder or checkpoint written.
"""

import time

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
]


@pytest.mark.parametrize("flags, fragment", FLAG_ROWS)
def test_bad_train_flags_fail_before_any_worker_starts(flags, fragment, tmp_path, capsys):
    out = tmp_path / "report"
    start = time.perf_counter()
    assert main(["train", "--out", str(out), "--quiet", *flags]) == 2
    err = capsys.readouterr().err
    assert fragment in err, err
    assert not out.exists(), "a failed argument check must not write a report folder"
    # starting workers takes seconds; an argument error must not get that far
    assert time.perf_counter() - start < 5


DATA_ROWS = [
    (f"{GOOD}\n{GOOD}\t\n", "line 2: expected 40 tab-separated fields"),
    (f"{GOOD}\n" + "\t".join(GOOD.split("\t")[:30]) + "\n", "line 2: expected 40 tab-separated fields"),
    (f"{_with(0, '2')}\n", "line 1, field label: '2' must be 0 or 1"),
    (f"{_with(0, '')}\n", "field label: '' must be 0 or 1"),
    (f"{GOOD}\n{GOOD}\n{_with(5, 'x')}\n", "line 3, field I5: 'x' is not an integer"),
    (f"{_with(13, '1e3')}\n", "field I13: '1e3' is not an integer"),
    (f"{_with(16, 'zz')}\n", "field C3: 'zz' is not a hex id"),
    (f"{_with(40 - 26, '-5')}\n", "field C1: '-5' is negative"),
    ("", "no examples; the file is empty"),
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
    (["bench", "--only", "no_such_bench"], "no benchmark scripts"),
])
def test_other_subcommands_reject_bad_flags(argv, fragment, capsys):
    assert main(argv) == 2
    assert fragment in capsys.readouterr().err
