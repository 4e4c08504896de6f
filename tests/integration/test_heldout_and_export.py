"""From raw click logs to served predictions, end to end on 2 processes: prepare with --categorify,
train, score a separate held-out text file through the training vocabulary, export, predict.

The log's labels depend on known features (tests/integration/known_log.py), so the label's own logit
gives the best AUC any model can reach on the held-out rows: the job must come close to it, and the
exported model must score the same rows as the job did.
"""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from shardwise.cli import main
from shardwise.train.model import auc

from .known_log import SIGNAL, write_known_log


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("heldout")
    _, _, train_raw = write_known_log(tmp / "train.tsv", 40000, seed=1)
    logit, labels, raw = write_known_log(tmp / "held.tsv", 5000, seed=2, unseen_rate=0.03)
    assert main(["data", "prepare", str(tmp / "train.tsv"), "--out", str(tmp / "p"), "--categorify"]) == 0
    assert main(["train", "--nproc-per-node", "2", "--quiet", "--data", str(tmp / "p"), "--eval-data",
                 str(tmp / "held.tsv"), "--steps", "300", "--batch-size", "128", "--checkpoint-every", "300",
                 "--reshard-at", "0", "--sharding-types", "row_wise,data_parallel", "--out", str(tmp / "r")]) == 0
    metrics = json.loads((tmp / "r" / "metrics.json").read_text())
    assert main(["export", str(tmp / "r"), "--out", str(tmp / "exported")]) == 0
    return tmp, metrics, logit, labels, raw, train_raw


def test_the_job_scores_the_held_out_file_through_the_training_vocabulary(trained, capsys):
    tmp, m, logit, labels, raw, train_raw = trained
    best = auc(torch.from_numpy(logit), torch.from_numpy(labels))
    print(f"label logit AUC {best:.4f}, job eval AUC {m['auc']['eval']:.4f} over {m['eval_rows']} rows")
    assert m["eval_rows"] == 5000                     # the whole held-out file, on both ranks
    assert m["table_sizes_source"] == f"the manifest of {tmp / 'p'}"
    assert m["eval_data"] == f"held-out file {tmp / 'held.tsv'} through the training vocabulary"
    assert abs(m["auc"]["eval"] - best) < 0.02, (m["auc"]["eval"], best)
    # the job mapped every held-out id the training file never had (and only those) to the OOV row
    unseen = sum(int(((raw[:, j] >= 0) & ~np.isin(raw[:, j], train_raw[:, j])).sum()) for j in range(26))
    assert m["eval_oov_ids"] == unseen > 0


def test_predict_with_the_exported_model_matches_the_job(trained, capsys):
    tmp, m, logit, labels, raw, _ = trained
    capsys.readouterr()
    assert main(["predict", str(tmp / "exported"), str(tmp / "held.tsv"), "--out", str(tmp / "scores.txt")]) == 0
    out = capsys.readouterr().out
    scores = np.loadtxt(tmp / "scores.txt")
    assert scores.shape == (5000,) and np.all((scores > 0) & (scores < 1))
    got = auc(torch.from_numpy(scores), torch.from_numpy(labels))
    print(f"predict AUC {got:.4f} (job {m['auc']['eval']:.4f})")
    assert abs(got - m["auc"]["eval"]) < 0.01 and f"AUC {got:.4f} over 5000 labelled line(s)" in out
    # int8 row-wise tables for CPU serving: the AUC change, measured
    assert main(["export", str(tmp / "r"), "--out", str(tmp / "int8"), "--int8"]) == 0
    assert main(["predict", str(tmp / "int8"), str(tmp / "held.tsv"), "--out", str(tmp / "s8.txt")]) == 0
    q = auc(torch.from_numpy(np.loadtxt(tmp / "s8.txt")), torch.from_numpy(labels))
    print(f"int8 row-wise tables: predict AUC {q:.6f} ({q - got:+.2e} against float32 {got:.6f})")
    assert abs(q - got) < 0.005


def test_unseen_ids_land_in_the_oov_row(trained):
    from shardwise.serve import load_model

    tmp, _, _, _, raw, train_raw = trained
    model = load_model(tmp / "exported")
    spec = json.loads((tmp / "exported" / "model.json").read_text())
    rows = model.rows(raw)
    oov = np.asarray(spec["oov_rows"])
    for j in SIGNAL:
        col = raw[:, j]
        fresh = (col >= 0) & ~np.isin(col, train_raw[:, j])
        assert fresh.any() and (rows[fresh, j] == oov[j]).all()       # never a neighbour's row
        # a seen id gets the row of its rank by training frequency (ties: the smaller id first)
        ids, counts = np.unique(train_raw[:, j][train_raw[:, j] >= 0], return_counts=True)
        row_of = {int(i): r for r, i in enumerate(ids[np.lexsort((ids, -counts))])}
        seen = (col >= 0) & ~fresh
        assert rows[seen, j].tolist() == [row_of[int(v)] for v in col[seen]]
        assert spec["table_sizes"][j] == len(ids) + 1 and oov[j] == len(ids)
    # an id far above every seen one (IndexError before) and one between seen ids (a neighbour's row before)
    probe = np.full((2, 26), -1)
    probe[:, 0] = [2**62, int(np.sort(np.load(tmp / "p" / "vocab" / "C1.npy"))[0]) + 1]
    assert model.rows(probe)[:, 0].tolist() == [oov[0], oov[0]]


def test_the_export_loads_without_shardwise(trained):
    tmp = trained[0]
    code = ("import sys, json, numpy as np; sys.path.insert(0, sys.argv[1]); import model; "
            "m = model.load(sys.argv[1]); "
            "s = m.score(np.ones((3, 13)), np.full((3, 26), -1)); "
            "assert not [k for k in sys.modules if k.startswith('shardwise')]; print(s.shape)")
    out = subprocess.run([sys.executable, "-I", "-c", code, str(tmp / "exported")], capture_output=True, text=True,
                         timeout=120, cwd=str(tmp))
    assert out.returncode == 0 and out.stdout.strip() == "(3,)", out.stderr
