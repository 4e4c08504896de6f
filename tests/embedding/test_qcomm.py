"""Quantized comms (TorchRec's qcomm): fp16/bf16 on the wire, within their precision of fp32, half the bytes."""

import pytest
import torch

from shardwise.embedding.qcomm import (
    CommOp, CommType, QCommsConfig, QuantizedCommCodecs, get_qcomm_codecs_registry,
)
from shardwise.testing import run_on_ranks

from . import qcomm_workers

# pooled outputs here are O(1): fp16 keeps ~3 decimal digits, bf16 ~2
TOL = {"fp32": 1e-5, "fp16": 5e-3, "bf16": 4e-2}


def test_registry_as_torchrec():
    reg = get_qcomm_codecs_registry(QCommsConfig(forward_precision=CommType.FP16, backward_precision=CommType.BF16))
    assert sorted(reg) == sorted(op.name for op in CommOp)
    codecs = reg["POOLED_EMBEDDINGS_ALL_TO_ALL"]
    assert isinstance(codecs, QuantizedCommCodecs)
    assert codecs.forward.quantized_dtype == torch.float16 and codecs.backward.quantized_dtype == torch.bfloat16
    assert get_qcomm_codecs_registry(QCommsConfig()) is None          # FP32 both ways: no codecs
    only = get_qcomm_codecs_registry(QCommsConfig(CommType.FP16, CommType.FP32), [CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL])
    assert list(only) == ["POOLED_EMBEDDINGS_ALL_TO_ALL"]
    x = torch.tensor([1e-6, 0.5, 3.0])
    assert torch.equal(only["POOLED_EMBEDDINGS_ALL_TO_ALL"].backward.encode(x), x)   # FP32: untouched


def test_codec_round_trip_and_loss_scale():
    small = torch.tensor([1e-8, 1.0e-7, 0.25])       # the first rounds to 0 in fp16 (smallest subnormal 6e-8)
    plain = get_qcomm_codecs_registry(QCommsConfig(CommType.FP16, CommType.FP16))["POOLED_EMBEDDINGS_ALL_TO_ALL"]
    scaled = get_qcomm_codecs_registry(QCommsConfig(CommType.FP16, CommType.FP16, backward_loss_scale=1024.0))
    codec = scaled["POOLED_EMBEDDINGS_ALL_TO_ALL"].backward
    assert codec.encode(small).dtype == torch.float16
    assert plain.backward.decode(plain.backward.encode(small))[0] == 0          # lost without a scale
    torch.testing.assert_close(codec.decode(codec.encode(small)), small, rtol=5e-3, atol=0)


@pytest.mark.parametrize("precision", [CommType.INT8, CommType.FP8, CommType.MX4])
def test_unsupported_precisions_refused(precision):
    with pytest.raises(ValueError, match=f"{precision.name} needs fbgemm's quantize kernels.*FP16"):
        QCommsConfig(forward_precision=precision)
    with pytest.raises(TypeError, match="must be a CommType"):
        QCommsConfig(forward_precision="fp16")


def test_bad_registry_refused():
    from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig, row_wise, shard

    ebc = EmbeddingBagCollection([EmbeddingBagConfig(10, 4, "t", feature_names=["f"])])
    with pytest.raises(ValueError, match="unknown key 'pooled'"):
        shard(ebc, {"t": row_wise()}, qcomm_codecs_registry={"pooled": QuantizedCommCodecs()})
    with pytest.raises(TypeError, match="must be a dict"):
        shard(ebc, {"t": row_wise()}, qcomm_codecs_registry=QCommsConfig(CommType.FP16))


def _check(results, precisions):
    for rank, out in enumerate(results):
        for (name, precision), (fwd_err, err, moved, sent) in out.items():
            assert moved > 1e-3, "the reference did not train"
            assert fwd_err < TOL[precision], f"rank {rank} {name} {precision}: forward error {fwd_err}"
            assert err < TOL[precision], f"rank {rank} {name} {precision}: weight error {err}"
        for name in {n for n, _ in out}:
            full = out[(name, "fp32")][3]
            assert sum(full.values()) > 0, f"{name}: nothing measured on the wire"
            for precision in precisions:
                if precision != "fp32":   # every float byte of the output collectives halved, both ways
                    assert out[(name, precision)][3] == {k: v // 2 for k, v in full.items()}, (name, precision)


def test_pooled_all_to_all_fp16_bf16_on_two_ranks():
    plans = ["table_wise", "row_wise", "column_wise", "table_row_wise", "mixed"]
    precisions = ["fp32", "fp16", "bf16"]
    _check(run_on_ranks(qcomm_workers.train_with_qcomm, 2, plans, precisions, timeout=240.0), precisions)


def test_two_level_table_row_wise_fp16():
    # 2 hosts x 2 ranks: both levels of the table-row-wise output dist through the codecs
    precisions = ["fp32", "fp16"]
    _check(run_on_ranks(qcomm_workers.train_with_qcomm, 4, ["table_row_wise"], precisions, hosts=2, timeout=240.0),
           precisions)


def test_reduce_scatter_fp16():
    precisions = ["fp32", "fp16"]
    results = run_on_ranks(qcomm_workers.train_with_qcomm, 2, ["row_wise"], precisions, force_reduce_scatter=True)
    _check(results, precisions)
    sent = results[0][("row_wise", "fp16")][3]
    assert sent["reduce_scatter"] > 0 and sent["all_to_all"] == 0   # the reduce-scatter path ran


def test_sequence_all_to_all_fp16():
    for out in run_on_ranks(qcomm_workers.sequence_with_qcomm, 2):
        assert out["fp32"][0] < 1e-6 and out["fp16"][0] < TOL["fp16"]
        assert out["fp16"][1] * 2 == out["fp32"][1] > 0


def test_ranks_must_agree_and_reshard_keeps_codecs():
    msgs = run_on_ranks(qcomm_workers.mismatched_registry, 2)
    assert msgs[0] == msgs[1], msgs
    assert "qcomm codecs" in msgs[0][0] and "passed another qcomm_codecs_registry than rank 0" in msgs[0][1], msgs
    assert msgs[0][2] == "QuantizedCommCodec(FP16)"
    for kept in run_on_ranks(qcomm_workers.reshard_keeps_codecs, 2):
        assert kept and all(k == "QuantizedCommCodec(BF16)" for k in kept), kept


def test_qcomm_through_dmp_and_sharder():
    import shardwise.embedding as emb

    if not hasattr(emb, "EmbeddingBagCollectionSharder"):
        pytest.skip("needs the module sharders of issue 26's optimizer/DMP part (EmbeddingBagCollectionSharder)")
    for out in run_on_ranks(qcomm_workers.dmp_with_qcomm_sharder, 2):
        assert out["fp32"][0] < TOL["fp32"] and out["fp16"][0] < TOL["fp16"]
        assert out["fp16"][1] * 2 == out["fp32"][1] > 0
        assert out["fp32"][2] == ["None"] and out["fp16"][2] == ["QuantizedCommCodec(FP16)"]
