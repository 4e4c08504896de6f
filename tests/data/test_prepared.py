"""prepare -> memory-mapped reader round trip, per-rank rows, categorify, and the CLI command."""

import json

import numpy as np
import pytest

from shardwise.cli import main
from shardwise.data import FeatureMapping, PreparedClickLogs, open_click_logs, prepare
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
    assert (got[:, 1:] == 0).all()                  # one id seen everywhere: row 0, and the OOV row
    assert m["table_sizes"] == [5] + [2] * 25 and data.table_sizes == m["table_sizes"]
    assert m["vocabulary"]["oov_rows"] == [4] + [1] * 25
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
        assert m["table_sizes"][j] == len(frequent) + 1    # the rare/OOV row is always there


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
    assert f"the last row of each is the rare/OOV row): {','.join(map(str, sizes))}" in out
    assert f"train with: shardwise train --data {tmp_path / 'p'}" in out
    assert main(["data", "prepare", str(a), "--out", str(tmp_path / "q"), "--min-count", "2"]) == 2
    assert "--min-count 2 needs --categorify" in capsys.readouterr().err
    assert main(["data", "prepare", str(tmp_path / "none.tsv"), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "shardwise data: error:" in err and "none.tsv" in err and not (tmp_path / "r").exists()
    assert main(["data", "prepare", str(a), "--out", str(tmp_path / "s"), "--block-size", "8 parsecs"]) == 2
    assert "--block-size '8 parsecs' is not a size" in capsys.readouterr().err


def test_feature_mapping_sends_unseen_and_rare_ids_to_the_oov_row():
    m = FeatureMapping.from_vocab(np.array([9, 3, 12]), rare_ids=2)
    ids = np.array([3, 9, 12, 8, 10, 0, 2**62, -1])        # 8, 10: between seen ids; 2**62: above them all
    assert m.apply(ids).tolist() == [1, 0, 2, 3, 3, 3, 3, -1]
    assert m.table_size == 4 and m.oov_row == 3 and m.count_oov(ids) == 4
    empty = FeatureMapping.from_vocab(np.zeros(0, np.int64))
    assert empty.apply(np.array([5, -1])).tolist() == [0, -1] and empty.table_size == 1


def test_prepare_with_the_training_vocabulary(tmp_path):
    train = tmp_path / "train.tsv"
    train.write_text("".join(line(cats=[format(v, "x")] + ["5"] * 25) for v in [0xA] * 3 + [0xB] * 2 + [0xC]))
    held = tmp_path / "held.tsv"
    held.write_text("".join(line(cats=[format(v, "x")] + ["7"] * 25) for v in [0xB, 0xC, 0xD, 0xA]))
    m = prepare([train], tmp_path / "p", categorify=True, min_count=2)
    assert m["table_sizes"][0] == 3 and m["vocabulary"]["oov_rows"][0] == 2
    h = prepare([held], tmp_path / "h", vocab=tmp_path / "p")
    assert h["vocabulary"]["digest"] == m["vocabulary"]["digest"] and h["table_sizes"] == m["table_sizes"]
    got = PreparedClickLogs(tmp_path / "h").batch(0, 4).ids
    assert got[:, 0].tolist() == [1, 2, 2, 0]        # 0xC rare in training, 0xD never seen: both the OOV row
    assert (got[:, 1:] == 1).all()                    # 7 never seen in C2..C26 (training had 5: row 0)
    assert h["oov_ids"] == [2] + [4] * 25
    own = prepare([held], tmp_path / "own", categorify=True)        # a vocabulary of its own: another digest
    assert own["vocabulary"]["digest"] != m["vocabulary"]["digest"]


def test_prepare_vocab_refusals(tmp_path, capsys):
    a = write_log(tmp_path / "a.tsv", 20, seed=3)
    prepare([a], tmp_path / "raw")
    with pytest.raises(ValueError, match="was not categorified, so it has no vocabulary"):
        prepare([a], tmp_path / "x", vocab=tmp_path / "raw")
    prepare([a], tmp_path / "cat", categorify=True)
    assert main(["data", "prepare", str(a), "--out", str(tmp_path / "y"), "--vocab", str(tmp_path / "cat"),
                 "--categorify"]) == 2
    assert "pass --vocab alone" in capsys.readouterr().err and not (tmp_path / "y").exists()
    assert main(["data", "prepare", str(a), "--out", str(tmp_path / "z"), "--vocab", str(tmp_path / "cat")]) == 0
    out = capsys.readouterr().out
    assert "ids it never saw (-> OOV row): 0 in all" in out and f"--eval-data {tmp_path / 'z'}" in out


def test_a_version_1_manifest_still_loads(tmp_path):
    """A folder prepared before vocabularies had a digest and an OOV row per feature: it trains as it was
    (its table sizes), and mapping new ids through it is refused where it has no rare row."""
    a = tmp_path / "a.tsv"
    a.write_text("".join(line(cats=[format(v, "x")] + ["5"] * 25) for v in [1, 1, 2, 3]))
    m = prepare([a], tmp_path / "p", categorify=True, min_count=2)
    path = tmp_path / "p" / "manifest.json"
    old = {k: v for k, v in m.items() if k != "vocabulary"}
    old.update(version=1, table_sizes=[2] + [1] * 25)       # what version 1 wrote: no OOV row without rare ids
    path.write_text(json.dumps(old))
    data = PreparedClickLogs(tmp_path / "p")
    assert data.table_sizes == [2] + [1] * 25
    v = data.vocabulary
    assert v.oov_rows == [1] + [None] * 25 and v.apply(np.array([[9] + [5] * 25]))[0, :2].tolist() == [1, 0]
    with pytest.raises(ValueError, match="no out-of-vocabulary row"):
        v.apply(np.array([[1] + [6] * 25]))
    with pytest.raises(ValueError, match="prepared by an older shardwise"):
        prepare([a], tmp_path / "q", vocab=tmp_path / "p")
