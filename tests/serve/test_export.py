"""export -> load -> score against the job's own model code, and every refusal of export/predict.

The checkpoint here is written by one process with torch.distributed.checkpoint in the layout the job
writes (``sparse.embedding_bags.t_C<k>.weight``, ``dense.params.*``); the 2-process round trip is in
tests/integration/test_heldout_and_export.py.
"""

import json
import warnings

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

from shardwise.cli import main
from shardwise.data import prepare
from shardwise.embedding import EmbeddingBagCollection
from shardwise.serve import export_model, find_checkpoint, load_model, predict_file
from shardwise.sparse import KeyedJaggedTensor
from shardwise.train.config import TrainConfig
from shardwise.train.data import CriteoTSV, SPARSE_NAMES, to_model_inputs
from shardwise.train import model as job_model
from shardwise.train.model import make_tables

from ..data.common import line, write_log


# the job's dense part: DLRMDense (TorchRec's parameter names) where the model zoo is merged, DenseArch before
JobDense = getattr(job_model, "DLRMDense", None) or job_model.DenseArch


def _zoo_names(params: dict) -> dict:
    """``bottom.{2i}``/``top.{2i}`` keys under TorchRec's DLRM names (what DLRMDense's checkpoints hold)."""
    out = {}
    n_top = len([k for k in params if k.startswith("top.") and k.endswith(".weight")]) - 1
    for k, v in params.items():
        part, i, kind = k.split(".")
        i = int(i) // 2
        out[f"dense_arch.model._mlp.{i}._linear.{kind}" if part == "bottom" else
            f"over_arch.model.1.{kind}" if i == n_top else f"over_arch.model.0._mlp.{i}._linear.{kind}"] = v
    return out


def _checkpoint(tmp_path, sizes, data=None, digest=None, dim=4, zoo=False):
    """A committed checkpoint as the job writes it, with random weights; (folder, tables, arch)."""
    torch.manual_seed(0)
    arch = JobDense(26, dim)
    tables = {f"embedding_bags.t_{f}.weight": torch.randn(n, dim) for f, n in zip(SPARSE_NAMES, sizes)}
    params = {n: p.detach().clone() for n, p in arch.named_parameters()}
    state = {"sparse": tables, "dense": {"params": _zoo_names(params) if zoo else params}}
    step = tmp_path / "run" / "checkpoints" / "step_00000010"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(step), no_dist=True)
    cfg = TrainConfig(data=data, num_embeddings_per_feature=None if data else list(sizes))
    (step / "meta.json").write_text(json.dumps({"step": 10, "config": cfg.to_json(), "table_sizes": list(sizes),
                                                "vocab_digest": digest}))
    (step / "COMMITTED").write_text("10\n")
    return step, tables, arch


def _job_scores(tables, arch, batch, sizes, vocab=None):
    """What the job computes: its batch -> model inputs, the unsharded collection, DenseArch."""
    if vocab is not None:
        batch.ids = vocab.apply(batch.ids)
    dense, kjt, _ = to_model_inputs(batch, sizes, torch.device("cpu"))
    ebc = EmbeddingBagCollection(make_tables(sizes, tables["embedding_bags.t_C1.weight"].shape[1]), device="cpu")
    ebc.load_state_dict(tables)
    with torch.no_grad():
        return torch.sigmoid(arch(dense, ebc(kjt).values())).numpy()


@pytest.mark.parametrize("zoo", [False, True])
def test_export_of_raw_ids_scores_as_the_job_does(tmp_path, zoo):
    sizes = [5 + 3 * i for i in range(26)]
    step, tables, arch = _checkpoint(tmp_path, sizes, zoo=zoo and JobDense is job_model.DenseArch)
    spec = export_model(tmp_path / "run", tmp_path / "out")       # a run's --out: its newest checkpoint
    assert spec["ids"] == "modulo" and spec["table_sizes"] == sizes and spec["bottom"] == [13, 64, 4]
    log = write_log(tmp_path / "a.tsv", 64, seed=5)
    batch = CriteoTSV(log).batch(0, 64)
    want = _job_scores(tables, arch, batch, sizes)
    model = load_model(tmp_path / "out")
    np.testing.assert_allclose(model.score(batch.dense, batch.ids), want, rtol=1e-5, atol=1e-6)
    r = predict_file(tmp_path / "out", [log], out=tmp_path / "s.txt")
    np.testing.assert_allclose(np.loadtxt(tmp_path / "s.txt"), want, rtol=1e-5)
    assert r.auc is not None and r.lines == 64 and r.bad_lines == 0


def test_export_with_the_training_vocabulary(tmp_path):
    train = write_log(tmp_path / "train.tsv", 200, seed=6)
    m = prepare([train], tmp_path / "p", categorify=True, min_count=2)
    step, tables, arch = _checkpoint(tmp_path, m["table_sizes"], data=str(tmp_path / "p"),
                                     digest=m["vocabulary"]["digest"])
    spec = export_model(step, tmp_path / "out")
    assert spec["ids"] == "vocabulary" and spec["vocab_digest"] == m["vocabulary"]["digest"]
    held = write_log(tmp_path / "held.tsv", 50, seed=7)      # mostly ids training never saw
    from shardwise.data import PreparedClickLogs

    vocab = PreparedClickLogs(tmp_path / "p").vocabulary
    batch = CriteoTSV(held).batch(0, 50)
    want = _job_scores(tables, arch, CriteoTSV(held).batch(0, 50), m["table_sizes"], vocab)
    np.testing.assert_allclose(load_model(tmp_path / "out").score(batch.dense, batch.ids), want, rtol=1e-5, atol=1e-6)
    # the training folder moved: refused, and --vocab must be the folder with the same digest
    (tmp_path / "p").rename(tmp_path / "moved")
    with pytest.raises(ValueError, match="which is not there any more; pass --vocab"):
        export_model(step, tmp_path / "out2")
    prepare([held], tmp_path / "other", categorify=True)
    with pytest.raises(ValueError, match="is not the one the run trained with"):
        export_model(step, tmp_path / "out2", vocab=str(tmp_path / "other"))
    assert not (tmp_path / "out2").exists()
    assert export_model(step, tmp_path / "out2", vocab=str(tmp_path / "moved"))["ids"] == "vocabulary"


def test_export_refusals(tmp_path, capsys):
    with pytest.raises(ValueError, match="holds no committed checkpoint .* --checkpoint-every"):
        find_checkpoint(tmp_path)
    step, _, _ = _checkpoint(tmp_path, [4] * 26)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep")
    assert main(["export", str(step), "--out", str(tmp_path / "full")]) == 2
    assert "exists and is not an empty folder" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "e")]) == 0
    assert "exported step 10" in capsys.readouterr().out
    assert main(["predict", str(tmp_path / "nope"), "x.tsv", "--out", str(tmp_path / "s")]) == 2
    assert "is not an exported model (no model.json)" in capsys.readouterr().err


def test_predict_unlabelled_and_bad_lines(tmp_path, capsys):
    _checkpoint(tmp_path, [7] * 26)
    export_model(tmp_path / "run", tmp_path / "e")
    lines = [line(cats=[format(17 * i + j, "x") for j in range(26)]) for i in range(6)]
    (tmp_path / "l.tsv").write_text("".join(lines))
    (tmp_path / "u.tsv").write_text("".join(x.split("\t", 1)[1] for x in lines))      # the label left out
    labelled = predict_file(tmp_path / "e", [tmp_path / "l.tsv"])
    unlabelled = predict_file(tmp_path / "e", [tmp_path / "u.tsv"], out=tmp_path / "u.txt")
    assert unlabelled.auc is None and unlabelled.labels is None
    np.testing.assert_array_equal(unlabelled.scores, labelled.scores)
    bad = lines[:2] + ["1\tnot-a-count" + "\t" * 38 + "\n"] + lines[2:]
    (tmp_path / "b.tsv").write_text("".join(bad))
    assert main(["predict", str(tmp_path / "e"), str(tmp_path / "b.tsv"), "--out", str(tmp_path / "s")]) == 2
    assert "b.tsv line 3, field I1: 'not-a-count' is not an integer" in capsys.readouterr().err
    assert main(["predict", str(tmp_path / "e"), str(tmp_path / "b.tsv"), "--out", str(tmp_path / "s"),
                 "--skip-bad-lines"]) == 0
    out = capsys.readouterr().out
    assert "scored 7 line(s)" in out and "skipped 1 malformed line(s) (scored nan)" in out
    got = np.loadtxt(tmp_path / "s")
    assert np.isnan(got[2]) and np.allclose(np.delete(got, 2), labelled.scores, rtol=1e-6)


def test_int8_rowwise_tables(tmp_path):
    from shardwise.serve.standalone import quantize_rowwise

    sizes = [6 + i for i in range(26)]
    _checkpoint(tmp_path, sizes)
    export_model(tmp_path / "run", tmp_path / "f")
    spec = export_model(tmp_path / "run", tmp_path / "q", int8=True)
    assert spec["table_dtype"] == "int8_rowwise"
    state = torch.load(tmp_path / "q" / "model.pt", weights_only=True)
    assert state["tables.C1.qweight"].dtype == torch.uint8 and state["tables.C1.scale_bias"].shape == (6, 2)
    w = torch.randn(5, 4)
    q, sb = quantize_rowwise(w)
    back = q.float() * sb[:, :1] + sb[:, 1:]
    assert (back - w).abs().max() <= sb[:, :1].max() / 2 + 1e-6            # half a step per value at most
    # ground truth: the float model with every table replaced by its dequantized rows
    fm = load_model(tmp_path / "f")
    with torch.no_grad():
        for f in fm.features:
            t = fm.tables[f].weight
            qq, s = quantize_rowwise(t)
            t.copy_(qq.float() * s[:, :1] + s[:, 1:])
    batch = CriteoTSV(write_log(tmp_path / "a.tsv", 40, seed=8)).batch(0, 40)
    batch.ids[3, :5] = -1                              # empty bags too
    np.testing.assert_allclose(load_model(tmp_path / "q").score(batch.dense, batch.ids),
                               fm.score(batch.dense, batch.ids), rtol=1e-5, atol=1e-6)
