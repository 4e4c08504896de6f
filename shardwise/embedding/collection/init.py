"""Initial table values as a pure function of (seed, table name, row): the same under any plan, world
size or rank, whether the collection was built with storage or on the meta device.

Rows are drawn in blocks of ``ROWS_PER_BLOCK``; each block has its own generator, seeded from a
sha256 of (seed, table name, block index) -- never Python's per-process ``hash()`` -- so any row
range can be produced without drawing the rows before it, in bounded memory. Values are uniform in
``[weight_init_min, weight_init_max]`` when the config sets them, else TorchRec's default
``±sqrt(1 / num_embeddings)`` (the pooled magnitude does not grow with the table). A config's
``init_fn`` is applied per shard instead (as TorchRec does), so its values may depend on the plan.

Example:
    >>> from shardwise.embedding.collection.config import EmbeddingBagConfig
    >>> t = EmbeddingBagConfig(10, 4, "t", feature_names=["f"])
    >>> whole = init_rows(t, 0, 0, 10, 0, 4)
    >>> bool(torch.equal(whole[3:7, 1:3], init_rows(t, 0, 3, 7, 1, 3)))
    True
"""

from __future__ import annotations

import hashlib
import math

import torch

__all__ = ["ROWS_PER_BLOCK", "init_rows", "fill_rows", "init_bounds"]

ROWS_PER_BLOCK = 4096


def init_bounds(table) -> tuple[float, float]:
    lo, hi = getattr(table, "weight_init_min", None), getattr(table, "weight_init_max", None)
    bound = math.sqrt(1.0 / table.num_embeddings)
    return (-bound if lo is None else float(lo)), (bound if hi is None else float(hi))


def _block_seed(seed: int, name: str, block: int) -> int:
    digest = hashlib.sha256(f"{seed}/{name}/{block}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def init_rows(table, seed: int, r0: int, r1: int, c0: int, c1: int, dtype=torch.float32,
              device=None) -> torch.Tensor:
    """Rows [r0, r1) x columns [c0, c1) of ``table``'s initial values (fp32 draws, cast to ``dtype``)."""
    out = torch.empty(r1 - r0, c1 - c0, dtype=dtype, device=device)
    fill_rows(out, table, seed, r0, c0)
    return out


@torch.no_grad()
def fill_rows(out: torch.Tensor, table, seed: int, r0: int, c0: int) -> None:
    """Write the initial values of rows [r0, r0 + len(out)) x columns [c0, c0 + width) into ``out``."""
    lo, hi = init_bounds(table)
    dim, r1, c1 = table.embedding_dim, r0 + out.shape[0], c0 + out.shape[1]
    row = r0
    while row < r1:
        block = row // ROWS_PER_BLOCK
        start = block * ROWS_PER_BLOCK
        stop = min(start + ROWS_PER_BLOCK, table.num_embeddings)
        g = torch.Generator().manual_seed(_block_seed(seed, table.name, block))
        vals = torch.rand(stop - start, dim, generator=g)      # whole rows: the same for any column cut
        take = vals[row - start:min(stop, r1) - start, c0:c1]
        out[row - r0:row - r0 + take.shape[0]].copy_(take.mul_(hi - lo).add_(lo))
        row = min(stop, r1)
