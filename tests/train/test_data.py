"""Synthetic click log and Criteo TSV reader: determinism, slicing, missing values, errors."""

import numpy as np
import pytest
import torch

from shardwise.sparse import KeyedJaggedTensor
from shardwise.train.data import (
    NUM_SPARSE, SPARSE_NAMES, ClickLogBatch, CriteoTSV, SyntheticClicks, default_cardinalities, hidden_model_logits,
    read_ahead, to_model_inputs,
)
from shardwise.train.model import auc
from tests.sparse.test_sparse import _same_kjt

CARDS = default_cardinalities(500)


def test_synthetic_is_deterministic_and_slices_agree():
    a, b = SyntheticClicks(3, CARDS), SyntheticClicks(3, CARDS)
    whole = a.batch(4000, 300)      # crosses a generation block boundary
    left, right = b.batch(4000, 100), b.batch(4100, 200)
    for f in ("dense", "ids", "labels"):
        np.testing.assert_array_equal(getattr(whole, f), np.concatenate([getattr(left, f), getattr(right, f)]))
    assert not np.array_equal(SyntheticClicks(4, CARDS).batch(0, 300).labels, SyntheticClicks(3, CARDS).batch(0, 300).labels)


def test_synthetic_ids_follow_a_power_law_and_labels_are_learnable():
    data = SyntheticClicks(0, default_cardinalities(2000))
    b = data.batch(0, 20000)
    assert b.ids.max(axis=0).tolist() <= [c - 1 for c in data.cards]
    big = int(np.argmax(data.cards))
    ids = b.ids[:, big][b.ids[:, big] >= 0]
    # Zipf(1): the first 1% of rows draws far more than 1% of the lookups
    assert (ids < data.cards[big] // 100).mean() > 0.3
    assert 0.05 < b.labels.mean() < 0.6
    assert auc(torch.from_numpy(hidden_model_logits(data, b)), torch.from_numpy(b.labels)) > 0.75


def _line(label="1", ints=None, cats=None):
    ints = ints if ints is not None else [str(i) for i in range(13)]
    cats = cats if cats is not None else [format(0xABC0 + i, "x") for i in range(NUM_SPARSE)]
    return "\t".join([label, *ints, *cats]) + "\n"


def test_criteo_tsv_with_missing_values(tmp_path):
    ints = ["", "-2"] + ["5"] * 11
    cats = [""] * 3 + ["ff"] * (NUM_SPARSE - 3)
    path = tmp_path / "day.tsv"
    path.write_text(_line() + _line("0", ints, cats))
    data = CriteoTSV(path)
    assert len(data) == 2
    b = data.batch(1, 3)        # cycles: lines 2, 1, 2
    assert b.labels.tolist() == [0, 1, 0]
    assert b.dense[0, :2].tolist() == [0, 0]          # missing and negative both read as 0
    assert b.ids[0, :3].tolist() == [-1, -1, -1] and b.ids[0, 3] == 0xFF
    dense, kjt, y = to_model_inputs(b, [100] * NUM_SPARSE, torch.device("cpu"))
    assert kjt.stride() == 3 and kjt["C1"].lengths().tolist() == [0, 1, 0]
    assert kjt["C4"].values().tolist() == [0xFF % 100, (0xABC0 + 3) % 100, 0xFF % 100]
    assert torch.allclose(dense[1], torch.log1p(torch.arange(13.0)))


@pytest.mark.parametrize("bad, where", [
    (_line(ints=["1"] * 6 + ["x7"] + ["1"] * 6), "line 2, field I7"),
    (_line(cats=["zz"] + ["a"] * 25), "line 2, field C1"),
    (_line(label="2"), "line 2, field label"),
    ("1\t2\t3\n", "line 2: expected 40"),
])
def test_malformed_tsv_names_line_and_field(tmp_path, bad, where):
    path = tmp_path / "bad.tsv"
    path.write_text(_line() + bad)
    with pytest.raises(ValueError, match=where):
        CriteoTSV(path)


def test_per_rank_streams_cover_the_log_once_per_pass(tmp_path):
    # the job's indexing (rank r reads cursor + r*b, the cursor advancing by world*b) over rank-split
    # text streams: over one pass the ranks' rows together are the file's rows, each exactly once
    from shardwise.data import ClickLogReader
    from shardwise.train.data import CriteoTSV, PerRank

    rng = np.random.default_rng(3)
    path = tmp_path / "day.tsv"
    path.write_text("".join(_line(str(i % 2), ints=[str(i)] + [str(int(x)) for x in rng.integers(0, 9, 12)],
                                  cats=[format(int(x), "x") for x in rng.integers(0, 2**32, 26)])
                            for i in range(3000)))
    world, b = 2, 16
    readers = [PerRank(ClickLogReader(str(path), r, world, block_size=4096, prefetch=False), r, world)
               for r in range(world)]
    seen = {r: [] for r in range(world)}
    counts = []
    for r in range(world):
        reader = ClickLogReader(str(path), r, world, block_size=4096, prefetch=False)
        n = 0
        for _, batch in reader.blocks():
            n += len(batch.labels)
        counts.append(n)
    assert sum(counts) == 3000 and min(counts) > 0
    cursor = 0
    for _ in range(max(counts) // b + 1):
        for r in range(world):
            got = readers[r].batch(cursor + r * b, b)
            seen[r].append(got.dense[:, 0])
        cursor += world * b
    firsts = np.concatenate([np.concatenate(seen[r])[:counts[r]] for r in range(world)])
    assert sorted(firsts.astype(int).tolist()) == list(range(3000))   # I1 holds the line number
    assert len(CriteoTSV(str(path))) == 3000


def _hidden_logits_reference(data, batch):
    """The per-feature loop the vectorised hidden model replaced (ground truth, bit for bit)."""
    logit = data.bias + np.log1p(batch.dense) @ data.dense_w
    for j in range(NUM_SPARSE):
        ok = batch.ids[:, j] >= 0
        logit[ok] += data.effects[j][batch.ids[ok, j]]
    return logit


@pytest.mark.parametrize("seed, rows, missing", [(0, 100000, 0.01), (5, 300, 0.3)])
def test_hidden_model_logits_equal_the_per_feature_loop(seed, rows, missing):
    data = SyntheticClicks(seed, default_cardinalities(rows), missing_rate=missing)
    b = data.batch(3000, 5000)
    got, want = hidden_model_logits(data, b), _hidden_logits_reference(data, b)
    assert got.dtype == want.dtype and np.array_equal(got.view(np.int64), want.view(np.int64))


def test_hidden_model_logits_refuse_ids_beyond_a_table():
    data = SyntheticClicks(0, CARDS)
    b = data.batch(0, 4)
    b.ids[2, 5] = CARDS[5]
    with pytest.raises(ValueError, match="beyond its table"):
        hidden_model_logits(data, b)


def _block_reference(data, index):
    """A sub-block as the generator drew it with one numpy call per use and new arrays at every step
    (the ground truth the native loops must equal bit for bit)."""
    rng = np.random.default_rng(np.random.SeedSequence([data.seed, 0x5EED, 256, index]))
    raw = np.maximum(np.floor(np.exp(data.dense_mu + 1.2 * rng.standard_normal((256, 13)))) - 1.0, 0.0)
    raw[rng.random((256, 13)) < 0.05] = 0.0
    cards = np.asarray(data.cards, dtype=np.float64)
    u = rng.random((256, NUM_SPARSE))
    ids = np.minimum(np.floor(np.exp(u * np.log(cards + 1.0))) - 1.0, cards - 1).astype(np.int64)
    ids[rng.random((256, NUM_SPARSE)) < data.missing_rate] = -1
    dense = raw.astype(np.float32)
    logit = _hidden_logits_reference(data, ClickLogBatch(dense, ids, np.zeros(256, np.float32)))
    return dense, ids, (rng.random(256) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)


@pytest.mark.parametrize("seed, rows, missing", [(0, 100000, 0.01), (5, 300, 0.3), ((1 << 40) + 3, 300, 0.01)])
def test_sub_blocks_equal_the_one_draw_per_use_generator(seed, rows, missing):
    # many sub-blocks: the native loop's exp (libm's) and numpy's vectorised one may differ in the last
    # bit, which the floors hide unless a value lands on an integer; labels compare sums and exps too.
    # A seed or index of 2**32 or more is two words of the SeedSequence's entropy.
    data = SyntheticClicks(seed, default_cardinalities(rows), missing_rate=missing)
    for index in [*range(200), 4095, 1 << 20, (1 << 33) + 5]:
        got, want = data._block(index), _block_reference(data, index)
        for g, w in zip((got.dense, got.ids, got.labels), want):
            assert g.dtype == w.dtype and np.array_equal(g, w)


@pytest.mark.parametrize("rows, start, count, cards", [
    (100000, 512, 256, None),     # the job's batch: one sub-block of the synthetic log
    (300, 100, 300, None),        # across sub-blocks
    (300, 0, 64, [7] * NUM_SPARSE),   # ids beyond the tables fold modulo their size
    (300, 0, 0, None),            # no examples: arrays of no rows
])
def test_model_inputs_equal_the_checked_kjt(rows, start, count, cards):
    data = SyntheticClicks(1, default_cardinalities(rows), missing_rate=0.2)
    b, cards = data.batch(start, count), cards or data.cards
    dense, kjt, y = to_model_inputs(b, cards, torch.device("cpu"))
    folded = np.where(b.ids >= 0, b.ids % np.asarray(cards), -1).T   # key-major, missing = -1
    want = KeyedJaggedTensor(SPARSE_NAMES, torch.from_numpy(folded[folded >= 0]),
                             lengths=torch.from_numpy((folded >= 0).astype(np.int64).reshape(-1))).sync()
    _same_kjt(kjt, want)
    assert torch.equal(dense, torch.from_numpy(np.log1p(b.dense))) and torch.equal(y, torch.from_numpy(b.labels))


def test_a_rank_generates_only_the_sub_blocks_it_reads():
    # rank 1 of 2 at 256 examples per rank: the job reads cursor + 256, the cursor advancing by 512
    data, made = SyntheticClicks(3, CARDS), []
    real = data._block
    data._block = lambda index: made.append(index) or real(index)
    mine = [data.batch(step * 512 + 256, 256) for step in range(4)]
    assert made == [1, 3, 5, 7]   # 256-example sub-blocks: only this rank's rows are drawn
    # the same examples as one reader of the whole stream (any world size sees the same log)
    whole = SyntheticClicks(3, CARDS).batch(0, 4 * 512)
    for step, got in enumerate(mine):
        rows = slice(step * 512 + 256, step * 512 + 512)
        for f in ("dense", "ids", "labels"):
            np.testing.assert_array_equal(getattr(got, f), getattr(whole, f)[rows])


def test_read_ahead_reads_in_order_and_at_most_depth_ahead():
    made = []
    batches = read_ahead(lambda start, n: made.append(start) or (start, n), iter(range(0, 50, 5)), 5, depth=4)
    assert made == []                       # nothing is read before the first batch is asked for
    assert next(batches) == (0, 5) and made == [0, 5, 10, 15]
    assert list(batches) == [(s, 5) for s in range(5, 50, 5)]   # 10 starts: the last read holds two
    assert made == list(range(0, 50, 5))


def test_a_read_of_no_examples_is_empty_and_bad_reads_are_refused():
    b = SyntheticClicks(0, CARDS).batch(700, 0)
    assert (b.dense.shape, b.ids.shape, b.labels.shape) == ((0, 13), (0, NUM_SPARSE), (0,))
    assert (b.dense.dtype, b.ids.dtype, b.labels.dtype) == (np.float32, np.int64, np.float32)
    for start, count in ((-1, 4), (0, -2)):
        with pytest.raises(ValueError, match="non-negative"):
            SyntheticClicks(0, CARDS).batch(start, count)
