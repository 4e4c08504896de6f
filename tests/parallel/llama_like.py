"""A small Llama-style model (RMSNorm, attention on local heads, SwiGLU) and torchtitan's TP plan, for
either library: ``tp_plan(styles)`` takes shardwise.parallel or torch.distributed.tensor.parallel."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

DIM, HEADS, VOCAB, HIDDEN = 16, 4, 32, 24


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape
        # -1 heads: the local heads under column-wise q/k/v
        q, k, v = (w(x).view(b, s, -1, DIM // HEADS).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w2, self.w3 = nn.Linear(DIM, HIDDEN, bias=False), nn.Linear(HIDDEN, DIM, bias=False), \
            nn.Linear(DIM, HIDDEN, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm, self.attention = RMSNorm(DIM), Attention()
        self.ffn_norm, self.feed_forward = RMSNorm(DIM), FeedForward()

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self, n_layers):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Layer() for _ in range(n_layers))
        self.norm, self.output = RMSNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def make(n_layers, seed=0):
    torch.manual_seed(seed)
    model = Llama(n_layers)
    with torch.no_grad():  # RMSNorm weights away from 1, so their gradients matter
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model


def tp_plan(styles, n_layers, loss_parallel=False):
    """torchtitan's Llama3 plan (sequence parallel norms, column/row-wise projections)."""
    R, S = styles.Replicate, styles.Shard
    plan = {
        "tok_embeddings": styles.RowwiseParallel(input_layouts=R(), output_layouts=S(1)),
        "norm": styles.SequenceParallel(),
        "output": styles.ColwiseParallel(input_layouts=S(1), output_layouts=S(-1) if loss_parallel else R(),
                                         use_local_output=not loss_parallel),
    }
    for i in range(n_layers):
        p = f"layers.{i}."
        plan.update({
            p + "attention_norm": styles.SequenceParallel(),
            p + "attention": styles.PrepareModuleInput(input_layouts=(S(1),), desired_input_layouts=(R(),)),
            p + "attention.wq": styles.ColwiseParallel(), p + "attention.wk": styles.ColwiseParallel(),
            p + "attention.wv": styles.ColwiseParallel(),
            p + "attention.wo": styles.RowwiseParallel(output_layouts=S(1)),
            p + "ffn_norm": styles.SequenceParallel(),
            p + "feed_forward": styles.PrepareModuleInput(input_layouts=(S(1),), desired_input_layouts=(R(),)),
            p + "feed_forward.w1": styles.ColwiseParallel(),
            p + "feed_forward.w2": styles.RowwiseParallel(output_layouts=S(1)),
            p + "feed_forward.w3": styles.ColwiseParallel(),
        })
    return plan


class Styles:
    """The names tp_plan uses, from one library."""

    def __init__(self, lib: str):
        if lib == "torch":
            import torch.distributed.tensor as t
            import torch.distributed.tensor.parallel as tp
        else:
            import shardwise.parallel as tp
            import shardwise.tensor as t
        self.Replicate, self.Shard = t.Replicate, t.Shard
        for name in ("RowwiseParallel", "ColwiseParallel", "SequenceParallel", "PrepareModuleInput",
                     "parallelize_module"):
            setattr(self, name, getattr(tp, name))


def batch(seed=1, b=2, s=8):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (b, s), generator=g), torch.randint(0, VOCAB, (b, s), generator=g)
