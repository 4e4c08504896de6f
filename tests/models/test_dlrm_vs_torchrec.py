"""shardwise.models.dlrm against TorchRec 1.8 itself: the reference script runs in TorchRec's own
interpreter (tests/models/torchrec_reference.py); skipped with the reason when it is absent."""

import sys
from pathlib import Path

import pytest
import torch

from shardwise.datasets import Batch, RandomRecDataset
from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig
from shardwise.models.dlrm import DLRM, DLRM_DCN, DLRM_Projection, DLRMTrain
from shardwise.modules import MLP, LowRankCrossNet
from shardwise.sparse import KeyedJaggedTensor

from ..torchrec_peer import load_reference

D, KEYS = 4, ["f1", "f2", "f3"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return load_reference(Path(__file__).with_name("torchrec_reference.py"), tmp_path_factory.mktemp("torchrec"))


def _ebc():
    return EmbeddingBagCollection([EmbeddingBagConfig(20, D, "t1", feature_names=["f1", "f3"]),
                                   EmbeddingBagConfig(30, D, "t2", feature_names=["f2"])])


def _seeded(build):
    def make():
        ebc = _ebc()
        torch.manual_seed(11)        # after the tables (their initial values are drawn differently)
        return build(ebc)
    return make


MODELS = {
    "dlrm": _seeded(lambda ebc: DLRM(ebc, 5, [8, D], [6, 1])),
    "dcn": _seeded(lambda ebc: DLRM_DCN(ebc, 5, [8, D], [6, 1], dcn_num_layers=2, dcn_low_rank_dim=3)),
    "projection": _seeded(lambda ebc: DLRM_Projection(ebc, 5, [8, D], [6, 1], interaction_branch1_layer_sizes=[8, 2 * D],
                                                      interaction_branch2_layer_sizes=[8, 3 * D])),
}


def test_random_rec_dataset_draws_torchrecs_batches(reference):
    ours = RandomRecDataset(KEYS, batch_size=6, hash_sizes=[20, 30, 20], ids_per_features=[3, 2, 4],
                            min_ids_per_features=[0, 1, 2], num_dense=5, manual_seed=7, num_batches=3)
    got = [(b.dense_features, b.sparse_features.values(), b.sparse_features.lengths(), b.labels) for b in ours]
    assert len(got) == len(reference["batches"]) == 3
    for g, want in zip(got, reference["batches"]):
        for a, b in zip(g, want):   # lengths: shardwise's KJT keeps them as int64, TorchRec's as drawn (int32)
            assert torch.equal(a, b.to(a.dtype)) and a.dtype.is_floating_point == b.dtype.is_floating_point


@pytest.mark.parametrize("name", sorted(MODELS))
def test_same_keys_initial_values_and_outputs_as_torchrec(reference, name):
    ref = reference[name]
    model = MODELS[name]()
    mine = model.state_dict()
    assert sorted(mine) == sorted(ref["state"])          # TorchRec's state-dict keys
    for k, v in ref["state"].items():                    # one seed -> TorchRec's initial dense values
        assert "embedding_bags" in k or torch.equal(mine[k], v), k
    model.load_state_dict(ref["state"])
    dense, values, lengths, labels = reference["batches"][0]
    kjt = KeyedJaggedTensor.from_lengths_sync(KEYS, values, lengths)
    torch.testing.assert_close(model(dense, kjt).detach(), ref["logits"], rtol=0, atol=1e-6)
    loss, (loss_d, logits, labels_out) = DLRMTrain(model)(Batch(dense, kjt, labels))
    torch.testing.assert_close(loss.detach(), ref["loss"], rtol=0, atol=1e-6)
    torch.testing.assert_close(logits, ref["train_logits"], rtol=0, atol=1e-6)
    assert torch.equal(labels_out, labels) and not logits.requires_grad and loss.requires_grad


def test_mlp_and_crossnet_as_torchrec(reference):
    torch.manual_seed(3)
    mlp = MLP(6, [5, 4], activation="swish_layernorm")
    cross = LowRankCrossNet(in_features=6, num_layers=2, low_rank=2)
    x = reference["mlp"]["x"]
    for mod, key in ((mlp, "mlp"), (cross, "crossnet")):
        want = reference[key]["state"]
        assert sorted(mod.state_dict()) == sorted(want)
        assert all(torch.equal(mod.state_dict()[k], v) for k, v in want.items())
        torch.testing.assert_close(mod(x).detach(), reference[key]["out"], rtol=0, atol=1e-6)
