r"""An exported click model, in plain PyTorch and numpy: what ``shardwise export`` writes next to the
weights as ``model.py``, so a server without shardwise can load and run it.

The export folder holds:

- ``model.json``: the shapes (26 table sizes, embedding dim, MLP widths), the input rules and the
  vocabulary's digest;
- ``model.pt``: a plain state dict (``torch.load(..., weights_only=True)``): ``tables.C<k>.weight``
  [rows, dim] per feature, ``bottom.*`` / ``top.*`` the MLPs' ``nn.Linear`` weights; with
  ``"table_dtype": "int8_rowwise"`` each table is ``tables.C<k>.qweight`` (uint8 [rows, dim]) and
  ``tables.C<k>.scale_bias`` (float32 [rows, 2]): a row is ``qweight * scale + bias``;
- ``vocab/C<k>.npy`` (with a vocabulary): int64 raw ids in row order;
- this file, ``model.py``.

Inputs, as in training: dense counts (missing and negative ones read as 0) enter as ``log1p``; a
raw id becomes a row through the vocabulary (an id not in it -> the feature's rare/OOV row,
``oov_rows`` in ``model.json``) or, without one, by ``id % rows``; a missing id (-1) is an empty bag.
Each feature's bag is summed (one id per feature in Criteo logs); the output is a logit.

Example (``folder`` made by ``shardwise export``; here a model of random weights)::

    import model                                   # this file, from the export folder
    m = model.load(folder)
    m.score(dense_counts, raw_ids)                 # [n, 13] counts, [n, 26] raw ids (-1 = missing) -> [n]
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

__all__ = ["ClickModel", "RowwiseInt8Bag", "quantize_rowwise", "load", "FORMAT"]

FORMAT = "shardwise-exported-dlrm"


def _mlp(widths, last_relu: bool) -> nn.Sequential:
    layers = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(nn.Linear(a, b))
        if last_relu or i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class RowwiseInt8Bag(nn.Module):
    """A summed embedding bag over uint8 rows with a float scale and bias per row (TorchRec's 8-bit
    row-wise layout): only the rows looked up are dequantized, so the table stays 1 byte per value."""

    def __init__(self, rows: int, dim: int):
        super().__init__()
        self.register_buffer("qweight", torch.zeros(rows, dim, dtype=torch.uint8))
        self.register_buffer("scale_bias", torch.zeros(rows, 2, dtype=torch.float32))

    def forward(self, values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        sb = self.scale_bias[values]
        rows = self.qweight[values].float() * sb[:, :1] + sb[:, 1:]
        lengths = torch.diff(offsets, append=offsets.new_tensor([values.numel()]))
        bag = torch.repeat_interleave(torch.arange(offsets.numel()), lengths)
        return torch.zeros(offsets.numel(), rows.shape[1]).index_add_(0, bag, rows)


def quantize_rowwise(weight: torch.Tensor) -> tuple:
    """(uint8 [rows, dim], float32 [rows, 2] scale and bias) of a float table, row by row."""
    lo, hi = weight.min(dim=1).values, weight.max(dim=1).values
    scale = torch.where(hi > lo, (hi - lo) / 255.0, torch.ones_like(hi))
    q = torch.round((weight - lo[:, None]) / scale[:, None]).clamp(0, 255).to(torch.uint8)
    return q, torch.stack([scale, lo], dim=1).float()


class ClickModel(nn.Module):
    """The DLRM of ``model.json``: bottom MLP on log1p(counts), one summed bag per feature, dot products
    of every pair among the bottom output and the bags, top MLP to one logit.

    ``forward(dense, rows)`` takes log1p'd dense features [n, 13] and table rows [n, 26] (-1 = missing);
    ``score(counts, raw_ids)`` maps raw inputs first and returns probabilities (numpy).
    """

    def __init__(self, spec: dict, vocab: "list | None" = None):
        super().__init__()
        self.spec = spec
        self.features = list(spec["sparse_features"])
        self.sizes = [int(n) for n in spec["table_sizes"]]
        dim = int(spec["dim"])
        self.dim = dim
        bag = RowwiseInt8Bag if spec.get("table_dtype") == "int8_rowwise" else \
            (lambda n, d: nn.EmbeddingBag(n, d, mode="sum"))
        self.tables = nn.ModuleDict({f: bag(n, dim) for f, n in zip(self.features, self.sizes)})
        self.bottom = _mlp(spec["bottom"], last_relu=True)
        self.top = _mlp(spec["top"], last_relu=False)
        n = len(self.features) + 1
        iu = torch.triu_indices(n, n, offset=1)
        self.register_buffer("pair_index", iu[0] * n + iu[1], persistent=False)
        self.vocab = vocab   # per feature: (sorted raw ids, their rows, OOV row)

    def forward(self, dense: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        b = dense.shape[0]
        x = self.bottom(dense)
        pooled = []
        for j, f in enumerate(self.features):
            col = rows[:, j]
            present = col >= 0
            offsets = torch.cumsum(present.long(), 0) - present.long()
            pooled.append(self.tables[f](col[present], offsets))
        feats = torch.cat([x.unsqueeze(1), torch.stack(pooled, dim=1)], dim=1)
        dots = torch.bmm(feats, feats.transpose(1, 2)).reshape(b, -1)
        inter = torch.index_select(dots, 1, self.pair_index)
        return self.top(torch.cat([x, inter], dim=1)).squeeze(1)

    def rows(self, raw_ids: np.ndarray) -> np.ndarray:
        """Raw ids [n, 26] (-1 = missing) -> table rows, as the job mapped them."""
        raw_ids = np.asarray(raw_ids, dtype=np.int64)
        out = np.full(raw_ids.shape, -1, dtype=np.int64)
        for j, size in enumerate(self.sizes):
            col = raw_ids[:, j]
            present = col >= 0
            x = col[present]
            if self.vocab is not None:
                ids, rows, oov = self.vocab[j]
                if len(ids):
                    pos = np.minimum(np.searchsorted(ids, x), len(ids) - 1)
                    x = np.where(ids[pos] == x, rows[pos], oov)
                else:
                    x = np.full(len(x), oov, dtype=np.int64)
            out[present, j] = x % size   # a no-op in range; raw ids (or capped tables) fold
        return out

    @torch.no_grad()
    def score(self, counts: np.ndarray, raw_ids: np.ndarray) -> np.ndarray:
        """Click probabilities for raw counts [n, 13] and raw ids [n, 26] (-1 = missing)."""
        dense = torch.from_numpy(np.log1p(np.maximum(np.asarray(counts, dtype=np.float32), 0)))
        rows = torch.from_numpy(self.rows(raw_ids))
        return torch.sigmoid(self(dense, rows)).numpy()


def load(folder) -> ClickModel:
    """The model exported to ``folder``, on the CPU, in eval mode (no process group, no shardwise)."""
    folder = Path(folder)
    spec = json.loads((folder / "model.json").read_text())
    if spec.get("format") != FORMAT or spec.get("version") != 1:
        raise ValueError(f"{str(folder)!r}: model.json is not a version-1 {FORMAT} file; export the model again")
    vocab = None
    if spec.get("ids") == "vocabulary":
        vocab = []
        for f, oov in zip(spec["sparse_features"], spec["oov_rows"]):
            raw = np.load(folder / "vocab" / f"{f}.npy")
            order = np.argsort(raw, kind="stable")
            vocab.append((raw[order], order.astype(np.int64), int(oov)))
    model = ClickModel(spec, vocab)
    model.load_state_dict(torch.load(folder / "model.pt", weights_only=True, map_location="cpu"))
    return model.eval()
