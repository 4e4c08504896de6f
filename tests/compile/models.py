"""Small models and step functions shared by the compile tests and benchmark."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, dim: int = 16, hidden: int = 24, out: int = 5, layers: int = 3):
        super().__init__()
        sizes = [dim] + [hidden] * (layers - 1) + [out]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.relu(x)
        return x


class Block(nn.Module):
    """Embedding + pre-norm causal self-attention + MLP + LM head."""

    def __init__(self, vocab: int = 13, dim: int = 16, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.emb = nn.Embedding(vocab, dim)
        self.ln1 = nn.LayerNorm(dim)
        # no qkv bias: the key bias has a mathematically zero gradient, and Adam
        # would amplify its rounding noise into lr-sized differences between runs
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        b, t = tokens.shape
        x = self.emb(tokens)
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        split = lambda z: z.view(b, t, self.heads, -1).transpose(1, 2)  # noqa: E731
        q, k, v = split(q), split(k), split(v)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        mask = torch.ones(t, t, dtype=torch.bool, device=tokens.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, -1))
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return self.head(x)


def mlp_step(model, optimizer, x, y):
    loss = F.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss


def block_step(model, optimizer, tokens, targets):
    logits = model(tokens)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss


def make_case(name: str, global_batch: int, seed: int = 0):
    """(model, step_fn, batches) with deterministic weights and data."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    if name == "mlp":
        model = MLP()
        batches = [(torch.randn(global_batch, 16, generator=g), torch.randn(global_batch, 5, generator=g))
                   for _ in range(5)]
        return model, mlp_step, batches
    model = Block()
    batches = [(torch.randint(0, 13, (global_batch, 6), generator=g),
                torch.randint(0, 13, (global_batch, 6), generator=g)) for _ in range(5)]
    return model, block_step, batches


def make_optimizer(name: str, params):
    """``sgd``/``adam``/``adamw``; a ``_unfused`` suffix sets ``fused=False`` (the per-parameter traced update)."""
    kw = {"fused": False} if name.endswith("_unfused") else {}
    name = name.removesuffix("_unfused")
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=0.01, **kw)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-2, weight_decay=0.01, **kw)
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1, **kw)
