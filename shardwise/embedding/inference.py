"""TorchRec's int8 inference names, which shardwise does not implement: they import, and using them
raises an error that says so and what to use instead.

- ``QuantConfig`` (``torchrec.modules.embedding_configs``): a plain value, built as in TorchRec.
- ``QuantEmbeddingBagCollection`` (``torchrec.quant.embedding_modules.EmbeddingBagCollection``): building
  one, or ``from_float`` (what ``torch.ao.quantization.quantize_dynamic`` calls through its ``mapping``),
  raises: int8/int4 tables need fbgemm's quantized TBE kernels.
- ``shard_modules`` (TorchRec's ``torchrec.distributed.shard._shard_modules``): refuses quantized
  modules; for training modules it names ``DistributedModelParallel`` / ``shard()``.
- ``Tracer`` (``torchrec.fx.Tracer``): ``torch.fx.Tracer`` with TorchRec's ``leaf_modules`` argument;
  tracing a sharded collection (for TorchScript) raises: its stages run Python collectives.

Example:
    >>> QuantEmbeddingBagCollection.from_float(None)
    Traceback (most recent call last):
    NotImplementedError: QuantEmbeddingBagCollection: int8/int4 inference tables ...
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import torch

__all__ = ["QuantConfig", "QuantEmbeddingBagCollection", "shard_modules", "Tracer"]

_QUANT = ("int8/int4 inference tables (TorchRec's quantized EmbeddingBagCollection, its sharding and TorchScript "
          "export) need fbgemm's quantized TBE kernels, which shardwise does not have. Serve the trained module "
          "as it is (fp32, or cast the tables with EmbeddingBagConfig(data_type=DataType.FP16)); shard it with "
          "DistributedModelParallel or shard()")


class QuantConfig(NamedTuple):
    """TorchRec's quantization config value (observers for activations and weights)."""

    activation: Any
    weight: Any
    per_table_weight_dtype: Optional[dict] = None


class QuantEmbeddingBagCollection(torch.nn.Module):
    """Not available: see the module docstring."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(f"QuantEmbeddingBagCollection: {_QUANT}")

    @classmethod
    def from_float(cls, module, use_precomputed_fake_quant: bool = False):
        raise NotImplementedError(f"QuantEmbeddingBagCollection: {_QUANT}")


def _holds_quant(module: torch.nn.Module) -> bool:
    return any(isinstance(m, QuantEmbeddingBagCollection) for m in module.modules())


def shard_modules(module: torch.nn.Module, env=None, device: Optional[torch.device] = None, plan=None,
                  sharders=None, init_params: bool = False, planner=None) -> torch.nn.Module:
    """TorchRec's ``_shard_modules`` (used for inference sharding): refused, saying what to use."""
    if _holds_quant(module):
        raise NotImplementedError(f"shard_modules: {_QUANT}")
    raise NotImplementedError("shard_modules (TorchRec's _shard_modules) shards inference modules in TorchRec; "
                              "shardwise shards training modules with DistributedModelParallel(module, "
                              "device=..., plan=..., sharders=...) or shardwise.embedding.shard(collection, plan)")


class Tracer(torch.fx.Tracer):
    """``torch.fx.Tracer`` that keeps the modules whose class name is in ``leaf_modules`` as leaves
    (TorchRec's argument). Refuses a module holding a sharded collection.

    Example:
        >>> class Double(torch.nn.Module):
        ...     def forward(self, x):
        ...         return x * 2
        >>> [n.op for n in Tracer(["Double"]).trace(torch.nn.Sequential(Double())).nodes]
        ['placeholder', 'call_module', 'output']
        >>> [n.op for n in Tracer().trace(torch.nn.Sequential(Double())).nodes]
        ['placeholder', 'call_function', 'output']
    """

    def __init__(self, leaf_modules: Optional[list] = None):
        super().__init__()
        self._leaf_names = set(leaf_modules or [])

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return type(m).__name__ in self._leaf_names or super().is_leaf_module(m, module_qualified_name)

    def trace(self, root, concrete_args=None):
        from .sharded_collection import ShardedEmbeddingBagCollection

        if isinstance(root, torch.nn.Module) and any(isinstance(m, ShardedEmbeddingBagCollection)
                                                     for m in root.modules()):
            raise TypeError("Tracer: a sharded collection cannot be traced for TorchScript (its stages run Python "
                            "collectives); TorchRec traces quantized inference modules, which shardwise does not "
                            "have. Run the module eagerly, or torch.compile its dense part")
        return super().trace(root, concrete_args)
