"""Deep & Cross Network layers as TorchRec's ``torchrec.modules.crossnet`` holds them (same
arguments, parameter names and initialisation): ``CrossNet`` (full rank) and ``LowRankCrossNet``.

Example:
    >>> import torch
    >>> dcn = LowRankCrossNet(in_features=10, num_layers=2, low_rank=3)
    >>> dcn(torch.randn(4, 10)).shape
    torch.Size([4, 10])
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["CrossNet", "LowRankCrossNet"]


def _xavier(*shape: int) -> nn.Parameter:
    return nn.Parameter(nn.init.xavier_normal_(torch.empty(*shape)))


def _check(name: str, in_features: int, num_layers: int, low_rank: int = 1) -> None:
    for arg, value in (("in_features", in_features), ("num_layers", num_layers), ("low_rank", low_rank)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if arg == "num_layers" else 1):
            raise ValueError(f"{name}: {arg}={value!r} must be an int >= {0 if arg == 'num_layers' else 1}")


class CrossNet(nn.Module):
    """DCN v1 with full-rank kernels: ``x_{l+1} = x_0 * (W_l x_l + b_l) + x_l``, ``W_l`` of size N x N.

    Example:
        >>> CrossNet(in_features=6, num_layers=2)(torch.randn(3, 6)).shape
        torch.Size([3, 6])
    """

    def __init__(self, in_features: int, num_layers: int):
        super().__init__()
        _check("CrossNet", in_features, num_layers)
        self._num_layers = num_layers
        self.kernels = nn.ParameterList([_xavier(in_features, in_features) for _ in range(num_layers)])
        self.bias = nn.ParameterList([nn.Parameter(torch.zeros(in_features, 1)) for _ in range(num_layers)])

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        x0 = input.unsqueeze(2)
        x = x0
        for w, b in zip(self.kernels, self.bias):
            x = x0 * (torch.matmul(w, x) + b) + x
        return x.squeeze(2)


class LowRankCrossNet(nn.Module):
    """DCN v2 with each layer's N x N kernel as the product of ``W (N x r)`` and ``V (r x N)``:
    ``x_{l+1} = x_0 * (W_l (V_l x_l) + b_l) + x_l``; ``low_rank`` is r (>= 1).

    Example:
        >>> net = LowRankCrossNet(in_features=8, num_layers=1, low_rank=2)
        >>> [n for n, _ in net.named_parameters()]                 # TorchRec's names
        ['W_kernels.0', 'V_kernels.0', 'bias.0']
    """

    def __init__(self, in_features: int, num_layers: int, low_rank: int = 1):
        super().__init__()
        _check("LowRankCrossNet", in_features, num_layers, low_rank)
        self._num_layers, self._low_rank = num_layers, low_rank
        # drawn in TorchRec's order (every W, then every V), so one seed gives TorchRec's values
        self.W_kernels = nn.ParameterList([_xavier(in_features, low_rank) for _ in range(num_layers)])
        self.V_kernels = nn.ParameterList([_xavier(low_rank, in_features) for _ in range(num_layers)])
        self.bias = nn.ParameterList([nn.Parameter(torch.zeros(in_features)) for _ in range(num_layers)])

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        x0 = x = input
        for w, v, b in zip(self.W_kernels, self.V_kernels, self.bias):
            x = x0 * (nn.functional.linear(nn.functional.linear(x, v), w) + b) + x
        return x
