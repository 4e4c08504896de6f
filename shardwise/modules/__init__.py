"""Dense building blocks of recommendation models, as TorchRec's ``torchrec.modules`` names them:
:class:`MLP` (``torchrec.modules.mlp``), :class:`LowRankCrossNet` and :class:`CrossNet`
(``torchrec.modules.crossnet``). The embedding collections live in :mod:`shardwise.embedding`.

Example:
    >>> import torch
    >>> from shardwise.modules import MLP, LowRankCrossNet
    >>> x = torch.randn(2, 12)
    >>> LowRankCrossNet(12, num_layers=2, low_rank=4)(MLP(12, [12])(x)).shape
    torch.Size([2, 12])
"""

from .crossnet import CrossNet, LowRankCrossNet
from .mlp import MLP, Perceptron, SwishLayerNorm

__all__ = ["MLP", "Perceptron", "SwishLayerNorm", "CrossNet", "LowRankCrossNet"]
