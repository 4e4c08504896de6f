"""Scoring the held-out set: every rank's share once, exact AUC against one process, the vocabulary rules."""

import json

import numpy as np
import pytest
import torch

from shardwise.cli import main
from shardwise.data import PreparedClickLogs, prepare
from shardwise.testing import run_on_ranks, worker_mesh
from shardwise.train.data import ClickLogBatch, SyntheticClicks, default_cardinalities
from shardwise.train.evaluate import eval_vocabulary, held_out_parts, text_parts

from ..data.common import write_log

CARDS = default_cardinalities(64)


def _rows(lo, hi):
    return SyntheticClicks(3, CARDS).batch(lo, hi - lo)


def _model():
    from shardwise.embedding import EmbeddingBagCollection
    from shardwise.train import model

    torch.manual_seed(1)
    dense = getattr(model, "DLRMDense", None) or model.DenseArch    # the job's dense part (its name with the model zoo)
    return EmbeddingBagCollection(model.make_tables(CARDS, 4), device="cpu", init_seed=5), dense(26, 4)


class _Dense:
    def __init__(self, arch):
        self.arch = arch

    def predict(self, dense, pooled):
        with torch.no_grad():
            return self.arch(dense, pooled)


def _score_on_ranks(rank, world, sizes, fail_rank):
    from shardwise.embedding import GreedyShardingPlanner, ShardingType, shard
    from shardwise.train.evaluate import evaluate
    from shardwise.train.model import make_ebc, make_tables

    mesh = worker_mesh(world)
    tables = make_tables(CARDS, 4)
    plan = GreedyShardingPlanner(world, 1 << 30, sharding_types=[ShardingType.ROW_WISE]).plan(tables)
    sparse = shard(make_ebc(CARDS, 4, 5), plan, mesh=mesh)
    _, arch = _model()

    def parts():
        lo = sum(sum(s) for s in sizes[:rank])
        for k, n in enumerate(sizes[rank]):
            if rank == fail_rank and k == 1:
                raise ValueError("day_9.tsv line 3: boom")
            yield _rows(lo, lo + n)
            lo += n
    try:
        r = evaluate(sparse, _Dense(arch), parts(), CARDS, torch.device("cpu"))
    except ValueError as e:
        return str(e)
    return r.auc, r.rows


def test_every_rank_scores_its_share_and_the_auc_is_exact():
    sizes = [[5, 7, 20], [4]]            # uneven: rank 1 pads, then sends empty batches
    results = run_on_ranks(_score_on_ranks, 2, sizes, None, timeout=180)
    ebc, arch = _model()
    from shardwise.train.data import to_model_inputs
    from shardwise.train.model import auc

    dense, kjt, y = to_model_inputs(_rows(0, 36), CARDS, torch.device("cpu"))
    with torch.no_grad():
        want = auc(torch.sigmoid(arch(dense, ebc(kjt).values())), y)
    for got_auc, rows in results:
        assert rows == 36 and got_auc == pytest.approx(want, abs=1e-9)


def test_a_failed_read_on_one_rank_stops_every_rank():
    results = run_on_ranks(_score_on_ranks, 2, [[5, 5], [5, 5]], 1, timeout=180)
    assert all("reading the held-out data failed" in r and "rank 1: day_9.tsv line 3: boom" in r for r in results)


def test_held_out_rows_are_split_once_over_the_ranks(tmp_path):
    data = SyntheticClicks(0, CARDS)

    class Finite:
        def __len__(self):
            return 23

        def batch(self, s, c):
            return data.batch(s, c)
    for world, cap, want in ((3, None, 23), (2, 10, 10), (4, 100, 23)):
        labels = [b.labels for r in range(world) for b in held_out_parts(Finite(), r, world, cap)]
        np.testing.assert_array_equal(np.concatenate(labels), data.batch(0, want).labels)
    log = write_log(tmp_path / "h.tsv", 900, seed=2)          # ~170 KiB: every rank gets stripes
    from shardwise.train.data import CriteoTSV

    ref = CriteoTSV(log)
    per_rank = [[b for b in text_parts([log], r, 3, None, False)] for r in range(3)]
    assert all(per_rank)
    got = np.concatenate([b.ids for part in per_rank for b in part])
    assert sorted(map(tuple, got)) == sorted(map(tuple, ref.ids))       # each line once
    capped = [sum(len(b.labels) for b in text_parts([log], r, 3, 100, False)) for r in range(3)]
    assert capped == [34, 33, 33]


def test_which_vocabulary_the_held_out_data_goes_through(tmp_path, capsys):
    train, held = write_log(tmp_path / "t.tsv", 80, seed=1), write_log(tmp_path / "h.tsv", 30, seed=2)
    prepare([train], tmp_path / "cat", categorify=True)
    vocab = PreparedClickLogs(tmp_path / "cat").vocabulary
    prepare([held], tmp_path / "same", vocab=tmp_path / "cat")
    prepare([held], tmp_path / "own", categorify=True)
    prepare([held], tmp_path / "raw")
    assert eval_vocabulary(vocab, str(held)) is vocab                  # text: the job maps it
    assert eval_vocabulary(vocab, str(tmp_path / "raw")) is vocab      # raw ids in a folder: the same
    assert eval_vocabulary(vocab, str(tmp_path / "same")) is None      # already through the same vocabulary
    assert eval_vocabulary(None, str(held)) is None
    with pytest.raises(ValueError, match="categorified .* but --data holds raw ids"):
        eval_vocabulary(None, str(tmp_path / "same"))
    argv = ["train", "--data", str(tmp_path / "cat"), "--eval-data", str(tmp_path / "own"),
            "--out", str(tmp_path / "r")]
    assert main(argv) == 2         # refused before the launch
    err = capsys.readouterr().err
    assert "was categorified with another vocabulary than --data" in err and "--vocab TRAIN_DIR" in err
    assert not (tmp_path / "r").exists()


def test_padding_rows_are_empty():
    from shardwise.train.evaluate import _padded

    b = _padded(ClickLogBatch(np.ones((2, 13), np.float32), np.zeros((2, 26), np.int64), np.ones(2, np.float32)), 5)
    assert b.ids.shape == (5, 26) and (b.ids[2:] == -1).all() and (b.dense[2:] == 0).all()
    assert _padded(None, 3).labels.shape == (3,)


def test_eval_rows_flag(capsys):
    from shardwise.train.config import TrainConfig

    assert main(["train", "--eval-rows", "0", "--quiet"]) == 2
    assert "eval_rows=0 must be a positive int" in capsys.readouterr().err
    # configs saved before the flag (eval_examples) still load, as the cap they were
    raw = json.loads(TrainConfig().to_json())
    raw.pop("eval_rows")
    raw["eval_examples"] = 4096
    assert TrainConfig.from_json(json.dumps(raw)).eval_rows == 4096


def test_without_a_held_out_set_a_short_folder_is_scored_once_not_round_again():
    """No --eval-data / --eval-fraction: the first rows of --data, each once, even when the folder is
    shorter than the 8192-row default (a wrapping reader would count and score rows twice)."""
    from shardwise.train.evaluate import eval_parts

    class Short:   # 3000 rows, reads wrap past the end as a prepared folder's rows do
        def __len__(self):
            return 3000

        def batch(self, start, count):
            return _rows(start, start + count)

    for world in (1, 2, 3):
        parts = [list(eval_parts(Short(), None, None, None, r, world, False)) for r in range(world)]
        rows = [int(x) for p in parts for b in p for x in b.labels]
        assert len(rows) == 3000, (world, len(rows))
    capped = [b for r in range(2) for b in eval_parts(Short(), None, None, 1000, r, 2, False)]
    assert sum(len(b.labels) for b in capped) == 1000
