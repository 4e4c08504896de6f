"""Run by TorchRec's own interpreter (not by pytest): TorchRec's DLRM / DLRM_DCN / DLRM_Projection,
MLP, LowRankCrossNet and RandomRecDataset on fixed seeds, saved as plain tensors for
tests/models/test_dlrm_vs_torchrec.py to compare against shardwise's.

Usage: PYTHONHASHSEED=0 <torchrec venv>/bin/python tests/models/torchrec_reference.py OUT.pt
(the test finds the interpreter in $SHARDWISE_TORCHREC_PYTHON or ../torchrec-venv/bin/python next to the repository).
Imports torchrec only; nothing of shardwise.
"""

import sys

import torch
import torchrec
from torchrec.datasets.random import RandomRecDataset
from torchrec.models.dlrm import DLRM, DLRM_DCN, DLRM_Projection, DLRMTrain
from torchrec.modules.crossnet import LowRankCrossNet
from torchrec.modules.mlp import MLP

D, KEYS = 4, ["f1", "f2", "f3"]


def _ebc():
    # two tables, one of them with two features: F = 3
    return torchrec.EmbeddingBagCollection(tables=[
        torchrec.EmbeddingBagConfig(name="t1", embedding_dim=D, num_embeddings=20, feature_names=["f1", "f3"]),
        torchrec.EmbeddingBagConfig(name="t2", embedding_dim=D, num_embeddings=30, feature_names=["f2"])])


def _models():
    return {
        "dlrm": lambda ebc: DLRM(ebc, 5, [8, D], [6, 1]),
        "dcn": lambda ebc: DLRM_DCN(ebc, 5, [8, D], [6, 1], dcn_num_layers=2, dcn_low_rank_dim=3),
        "projection": lambda ebc: DLRM_Projection(ebc, 5, [8, D], [6, 1], interaction_branch1_layer_sizes=[8, 2 * D],
                                                  interaction_branch2_layer_sizes=[8, 3 * D]),
    }


def main(out: str) -> None:
    data = RandomRecDataset(KEYS, batch_size=6, hash_sizes=[20, 30, 20], ids_per_features=[3, 2, 4],
                            min_ids_per_features=[0, 1, 2], num_dense=5, manual_seed=7, num_batches=3)
    batches = [(b.dense_features, b.sparse_features.values(), b.sparse_features.lengths(), b.labels) for b in data]
    dense, values, lengths, labels = batches[0]
    kjt = torchrec.KeyedJaggedTensor.from_lengths_sync(KEYS, values, lengths)
    result = {"batches": batches}
    for name, make in _models().items():
        ebc = _ebc()
        torch.manual_seed(11)                 # the dense parts' initial values: compared as well
        model = make(ebc)
        train = DLRMTrain(model)
        loss, (loss_d, logits, labels_out) = train(torchrec.datasets.utils.Batch(dense, kjt, labels))
        result[name] = {"state": {k: v.detach().clone() for k, v in model.state_dict().items()},
                        "logits": model(dense, kjt).detach(), "loss": loss.detach(), "train_logits": logits}
    torch.manual_seed(3)
    mlp = MLP(6, [5, 4], activation="swish_layernorm")
    cross = LowRankCrossNet(in_features=6, num_layers=2, low_rank=2)
    x = torch.randn(4, 6)
    result["mlp"] = {"state": mlp.state_dict(), "out": mlp(x).detach(), "x": x}
    result["crossnet"] = {"state": cross.state_dict(), "out": cross(x).detach()}
    torch.save(result, out)


if __name__ == "__main__":
    main(sys.argv[1])
