"""prepare -> memory-mapped reader round trip, per-rank rows, categorify, and the CLI command."""

import json

import numpy as np
import pytest

from shardwise.cli import main
from shardwise.data import PreparedClickLogs, open_click_logs, prepare
from shardwise.train.data import CriteoTSV, NUM_SPARSE, SPARSE_NAMES

from .common import line, write_log


def _concat(refs, f):
    return np.concatenate([getattr(r, f) for r in refs])


def test_round_trip_equals_the_line_reader(tmp_path):
    a = write_log(tmp_path / "a.tsv", 700, seed=21)
    b = write_log(tmp_path / "b.tsv.gz", 300, seed=22, gz=True)
    b_plain = write_log(tmp_path / "b.tsv", 300, seed=22)
    m = prepare([a, b], tmp_path / "p", block_size=8192)      # many small blocks appended
    refs = [CriteoTSV(a), CriteoTSV(b_plain)]
    assert m["rows"] == 1000 and [s["rows"] for s in m["sources"]] == [700, 300]
    assert m["table_sizes"] is None and not m["categorified"]
    on_disk = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert on_disk["columns"]["ids"] == {"file": "ids.bin", "dtype": "int64", "shape": [1000, NUM_SPARSE]}
    data = open_click_logs(tmp_path / "p")
    assert isinstance(data, PreparedClickLogs) and len(data) == 1000
    assert isinstance(data._cols["ids"], np.memmap)
    got = data.batch(0, 1000)
    for f in ("dense", "ids", "labels"):
        np.testing.assert_array_equal(getattr(got, f), _concat(refs, f))
    wrap = data.batch(990, 20)          # cycles past the end
    np.testing.assert_array_equal(wrap.ids, _concat(refs, "ids")[np.arange(990, 1010) % 1000])


def test_ranks_own_contiguous_rows(tmp_path):
    a = write_log(tmp_path / "a.tsv", 301, seed=23)
    prepare([a], tmp_path / "p")
    ref = CriteoTSV(a)
    parts = [PreparedClickLogs(tmp_path / "p", rank=r, world=3) for r in range(3)]
    assert [p.num_rows for p in parts] == [100, 100, 101]
    got = np.concatenate([p.batch(0, p.num_rows).ids for p in parts])
    np.testing.assert_array_equal(got, ref.ids)
    np.testing.assert_array_equal(parts[1].batch(99, 2).ids, ref.ids[[199, 100]])   # rank 1 cycles in its rows


def test_prepare_skips_bad_lines_and_refuses_to_overwrite(tmp_path):
    a = write_log(tmp_path / "a.tsv", 50, seed=24, extra={7: "1\t2\n", 9: line(label="x")})
    with pytest.raises(ValueError, match="a.tsv line 8: expected 40"):
        prepare([a], tmp_path / "p")
    assert not (tmp_path / "p").exists()       # a stopped preparation removes what it wrote
    prepare([a], tmp_path / "p", skip_bad_lines=True)   # so running it again just works
    m = prepare([a], tmp_path / "q", skip_bad_lines=True)
    assert m["rows"] == 48 and m["bad_lines_skipped"] == 2
    with pytest.raises(ValueError, match="exists and is not an empty folder"):
        prepare([a], tmp_path / "q")


def _ids_file(tmp_path, column):
    """A log whose C1 column is ``column`` (raw ids, -1 = missing); other ids constant."""
    lines = [line(cats=["" if v < 0 else format(v, "x")] + ["5"] * 25) for v in column]
    (tmp_path / "c.tsv").write_text("".join(lines))
    return tmp_path / "c.tsv"


def test_categorify_by_frequency_with_a_min_count_bucket(tmp_path):
    rng = np.random.default_rng(0)
    counts = {0xAA: 9, 0x10: 5, 0x11: 5, 0xFF: 3, 0x01: 1, 0x02: 1}   # 0x10 and 0x11 tie: smaller id first
    column = np.array([k for k, c in counts.items() for _ in range(c)] + [-1] * 4)
    rng.shuffle(column)
    m = prepare([_ids_file(tmp_path, column)], tmp_path / "p", categorify=True, min_count=3, block_size=4096)
    want_row = {0xAA: 0, 0x10: 1, 0x11: 2, 0xFF: 3, 0x01: 4, 0x02: 4, -1: -1}   # rare ids share row 4
    data = PreparedClickLogs(tmp_path / "p")
    got = data.batch(0, len(column)).ids
    np.testing.assert_array_equal(got[:, 0], [want_row[v] for v in column])
    assert (got[:, 1:] == 0).all()                  # one id seen everywhere: row 0, no bucket
    assert m["table_sizes"] == [5] + [1] * 25 and data.table_sizes == m["table_sizes"]
    assert m["rare_ids"][0] == 2 and m["distinct_ids"][0] == 6
    vocab = np.load(tmp_path / "p" / "vocab" / f"{SPARSE_NAMES[0]}.npy")
    assert vocab.tolist() == [0xAA, 0x10, 0x11, 0xFF]


def test_categorify_matches_a_plain_count_across_blocks_and_files(tmp_path):
    a = write_log(tmp_path / "a.tsv", 400, seed=25)
    b = write_log(tmp_path / "b.tsv", 400, seed=26)
    m = prepare([a, b], tmp_path / "p", categorify=True, min_count=2, block_size=4096)
    raw = np.concatenate([CriteoTSV(a).ids, CriteoTSV(b).ids])
    got = PreparedClickLogs(tmp_path / "p").batch(0, 800).ids
    for j in range(NUM_SPARSE):
        ids, cnt = np.unique(raw[:, j][raw[:, j] >= 0], return_counts=True)
        order = sorted(zip(-cnt, ids))
        frequent = [int(i) for c, i in order if -c >= 2]
        row = {i: k for k, i in enumerate(frequent)}
        rare = len(ids) - len(frequent)
        want = [-1 if v < 0 else row.get(int(v), len(frequent)) for v in raw[:, j]]
        assert got[:, j].tolist() == want, SPARSE_NAMES[j]
        assert m["table_sizes"][j] == max(len(frequent) + (rare > 0), 1)


def test_cli_prepare_prints_table_sizes(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["data", "prepare", "--help"])
    assert e.value.code == 0 and "--categorify" in capsys.readouterr().out
    a = write_log(tmp_path / "a.tsv.gz", 200, seed=27, gz=True)
    assert main(["data", "prepare", str(a), "--out", str(tmp_path / "p"), "--categorify", "--min-count", "2",
                 "--block-size", "64KiB"]) == 0
    out = capsys.readouterr().out
    sizes = json.loads((tmp_path / "p" / "manifest.json").read_text())["table_sizes"]
    assert "prepared 200 rows from 1 file(s)" in out
    assert f"--num-embeddings-per-feature {','.join(map(str, sizes))}" in out
    assert main(["data", "prepare", str(a), "--out", str(tmp_path / "q"), "--min-count", "2"]) == 2
    assert "--min-count 2 needs --categorify" in capsys.readouterr().err
    assert main(["data", "prepare", str(tmp_path / "none.tsv"), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "shardwise data: error:" in err and "none.tsv" in err and not (tmp_path / "r").exists()
    assert main(["data", "prepare", str(a), "--out", str(tmp_path / "s"), "--block-size", "8 parsecs"]) == 2
    assert "--block-size '8 parsecs' is not a size" in capsys.readouterr().err
