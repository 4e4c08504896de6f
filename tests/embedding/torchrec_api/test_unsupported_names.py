"""TorchRec names shardwise cannot honour: they import, and using them says why and what to use."""

import pytest
import torch

from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig
from shardwise.embedding.torchrec_api.compute_kernel import EmbeddingComputeKernel, check_compute_kernel
from shardwise.embedding.inference import QuantConfig, QuantEmbeddingBagCollection, Tracer, shard_modules


def test_compute_kernels():
    assert check_compute_kernel("fused") is EmbeddingComputeKernel.FUSED
    assert check_compute_kernel("dense") is EmbeddingComputeKernel.DENSE   # runs as FUSED (documented)
    expected = {"fused_uvm": "UVM", "fused_uvm_caching": "UVM", "quant": "int8", "quant_uvm": "int8",
                "key_value": "key-value", "fused_triton": "CUDA-only", "customized_kernel": "CUDA-only",
                "ssd_virtual_table": "virtual"}
    for kernel, why in expected.items():
        with pytest.raises(ValueError, match=f"table 't0': compute kernel '{kernel}': .*{why}"):
            check_compute_kernel(EmbeddingComputeKernel(kernel), table="t0")
    with pytest.raises(ValueError, match="unknown compute kernel 'fast'"):
        check_compute_kernel("fast")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")   # torch.ao.quantization, as the tutorial uses it
def test_tutorial_int8_quantization_refused():
    # the introduction tutorial's cell, imports aside: quantize_dynamic calls the mapping's from_float
    from torch import quantization as quant

    ebc = EmbeddingBagCollection([EmbeddingBagConfig(10, 4, "t", feature_names=["f"])])
    qconfig = QuantConfig(activation=quant.PlaceholderObserver.with_args(dtype=torch.float),
                          weight=quant.PlaceholderObserver.with_args(dtype=torch.qint8))
    module = torch.nn.Sequential(ebc)
    with pytest.raises(NotImplementedError, match="int8/int4 inference tables.*DistributedModelParallel"):
        quant.quantize_dynamic(module, qconfig_spec={EmbeddingBagCollection: qconfig},
                               mapping={EmbeddingBagCollection: QuantEmbeddingBagCollection}, inplace=False)
    with pytest.raises(NotImplementedError, match="int8/int4"):
        QuantEmbeddingBagCollection([], is_weighted=False, device=torch.device("cpu"))
    with pytest.raises(NotImplementedError, match="DistributedModelParallel"):
        shard_modules(module, device=torch.device("cpu"))


def test_tracer_keeps_named_leaves():
    class Double(torch.nn.Module):
        def forward(self, x):
            return x * 2

    gm = torch.fx.GraphModule(seq := torch.nn.Sequential(Double()), Tracer(["Double"]).trace(seq))
    assert torch.equal(gm(torch.ones(2)), torch.full((2,), 2.0))
    assert [n.op for n in gm.graph.nodes] == ["placeholder", "call_module", "output"]
