"""Quantized communication (TorchRec's qcomm): the pooled- and sequence-embedding all-to-alls and the
row-wise reduce-scatter in 16-bit on the wire, forward and backward.

TorchRec's names and shapes (``torchrec.distributed.fbgemm_qcomm_codec`` and the codec types of
``torchrec.distributed.types``): a :class:`QCommsConfig` names a :class:`CommType` per direction,
:func:`get_qcomm_codecs_registry` turns it into ``{CommOp name: QuantizedCommCodecs}``, and the
registry is handed to the sharding (``shard(..., qcomm_codecs_registry=...)``, or TorchRec's
``EmbeddingBagCollectionSharder(qcomm_codecs_registry=...)``). A codec casts a buffer to the wire dtype
before the collective (``encode``) and back after it (``decode``); with a loss scale, ``encode``
multiplies by it and ``decode`` divides in fp32 (TorchRec divides in fp16), so small gradients survive.

Only FP32/FP16/BF16 are casts we can do with torch alone; INT8, FP8 and MX4 need fbgemm's quantize
kernels and are refused with a message. Unlike TorchRec, BF16 is honoured on gloo (CPU): torch's gloo
moves bfloat16 buffers (TorchRec falls back to FP16 there).

Example:
    >>> cfg = QCommsConfig(forward_precision=CommType.FP16, backward_precision=CommType.BF16)
    >>> registry = get_qcomm_codecs_registry(cfg)
    >>> sorted(registry)
    ['POOLED_EMBEDDINGS_ALL_TO_ALL', 'POOLED_EMBEDDINGS_REDUCE_SCATTER', 'SEQUENCE_EMBEDDINGS_ALL_TO_ALL']
    >>> codecs = registry["POOLED_EMBEDDINGS_ALL_TO_ALL"]
    >>> codecs.forward.encode(torch.tensor([1.0, 2.5])).dtype, codecs.backward.quantized_dtype
    (torch.float16, torch.bfloat16)
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from enum import Enum, unique
from typing import Optional

import torch

__all__ = ["CommType", "CommOp", "QCommsConfig", "QuantizedCommCodec", "NoOpQuantizedCommCodec",
           "QuantizedCommCodecs", "get_qcomm_codecs", "get_qcomm_codecs_registry", "codecs_digest"]


@unique
class CommType(Enum):
    """Precision of a collective's buffer on the wire (TorchRec's ``CommType``)."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    INT8 = "int8"
    MX4 = "mx4"

    def __str__(self) -> str:
        return self.value


class CommOp(Enum):
    """The collectives a registry may hold codecs for (TorchRec's ``CommOp``; keys are the names)."""

    POOLED_EMBEDDINGS_ALL_TO_ALL = "pooled_embeddings_all_to_all"
    POOLED_EMBEDDINGS_REDUCE_SCATTER = "pooled_embeddings_reduce_scatter"
    SEQUENCE_EMBEDDINGS_ALL_TO_ALL = "sequence_embeddings_all_to_all"


_FP16_MAX = torch.finfo(torch.float16).max
_WIRE_DTYPES = {CommType.FP32: torch.float32, CommType.FP16: torch.float16, CommType.BF16: torch.bfloat16}


@dataclass
class QCommsConfig:
    """Per direction, the precision of the sharded embeddings' collectives (TorchRec's fields; the
    fp8/mx4 ones are accepted for signature compatibility and refused when their precision is used)."""

    forward_precision: CommType = CommType.FP32
    backward_precision: CommType = CommType.FP32
    forward_loss_scale: Optional[float] = None
    backward_loss_scale: Optional[float] = None
    fp8_quantize_dim: Optional[int] = None
    fp8_quantize_dim_bwd: Optional[int] = None
    fp8_bwd_uses_143: Optional[bool] = False
    fp8_output_dtype: Optional[object] = None
    mx4_quantize_dim: Optional[int] = None
    mx4_quantize_dim_bwd: Optional[int] = None
    mx4_rounding_mode: Optional[object] = None
    output_dtype: Optional[object] = None

    def __post_init__(self) -> None:
        for name in ("forward_precision", "backward_precision"):
            value = getattr(self, name)
            if not isinstance(value, CommType):
                raise TypeError(f"QCommsConfig({name}={value!r}): must be a CommType, e.g. CommType.FP16")
            if value not in _WIRE_DTYPES:
                raise ValueError(f"QCommsConfig({name}=CommType.{value.name}): {value.name} needs fbgemm's "
                                 f"quantize kernels, which shardwise does not have; use CommType.FP16 or "
                                 f"CommType.BF16 (half the bytes of FP32)")
        for name in ("forward_loss_scale", "backward_loss_scale"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"QCommsConfig({name}={value!r}): must be a positive number or None")


class QuantizedCommCodec:
    """A cast codec: ``encode`` (optionally scaled; saturating to fp16's range, as fbgemm's) to
    ``quantized_dtype``, ``decode`` back to float32 (unscaled). TorchRec's codec protocol: ``ctx`` is accepted and unused (a cast needs no context)."""

    def __init__(self, comm_precision: CommType, loss_scale: Optional[float] = None):
        self.comm_precision = comm_precision
        self._dtype = _WIRE_DTYPES[comm_precision]
        self._scale = None if loss_scale is None else float(loss_scale)

    @property
    def quantized_dtype(self) -> torch.dtype:
        return self._dtype

    def encode(self, input_tensor: torch.Tensor, ctx=None) -> torch.Tensor:
        x = input_tensor if self._scale is None else input_tensor * self._scale
        if self._dtype == torch.float16:   # saturate, as fbgemm's cast does: no inf from a large (scaled) value
            x = x.clamp(-_FP16_MAX, _FP16_MAX)
        return x.to(self._dtype)

    def decode(self, input_grad: torch.Tensor, ctx=None) -> torch.Tensor:
        x = input_grad.to(torch.float32)
        return x if self._scale is None else x / self._scale

    def calc_quantized_size(self, input_len: int, ctx=None) -> int:
        return input_len

    def create_context(self):
        return None

    def __repr__(self) -> str:
        scale = "" if self._scale is None else f", loss_scale={self._scale}"
        return f"QuantizedCommCodec({self.comm_precision.name}{scale})"


class NoOpQuantizedCommCodec(QuantizedCommCodec):
    """Full precision: the buffer travels as it is."""

    def __init__(self):
        super().__init__(CommType.FP32)

    def encode(self, input_tensor: torch.Tensor, ctx=None) -> torch.Tensor:
        return input_tensor

    def decode(self, input_grad: torch.Tensor, ctx=None) -> torch.Tensor:
        return input_grad


@dataclass
class QuantizedCommCodecs:
    """The codecs of one collective: ``forward`` for its values, ``backward`` for their gradients."""

    forward: QuantizedCommCodec = field(default_factory=NoOpQuantizedCommCodec)
    backward: QuantizedCommCodec = field(default_factory=NoOpQuantizedCommCodec)


def _codec(precision: CommType, scale: Optional[float]) -> QuantizedCommCodec:
    return NoOpQuantizedCommCodec() if precision == CommType.FP32 and scale is None else \
        QuantizedCommCodec(precision, scale)


def get_qcomm_codecs(qcomms_config: Optional[QCommsConfig]) -> QuantizedCommCodecs:
    """The forward/backward codecs ``qcomms_config`` asks for (no-ops for None)."""
    if qcomms_config is None:
        return QuantizedCommCodecs()
    return QuantizedCommCodecs(_codec(qcomms_config.forward_precision, qcomms_config.forward_loss_scale),
                               _codec(qcomms_config.backward_precision, qcomms_config.backward_loss_scale))


def get_qcomm_codecs_registry(qcomms_config: QCommsConfig, comm_ops: Optional[list] = None,
                              device: Optional[torch.device] = None) -> Optional[dict]:
    """``{CommOp name: QuantizedCommCodecs}`` for ``comm_ops`` (default: the three embedding
    collectives), or None when both directions are FP32 (as TorchRec). ``device`` is accepted for
    TorchRec's signature; every precision here runs on every backend, so it changes nothing.

    Example:
        >>> get_qcomm_codecs_registry(QCommsConfig()) is None
        True
        >>> r = get_qcomm_codecs_registry(QCommsConfig(CommType.FP16, CommType.FP16), [CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL])
        >>> r["POOLED_EMBEDDINGS_ALL_TO_ALL"].forward
        QuantizedCommCodec(FP16)
    """
    if not isinstance(qcomms_config, QCommsConfig):
        raise TypeError(f"get_qcomm_codecs_registry: qcomms_config must be a QCommsConfig, got "
                        f"{type(qcomms_config).__name__}")
    if qcomms_config.forward_precision == CommType.FP32 and qcomms_config.backward_precision == CommType.FP32:
        return None
    ops = list(CommOp) if comm_ops is None else list(comm_ops)
    bad = [op for op in ops if not isinstance(op, CommOp)]
    if bad:
        raise TypeError(f"get_qcomm_codecs_registry: comm_ops must be CommOp members, got {bad!r}")
    return {op.name: get_qcomm_codecs(copy.deepcopy(qcomms_config)) for op in ops}


def check_registry(registry) -> Optional[dict]:
    """``registry`` validated (None passes): a dict of CommOp names to QuantizedCommCodecs."""
    if registry is None:
        return None
    if not isinstance(registry, dict):
        raise TypeError(f"qcomm_codecs_registry must be a dict from get_qcomm_codecs_registry(), got "
                        f"{type(registry).__name__}")
    names = {op.name for op in CommOp}
    for key, value in registry.items():
        if key not in names:
            raise ValueError(f"qcomm_codecs_registry: unknown key {key!r}; keys are CommOp names {sorted(names)}")
        if not isinstance(value, QuantizedCommCodecs) or not all(
                isinstance(c, QuantizedCommCodec) for c in (value.forward, value.backward)):
            raise TypeError(f"qcomm_codecs_registry[{key!r}] must be QuantizedCommCodecs of shardwise codecs "
                            f"(from get_qcomm_codecs_registry), got {value!r}")
    return registry


def codecs_digest(registry: Optional[dict]) -> str:
    """A printable summary every rank must share: the wire dtypes and scales per collective."""
    if not registry:
        return "fp32"
    return ";".join(f"{k}:{v.forward!r}/{v.backward!r}" for k, v in sorted(registry.items()))
