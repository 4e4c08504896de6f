"""A Llama-style decoder (RMSNorm, rotary embedding via complex multiply, causal SDPA, SwiGLU, output
tied to the embedding) and torchtitan's Llama3 tensor-parallel plan for either library, in two
attention variants: ``"local"`` (q/k/v handed to attention as local tensors, as Llama3) and ``"heads"``
(q/k/v stay DTensors sharded over heads, as torchtitan's Qwen3 plan; needs an SDPA sharding rule).

Used by tests/parallel/test_llama_tp.py, test_clip_grad_norm.py, test_loss_parallel.py and
benchmarks/llama_tp.py (which imports it by path)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Config:
    dim: int = 32
    n_layers: int = 2
    n_heads: int = 4
    vocab: int = 64
    hidden: int = 48
    seq: int = 8
    batch: int = 2


def rotary_freqs(head_dim: int, seq: int, theta: float = 10000.0) -> torch.Tensor:
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.outer(torch.arange(seq).float(), freqs)
    return torch.polar(torch.ones_like(angles), angles)  # (seq, head_dim / 2) complex


def apply_rotary(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """x: (batch, seq, heads, head_dim); pairs of features rotated as complex numbers."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs_cis.view(1, x.shape[1], 1, -1)).flatten(3).type_as(x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Attention(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.head_dim = cfg.dim // cfg.n_heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(cfg.dim, cfg.dim, bias=False) for _ in range(4))

    def forward(self, x, freqs_cis):
        b, s, _ = x.shape
        # -1 heads: all heads on DTensors, this rank's heads on local tensors
        q, k, v = (w(x).view(b, s, -1, self.head_dim) for w in (self.wq, self.wk, self.wv))
        q, k = apply_rotary(q, freqs_cis), apply_rotary(k, freqs_cis)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.w2 = nn.Linear(cfg.hidden, cfg.dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.attention_norm, self.attention = RMSNorm(cfg.dim), Attention(cfg)
        self.ffn_norm, self.feed_forward = RMSNorm(cfg.dim), FeedForward(cfg)

    def forward(self, x, freqs_cis):
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim)
        self.output = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        self.output.weight = self.tok_embeddings.weight
        self.register_buffer("freqs_cis", rotary_freqs(cfg.dim // cfg.n_heads, cfg.seq), persistent=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, self.freqs_cis)
        return self.output(self.norm(h))

    def init_weights(self, seed: int) -> None:
        """torchtitan's initialisers (in place, so sharded parameters draw their slices)."""
        with torch.no_grad():  # a buffer left empty by meta-device construction + to_empty
            self.freqs_cis.copy_(rotary_freqs(self.cfg.dim // self.cfg.n_heads, self.cfg.seq))
        torch.manual_seed(seed)
        std = 0.02 / math.sqrt(2 * self.cfg.n_layers)
        nn.init.normal_(self.tok_embeddings.weight, std=self.cfg.dim ** -0.5)  # tied: it scales the logits too
        for layer in self.layers:
            for norm in (layer.attention_norm, layer.ffn_norm):
                nn.init.uniform_(norm.weight, 0.5, 1.5)  # away from 1, so their gradients matter
            for lin in (layer.attention.wq, layer.attention.wk, layer.attention.wv, layer.feed_forward.w1):
                nn.init.trunc_normal_(lin.weight, mean=0.0, std=0.02)
            for lin in (layer.attention.wo, layer.feed_forward.w2, layer.feed_forward.w3):
                nn.init.trunc_normal_(lin.weight, mean=0.0, std=std)
        nn.init.ones_(self.norm.weight)


def make(cfg: Config, seed: int = 0) -> Llama:
    """The single-process model with ``init_weights(seed)``: the reference, or the input to ``parallelize``."""
    model = Llama(cfg)
    model.init_weights(seed)
    return model


def tp_plan(lib, cfg: Config, attention: str = "local", loss_parallel: bool = False) -> dict:
    """torchtitan's Llama3 plan (v0.2.2 ``apply_tp``) with ``lib`` = shardwise or torch names (``Styles``).
    ``attention="heads"`` keeps q/k/v DTensors (use_local_output=False) and hands rotary's frequencies
    to attention as a replicated DTensor."""
    R, S = lib.Replicate, lib.Shard
    local = attention == "local"
    plan = {
        "tok_embeddings": lib.RowwiseParallel(input_layouts=R(), output_layouts=S(1)),
        "norm": lib.SequenceParallel(),
        "output": lib.ColwiseParallel(input_layouts=S(1), output_layouts=S(-1) if loss_parallel else R(),
                                      use_local_output=not loss_parallel),
    }
    freqs = (None, None) if local else (R(), R())
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        plan.update({
            p + "attention_norm": lib.SequenceParallel(),
            p + "attention": lib.PrepareModuleInput(input_layouts=(S(1), freqs[0]),
                                                    desired_input_layouts=(R(), freqs[1])),
            p + "attention.wq": lib.ColwiseParallel(use_local_output=local),
            p + "attention.wk": lib.ColwiseParallel(use_local_output=local),
            p + "attention.wv": lib.ColwiseParallel(use_local_output=local),
            p + "attention.wo": lib.RowwiseParallel(output_layouts=S(1)),
            p + "ffn_norm": lib.SequenceParallel(),
            p + "feed_forward": lib.PrepareModuleInput(input_layouts=(S(1),), desired_input_layouts=(R(),)),
            p + "feed_forward.w1": lib.ColwiseParallel(),
            p + "feed_forward.w2": lib.RowwiseParallel(output_layouts=S(1)),
            p + "feed_forward.w3": lib.ColwiseParallel(),
        })
    return plan


class Styles:
    """The names ``tp_plan`` uses, from one library (``"shardwise"`` or ``"torch"``)."""

    def __init__(self, name: str):
        if name == "torch":
            import torch.distributed.tensor as t
            import torch.distributed.tensor.parallel as tp
        else:
            import shardwise.parallel as tp
            import shardwise.tensor as t
        self.name = name
        self.Replicate, self.Shard, self.DTensor = t.Replicate, t.Shard, t.DTensor
        for n in ("RowwiseParallel", "ColwiseParallel", "SequenceParallel", "PrepareModuleInput",
                  "parallelize_module"):
            setattr(self, n, getattr(tp, n))


def parallelize(model: Llama, lib: Styles, mesh, attention: str = "local", loss_parallel: bool = False) -> Llama:
    """Apply the plan, then tie the output to the embedding again: each style distributes its own module's
    parameters, so the shared Parameter comes out as two (both Shard(0) over the vocabulary)."""
    lib.parallelize_module(model, mesh, tp_plan(lib, model.cfg, attention, loss_parallel))
    model.output.weight = model.tok_embeddings.weight
    return model


def batch(cfg: Config, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    shape = (cfg.batch, cfg.seq)
    return torch.randint(0, cfg.vocab, shape, generator=g), torch.randint(0, cfg.vocab, shape, generator=g)
