"""Quantized-comms codecs and FusedEmbeddingBagCollection against TorchRec 1.8 itself: the reference
script runs in TorchRec's own interpreter (torchrec_qcomm_fused_reference.py); skipped with the reason
when it is absent."""

from pathlib import Path

import pytest
import torch

from shardwise.embedding import EmbeddingBagConfig
from shardwise.embedding.torchrec_api.fused_collection import FusedEmbeddingBagCollection
from shardwise.embedding.qcomm import CommType, QCommsConfig, get_qcomm_codecs_registry
from shardwise.sparse import KeyedJaggedTensor

from ..torchrec_peer import load_reference

TABLES = [("t_sum", 12, 4, ["a", "b"], "sum"), ("t_mean", 7, 8, ["c"], "mean")]
OPTIMIZERS = {"sgd": (torch.optim.SGD, {"lr": 0.05}), "adagrad": (torch.optim.Adagrad, {"lr": 0.1, "eps": 1e-8})}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    script = Path(__file__).with_name("torchrec_qcomm_fused_reference.py")
    return load_reference(script, tmp_path_factory.mktemp("torchrec"))


def test_codecs_match_torchrec(reference):
    ref = reference["codecs"]
    assert sorted(get_qcomm_codecs_registry(QCommsConfig(CommType.FP16, CommType.FP16))) == ref["keys"]
    assert (get_qcomm_codecs_registry(QCommsConfig()) is None) == ref["fp32_is_none"] is True
    x = ref["x"]
    for scale in (None, 512.0):   # same wire values, same values back (the loss scale as TorchRec's)
        c = get_qcomm_codecs_registry(QCommsConfig(CommType.FP16, CommType.FP16, forward_loss_scale=scale,
                                                   backward_loss_scale=scale))["POOLED_EMBEDDINGS_ALL_TO_ALL"]
        want = ref[scale]
        assert torch.equal(c.forward.encode(x), want["fwd_wire"]) and torch.equal(c.backward.encode(x), want["bwd_wire"])
        for codec, back in ((c.forward, want["fwd_back"]), (c.backward, want["bwd_back"])):
            ours = codec.decode(codec.encode(x))
            if scale is None:
                assert torch.equal(ours, back)
            else:   # TorchRec divides by the scale in fp16 (tiny values underflow to 0); we divide in fp32
                assert torch.equal(ours, codec.encode(x).float() / scale)
                assert bool(((ours - x).abs() <= (back - x).abs()).all())
                assert ((ours - x).abs() < (back - x).abs()).sum() > 0


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_fused_collection_matches_torchrec(reference, name):
    ref = reference["fused"]
    cfgs = [EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=f, pooling=p)
            for n, r, d, f, p in TABLES]
    cls, kwargs = OPTIMIZERS[name]
    m = FusedEmbeddingBagCollection(cfgs, optimizer_type=cls, optimizer_kwargs=kwargs, device=torch.device("cpu"))
    m.load_state_dict(ref["init"])
    for (values, lengths, target), want in zip(ref["batches"], ref[name]["outputs"]):
        kt = m(KeyedJaggedTensor(["a", "b", "c"], values, lengths=lengths))
        torch.testing.assert_close(kt.values(), want, rtol=1e-6, atol=1e-6)
        ((kt.values() - target) ** 2).sum().backward()
    moved = max((ref[name]["final"][k] - v).abs().max().item() for k, v in ref["init"].items())
    assert moved > 1e-3
    for key, want in ref[name]["final"].items():
        torch.testing.assert_close(m.state_dict()[key], want, rtol=1e-5, atol=1e-6, msg=key)
