"""TorchRec's ``EmbeddingComputeKernel`` names (``torchrec.distributed.embedding_types``) and which
of them shardwise runs.

Every shardwise table, of any sharding type, runs one kernel: TorchRec's ``FUSED`` (a pooled lookup
whose optimizer update runs inside backward on the touched rows). ``DENSE`` (TorchRec's kernel for
data-parallel tables, updated by the dense optimizer) is accepted and runs as ``FUSED``: data-parallel
tables all-reduce the touched rows' gradients and apply the table's fused update on every replica
(``DistributedModelParallel`` says which optimizer each table gets). The other names exist so TorchRec
code imports; :func:`check_compute_kernel` refuses them with what to use instead.

Example:
    >>> check_compute_kernel(EmbeddingComputeKernel.FUSED), check_compute_kernel("dense")
    (<EmbeddingComputeKernel.FUSED: 'fused'>, <EmbeddingComputeKernel.DENSE: 'dense'>)
    >>> check_compute_kernel("fused_uvm_caching")
    Traceback (most recent call last):
    ValueError: compute kernel 'fused_uvm_caching': UVM ...
"""

from __future__ import annotations

from enum import Enum, unique
from typing import Optional

__all__ = ["EmbeddingComputeKernel", "check_compute_kernel"]


@unique
class EmbeddingComputeKernel(Enum):
    DENSE = "dense"
    FUSED = "fused"
    FUSED_UVM = "fused_uvm"
    FUSED_UVM_CACHING = "fused_uvm_caching"
    QUANT = "quant"
    QUANT_UVM = "quant_uvm"
    QUANT_UVM_CACHING = "quant_uvm_caching"
    KEY_VALUE = "key_value"
    CUSTOMIZED_KERNEL = "customized_kernel"
    SSD_VIRTUAL_TABLE = "ssd_virtual_table"
    DRAM_VIRTUAL_TABLE = "dram_virtual_table"
    DRAM_SSD_VIRTUAL_TABLE = "dram_ssd_virtual_table"
    FUSED_TRITON = "fused_triton"


_UVM = ("UVM (tables in host memory mapped into the GPU, with or without a GPU cache) needs fbgemm's CUDA "
        "kernels, which shardwise does not use; keep tables in device memory (FUSED) and shard them over more "
        "ranks, or lower the planner's memory use per rank")
_QUANT = ("int8/int4 inference tables (TorchRec's quantized EmbeddingBagCollection) are not available in "
          "shardwise; serve the trained fp32/fp16 tables with FUSED")
_WHY = {
    EmbeddingComputeKernel.FUSED_UVM: _UVM,
    EmbeddingComputeKernel.FUSED_UVM_CACHING: _UVM,
    EmbeddingComputeKernel.QUANT: _QUANT,
    EmbeddingComputeKernel.QUANT_UVM: _QUANT,
    EmbeddingComputeKernel.QUANT_UVM_CACHING: _QUANT,
    EmbeddingComputeKernel.KEY_VALUE: "key-value (SSD / DRAM) embedding stores need fbgemm's kernels; use FUSED "
                                      "tables sharded over more ranks",
    EmbeddingComputeKernel.SSD_VIRTUAL_TABLE: "virtual (SSD/DRAM-backed) tables need fbgemm's kernels; use FUSED",
    EmbeddingComputeKernel.DRAM_VIRTUAL_TABLE: "virtual (SSD/DRAM-backed) tables need fbgemm's kernels; use FUSED",
    EmbeddingComputeKernel.DRAM_SSD_VIRTUAL_TABLE: "virtual (SSD/DRAM-backed) tables need fbgemm's kernels; use FUSED",
    EmbeddingComputeKernel.CUSTOMIZED_KERNEL: "custom TBE kernels are CUDA-only in TorchRec; use FUSED",
    EmbeddingComputeKernel.FUSED_TRITON: "the Triton kernel is CUDA-only in TorchRec; use FUSED",
}


def check_compute_kernel(kernel, table: Optional[str] = None) -> EmbeddingComputeKernel:
    """``kernel`` (a member or its string value) if shardwise runs it (``FUSED``; ``DENSE`` runs as
    ``FUSED``), else a ValueError saying why not and what to use (``table`` names the table)."""
    where = f"table {table!r}: " if table else ""
    try:
        member = kernel if isinstance(kernel, EmbeddingComputeKernel) else EmbeddingComputeKernel(kernel)
    except ValueError:
        names = [k.value for k in EmbeddingComputeKernel]
        raise ValueError(f"{where}unknown compute kernel {kernel!r}; TorchRec's names are {names} "
                         f"(shardwise runs 'fused')") from None
    if member in _WHY:
        raise ValueError(f"{where}compute kernel {member.value!r}: {_WHY[member]}")
    return member
