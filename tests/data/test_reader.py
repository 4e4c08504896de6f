"""ClickLogReader against the existing line-by-line reader (CriteoTSV) on the same files."""

import gzip

import numpy as np
import pytest

from shardwise.data import ClickLogReader, open_click_logs
from shardwise.train.data import CriteoTSV

from .common import line, write_log


def _same(batch, ref, idx=None):
    for f in ("dense", "ids", "labels"):
        want = getattr(ref, f) if idx is None else getattr(ref, f)[idx]
        np.testing.assert_array_equal(getattr(batch, f), want, err_msg=f)


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("block_size", [16384, 1 << 20])
def test_values_equal_the_line_reader(tmp_path, gz, block_size):
    """Missing fields, negatives, counts past 8 and 16 digits, mixed-case and 64-bit hex ids; small
    blocks put many lines across block edges."""
    plain = write_log(tmp_path / "day.tsv", 1500, seed=1)
    ref = CriteoTSV(plain)
    path = write_log(tmp_path / "day.tsv.gz", 1500, seed=1, gz=True) if gz else plain
    r = ClickLogReader(path, block_size=block_size)
    _same(r.batch(0, len(ref)), ref)
    assert r.num_rows is None                       # not known until the stream ends ...
    _same(r.batch(len(ref) - 5, 12), ref, np.arange(len(ref) - 5, len(ref) + 7) % len(ref))   # ... and cycles
    assert r.num_rows == len(ref) and r.bad_lines == 0
    _same(r.batch(10, 3), ref, [10, 11, 12])        # going back restarts the stream


def test_blank_lines_crlf_and_no_final_newline(tmp_path):
    text = line() + "\n" + "   \n" + line("0").replace("\n", "\r\n") + "\t" * 39 + "\n" + line("1")[:-1]
    (tmp_path / "a.tsv").write_text(text)
    ref = CriteoTSV(tmp_path / "a.tsv")
    r = ClickLogReader(tmp_path / "a.tsv")
    _same(r.batch(0, 3), ref)
    assert len(ref) == 3 and r.bad_lines == 0


def test_several_files_read_in_order(tmp_path):
    a = write_log(tmp_path / "a.tsv", 500, seed=2)
    b = write_log(tmp_path / "b.tsv.gz", 300, seed=3, gz=True)
    c = write_log(tmp_path / "c.tsv", 300, seed=3)
    ra, rc = CriteoTSV(a), CriteoTSV(c)
    r = open_click_logs([a, b, str(a)], block_size=8192)
    got = r.batch(0, 1300)
    for f in ("dense", "ids", "labels"):
        want = np.concatenate([getattr(ra, f), getattr(rc, f), getattr(ra, f)])
        np.testing.assert_array_equal(getattr(got, f), want)
    blocks = list(r.blocks(count_bad=False))
    assert {k for k, _ in blocks} == {0, 1, 2} and sum(len(b.labels) for _, b in blocks) == 1300


def test_prefetch_off_gives_the_same_stream(tmp_path):
    path = write_log(tmp_path / "a.tsv", 800, seed=4)
    a, b = ClickLogReader(path, block_size=4096), ClickLogReader(path, block_size=4096, prefetch=False)
    for start in (0, 500, 1700, 3):
        _same(a.batch(start, 300), b.batch(start, 300))
    a.close()


def test_gz_and_plain_agree_byte_for_byte(tmp_path):
    plain = write_log(tmp_path / "d.tsv", 700, seed=5)
    (tmp_path / "d.tsv.gz").write_bytes(gzip.compress(plain.read_bytes()))
    x = ClickLogReader(plain, block_size=4096).batch(0, 700)
    y = ClickLogReader(tmp_path / "d.tsv.gz", block_size=4096).batch(0, 700)
    _same(x, y)


def test_extremes_of_int64(tmp_path):
    ints = [str(2**63 - 1), "-" + str(2**63 - 1), "0" * 30 + "12", "-0"] + ["1"] * 9
    cats = ["f" * 16, "7" + "f" * 15, "8" + "0" * 15, "0" * 16, "FfFf"] + ["1"] * 21
    (tmp_path / "x.tsv").write_text(line(ints=ints, cats=cats) * 3)
    ref = CriteoTSV(tmp_path / "x.tsv")
    got = ClickLogReader(tmp_path / "x.tsv").batch(0, 3)
    _same(got, ref)
    assert got.ids[0, :5].tolist() == [2**63 - 1, 2**63 - 1, 0, 0, 0xFFFF] and got.dense[0, 0] == float(2**63 - 1)
