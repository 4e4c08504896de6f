"""Printing in TorchRec's format: one bracketed list per bag, keyed per feature."""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["bags_string", "jt_string", "kjt_string"]


def bags_string(flat: torch.Tensor, bounds: list) -> str:
    """``[[bag 0], [bag 1], ...]`` with ``bounds`` the offsets of the bags in ``flat``."""
    if flat.dim() > 2:
        raise ValueError(f"printing jagged values of {flat.dim()} dims is not supported (at most 2: ids or "
                         f"[N, D] rows); print .values() instead")
    return "[" + ", ".join(str(flat[a:b].tolist()) for a, b in zip(bounds[:-1], bounds[1:])) + "]"


def jt_string(values: torch.Tensor, weights: Optional[torch.Tensor], offsets: list) -> str:
    if weights is None:
        return "JaggedTensor({\n    " + bags_string(values, offsets) + "\n})\n"
    return ('JaggedTensor({\n    "values": ' + bags_string(values, offsets) + ',\n    "weights": '
            + bags_string(weights, offsets) + "\n})\n")


def kjt_string(keys: list, values: torch.Tensor, weights: Optional[torch.Tensor], offsets: list,
               lengths_offset_per_key: list) -> str:
    if not keys:
        return "KeyedJaggedTensor()\n"
    parts = []
    for i, key in enumerate(keys):
        bounds = offsets[lengths_offset_per_key[i]:lengths_offset_per_key[i + 1] + 1]
        if weights is None:
            parts.append(f'    "{key}": ' + bags_string(values, bounds))
        else:
            parts.append(f'    "{key}": {{\n        "values": ' + bags_string(values, bounds)
                         + ',\n        "weights": ' + bags_string(weights, bounds) + "\n    }")
    return "KeyedJaggedTensor({\n" + ",\n".join(parts) + "\n})\n"
