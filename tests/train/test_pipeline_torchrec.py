"""TrainPipelineSparseDist (TorchRec's shape) on 2 ranks: the zoo's DLRMTrain over a sharded collection
fed by RandomRecDataset, pipelined, equals the plain loop step for step (outputs and weights); eval
mode trains nothing; TorchRec's arguments it cannot honour are refused."""

from __future__ import annotations

import functools

import pytest
import torch

from shardwise.datasets import RandomRecDataset
from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig, column_wise, row_wise, shard, table_wise
from shardwise.models.dlrm import DLRM, DLRMTrain
from shardwise.testing import run_on_ranks, worker_mesh
from shardwise.train.pipeline import TrainPipelineSparseDist

from .sync_sgd import SyncSGD

KEYS, STEPS = ["f0", "f1", "f2"], 4


def _model(world):
    tables = [EmbeddingBagConfig(40, 4, "t0", feature_names=["f0", "f2"]), EmbeddingBagConfig(60, 4, "t1",
                                                                                                 feature_names=["f1"])]
    plan = {"t0": row_wise(), "t1": table_wise(world - 1) if world > 1 else column_wise([0])}
    sharded = shard(EmbeddingBagCollection(tables, init_seed=2), plan, mesh=worker_mesh((world,)),
                    optimizer=functools.partial(torch.optim.Adagrad, lr=0.1))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(4)
        model = DLRMTrain(DLRM(sharded, 5, [8, 4], [8, 1]))
    dense = [p for n, p in model.named_parameters() if "sparse_arch" not in n]
    return model, SyncSGD(dense, lr=0.05)


def _data(rank):
    return RandomRecDataset(KEYS, batch_size=6, hash_sizes=[40, 60, 40], ids_per_feature=3, min_ids_per_feature=0,
                            num_dense=5, manual_seed=10 + rank, num_batches=STEPS)


def _weights(model):
    out = {k: v.full_tensor() for k, v in model.model.sparse_arch.embedding_bag_collection.state_dict().items()}
    out.update({k: v.detach().clone() for k, v in model.named_parameters() if "sparse_arch" not in k})
    return out


def _pipelined_vs_plain(rank, world):
    model, opt = _model(world)
    plain = []
    for batch in _data(rank):
        opt.zero_grad()
        loss, output = model(batch)
        loss.backward()
        opt.step()
        plain.append(output)
    want = _weights(model)

    model, opt = _model(world)
    pipe, it, piped = TrainPipelineSparseDist(model, opt, torch.device("cpu")), iter(_data(rank)), []
    while True:
        try:
            piped.append(pipe.progress(it))
        except StopIteration:
            break
    got = _weights(model)
    out_err = max((a - b).abs().max().item() for p, q in zip(plain, piped) for a, b in zip(p, q))
    weight_err = max((want[k] - got[k]).abs().max().item() for k in want)
    moved = max((want[k] - _weights(_model(world)[0])[k]).abs().max().item() for k in want)

    model.eval()                                  # eval: the forward only, nothing trains
    before = _weights(model)
    pipe = TrainPipelineSparseDist(model, opt, torch.device("cpu"))
    loss, logits, labels = pipe.progress(iter(_data(rank)))
    still = max((before[k] - _weights(model)[k]).abs().max().item() for k in before)
    return {"steps": (len(plain), len(piped)), "out_err": out_err, "weight_err": weight_err, "moved": moved,
            "eval_changed": still, "shapes": (tuple(logits.shape), tuple(labels.shape), loss.requires_grad)}


def test_pipelined_dlrm_train_equals_the_plain_loop():
    for r in run_on_ranks(_pipelined_vs_plain, 2, timeout=300):
        assert r["steps"] == (STEPS, STEPS), r
        assert r["out_err"] <= 1e-6 and r["weight_err"] <= 1e-6, r
        assert r["moved"] > 1e-3, r                   # it trained: equal weights are not two no-ops
        assert r["eval_changed"] == 0.0 and r["shapes"] == ((6,), (6,), False), r


def _refusals(rank, world):
    model, opt = _model(world)
    out = []
    for kwargs in ({"apply_jit": True}, {"execute_all_batches": False}, {"prefetch_stream": 1}):
        try:
            TrainPipelineSparseDist(model, opt, "cpu", **kwargs)
        except (ValueError, TypeError) as e:
            out.append(str(e))
    TrainPipelineSparseDist(model, opt, "cpu", enqueue_batch_after_forward=True)   # no effect: accepted
    return out


def test_torchrec_arguments_it_cannot_honour_are_refused():
    errors = run_on_ranks(_refusals, 1)[0]
    assert len(errors) == 3
    assert "TorchScript" in errors[0] and "every batch" in errors[1] and "prefetch_stream" in errors[2]
