"""Bad lines: CriteoTSV's messages (file, line, field, fix) or skipped and counted; bad inputs."""

import gzip

import pytest

from shardwise.data import ClickLogReader, PreparedClickLogs, open_click_logs, prepare
from shardwise.data.parse import SKIP_HINT
from shardwise.train.data import CriteoTSV

from .common import line, write_log

BAD = {
    "field": line(ints=["1"] * 6 + ["x7"] + ["1"] * 6),
    "hex": line(cats=["zz"] + ["a"] * 25),
    "negative id": line(cats=["a"] * 4 + ["-1f"] + ["a"] * 21),
    "17 hex digits": line(cats=["1" * 17] + ["a"] * 25),
    "label": line(label="2"),
    "columns": "1\t2\t3\n",
    "not text": line(cats=["a\xe9"] + ["a"] * 25),
    "int64 range": line(ints=["99999999999999999999"] + ["1"] * 12),
    "plus sign": line(ints=["+5"] + ["1"] * 12),
    "exponent": line(ints=["1e3"] + ["1"] * 12),
    "underscore": line(ints=["1_000"] + ["1"] * 12),
    "0x prefix": line(cats=["0x1f"] + ["a"] * 25),
    "empty label": line(label=""),
    "negative past int64": line(ints=["-" + "9" * 20] + ["1"] * 12),
    "NUL byte": line(cats=["ab\0"] + ["a"] * 25),
    "carriage return inside": line(cats=["ab\rcd"] + ["a"] * 25),
    "not text, short": "1\t\xff\xfe\n",
}


def _message(fn, *args, **kwargs) -> str:
    with pytest.raises(ValueError) as e:
        fn(*args, **kwargs)
    return str(e.value)


@pytest.mark.parametrize("kind", sorted(BAD))
@pytest.mark.parametrize("gz", [False, True])
def test_bad_line_raises_the_line_readers_message(tmp_path, kind, gz):
    extra = {250: BAD[kind], 350: BAD["label"]}     # deep in the file: a later block, the first bad line wins
    plain = write_log(tmp_path / "day.tsv", 400, seed=7, extra=extra)
    # the line reader's message, and the way on without fixing the file
    want = f"{_message(CriteoTSV, plain)} ({SKIP_HINT})"
    assert "day.tsv line 251" in want
    path = write_log(tmp_path / "day.tsv.gz", 400, seed=7, gz=True, extra=extra) if gz else plain
    got = _message(ClickLogReader(path, block_size=16384).batch, 0, 400)
    assert got == want.replace("day.tsv", path.name)


@pytest.mark.parametrize("gz", [False, True])
def test_rank_reading_a_later_stripe_names_the_right_line(tmp_path, gz):
    path = write_log(tmp_path / "day.tsv", 1300, seed=8, extra={1250: BAD["hex"]})
    want = f"{_message(CriteoTSV, path)} ({SKIP_HINT})"
    if gz:
        path = write_log(tmp_path / "day.tsv.gz", 1300, seed=8, gz=True, extra={1250: BAD["hex"]})
        want = want.replace("day.tsv", "day.tsv.gz")
    readers = [ClickLogReader(path, rank=r, world=2, block_size=16384) for r in range(2)]
    msgs = []
    for r in readers:
        try:
            list(r.blocks())
        except ValueError as e:
            msgs.append(str(e))
    assert msgs == [want]      # exactly one rank owns that line, and it reports the file's line number


def test_skip_bad_lines_counts_and_keeps_the_rest(tmp_path):
    extra = {k: BAD[kind] for k, kind in zip(range(5, 5 + len(BAD) * 30, 30), sorted(BAD))}
    extra[401] = "\n"          # blank lines are not bad lines (CriteoTSV passes over them)
    path = write_log(tmp_path / "day.tsv", 600, seed=9, extra=extra)
    clean = write_log(tmp_path / "clean.tsv", 600, seed=9, extra={k: "\n" for k in extra})
    ref = CriteoTSV(clean)
    r = ClickLogReader(path, block_size=16384, skip_bad_lines=True)
    got = r.batch(0, len(ref))
    for f in ("dense", "ids", "labels"):
        assert (getattr(got, f) == getattr(ref, f)).all(), f
    assert r.bad_lines == len(BAD)
    r.batch(len(ref), 2 * len(ref))       # a second pass does not count them again
    assert r.bad_lines == len(BAD) and r.num_rows == len(ref) == 600 - len(BAD) - 1


@pytest.mark.parametrize("prefetch", [False, True])
def test_a_restart_inside_the_first_pass_counts_each_bad_line_once(tmp_path, prefetch):
    # two bad lines in the first blocks; going back to row 0 before the pass ends re-reads them
    path = write_log(tmp_path / "day.tsv", 600, seed=9, extra={3: BAD["hex"], 150: BAD["label"]})
    r = ClickLogReader(path, block_size=16384, skip_bad_lines=True, prefetch=prefetch)
    r.batch(200, 10)
    assert r.num_rows is None and r.bad_lines == 2
    r.batch(0, 10)                        # behind the current block: the reader starts over
    r.batch(300, 10)
    assert r.num_rows is None and r.bad_lines == 2
    r.batch(0, 1200)                      # through the end of the pass and round again
    assert r.num_rows == 598 and r.bad_lines == 2


def test_a_file_of_bad_lines_only(tmp_path):
    (tmp_path / "bad.tsv").write_text(BAD["columns"] * 3)
    r = ClickLogReader(tmp_path / "bad.tsv", skip_bad_lines=True)
    assert "no examples" in _message(r.batch, 0, 1) and r.bad_lines == 3


def test_empty_and_missing_files(tmp_path):
    (tmp_path / "empty.tsv").write_bytes(b"")
    msg = _message(ClickLogReader, tmp_path / "empty.tsv")
    assert "empty.tsv" in msg and "empty (0 bytes)" in msg and "leave it out" in msg
    (tmp_path / "blank.tsv.gz").write_bytes(gzip.compress(b"\n\n"))
    msg = _message(ClickLogReader(tmp_path / "blank.tsv.gz").batch, 0, 1)
    assert "blank.tsv.gz" in msg and "no examples" in msg
    msg = _message(ClickLogReader, tmp_path / "nope.tsv")
    assert "nope.tsv" in msg and "no such file" in msg


def test_gz_that_is_not_gzip_and_cut_short(tmp_path):
    (tmp_path / "fake.tsv.gz").write_text(line())
    msg = _message(ClickLogReader, tmp_path / "fake.tsv.gz")
    assert "fake.tsv.gz" in msg and "not gzip-compressed" in msg and "rename it" in msg
    data = gzip.compress(line().encode() * 2000)
    (tmp_path / "cut.tsv.gz").write_bytes(data[: len(data) // 2])
    msg = _message(ClickLogReader(tmp_path / "cut.tsv.gz").batch, 0, 10)
    assert "cut.tsv.gz" in msg and "damaged or cut short" in msg


def test_folders(tmp_path):
    (tmp_path / "empty_dir").mkdir()
    msg = _message(open_click_logs, tmp_path / "empty_dir")
    assert "empty_dir" in msg and "without prepared click logs" in msg and "shardwise data prepare" in msg
    f = write_log(tmp_path / "a.tsv", 5)
    msg = _message(open_click_logs, [f, tmp_path / "empty_dir"])
    assert "is a folder" in msg
    assert "no input files" in _message(open_click_logs, [])
    prepare([f], tmp_path / "p")
    (tmp_path / "p" / "ids.bin").write_bytes(b"\0" * 8)          # damaged after preparing
    msg = _message(PreparedClickLogs, tmp_path / "p")
    assert "ids.bin" in msg and "prepare the folder again" in msg


def test_argument_checks(tmp_path):
    f = write_log(tmp_path / "a.tsv", 5)
    assert "0 <= rank < world" in _message(ClickLogReader, f, rank=2, world=2)
    assert "block_size=100" in _message(ClickLogReader, f, block_size=100)
    # a 5-line file is one stripe: two ranks cannot both get lines, and both ranks say so
    for rank in range(2):
        msg = _message(ClickLogReader, f, rank=rank, world=2)
        assert "cannot feed 2 ranks" in msg and "smaller block_size" in msg
    assert "start=-1" in _message(ClickLogReader(f).batch, -1, 4)
