"""Multi-layer perceptrons as TorchRec's ``torchrec.modules.mlp`` builds them (same constructor
arguments, parameter names and initialisation order), so weights and checkpoints move across.

Example:
    >>> import torch
    >>> mlp = MLP(in_size=40, layer_sizes=[16, 8, 4])
    >>> mlp(torch.randn(3, 40)).shape
    torch.Size([3, 4])
    >>> [name for name, _ in mlp.named_parameters()][:2]       # TorchRec's keys
    ['_mlp.0._linear.weight', '_mlp.0._linear.bias']
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

import torch
from torch import nn

__all__ = ["Perceptron", "MLP", "SwishLayerNorm"]


class SwishLayerNorm(nn.Module):
    """``x * sigmoid(LayerNorm(x))`` over ``input_dims`` (TorchRec's ``torchrec.modules.activation``).

    Example:
        >>> SwishLayerNorm(4)(torch.zeros(2, 4)).shape
        torch.Size([2, 4])
    """

    def __init__(self, input_dims, device: Optional[torch.device] = None):
        super().__init__()
        self.norm = nn.Sequential(nn.LayerNorm(input_dims, device=device), nn.Sigmoid())

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return input * self.norm(input)


class Perceptron(nn.Module):
    """One ``nn.Linear`` (``_linear``) followed by ``activation`` (a tensor function or a module).

    Example:
        >>> Perceptron(40, 16)(torch.randn(3, 40)).shape
        torch.Size([3, 16])
    """

    def __init__(self, in_size: int, out_size: int, bias: bool = True,
                 activation: Union[nn.Module, Callable[[torch.Tensor], torch.Tensor]] = torch.relu,
                 device: Optional[torch.device] = None, dtype: torch.dtype = torch.float32):
        super().__init__()
        self._in_size, self._out_size = in_size, out_size
        self._linear = nn.Linear(in_size, out_size, bias=bias, device=device, dtype=dtype)
        self._activation_fn = activation

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self._activation_fn(self._linear(input))


def _activation_for_layer(activation):
    """A module factory (a callable taking no argument and returning a module) is called once per
    layer, so layers never share an activation's parameters; anything else is used as it is."""
    if isinstance(activation, nn.Module) or activation in (torch.relu, torch.sigmoid):
        return activation
    try:
        made = activation()
    except TypeError as e:   # a function of a tensor (it wants an argument): use it as the activation
        if "positional argument" not in str(e):
            raise
        return activation
    if not isinstance(made, nn.Module):
        raise ValueError(f"MLP: activation={activation!r} called without arguments returned a "
                         f"{type(made).__name__}, not a torch.nn.Module; pass a tensor function, a module, "
                         f"a module factory, or one of 'relu', 'sigmoid', 'swish_layernorm'")
    return made


class MLP(nn.Module):
    """``Perceptron`` layers in sequence (``_mlp``), ``layer_sizes`` giving each layer's output size.

    ``activation``: ``"relu"`` (default, as ``torch.relu``), ``"sigmoid"``, ``"swish_layernorm"`` (a
    :class:`SwishLayerNorm` per layer), a tensor function, a module, or a factory of modules (one per
    layer). ``activation_on_last=False`` leaves the last layer linear.

    Example:
        >>> MLP(10, [8, 2], activation="sigmoid")(torch.zeros(5, 10)).shape
        torch.Size([5, 2])
    """

    def __init__(self, in_size: int, layer_sizes: Sequence[int], bias: bool = True,
                 activation: Union[str, Callable, nn.Module] = torch.relu, device: Optional[torch.device] = None,
                 dtype: torch.dtype = torch.float32, activation_on_last: bool = True):
        super().__init__()
        layer_sizes = list(layer_sizes)
        if not layer_sizes or any(not isinstance(s, int) or s < 1 for s in layer_sizes):
            raise ValueError(f"MLP: layer_sizes={layer_sizes!r} must be a non-empty list of positive ints "
                             f"(the output size of each layer)")
        named = {"relu": torch.relu, "sigmoid": torch.sigmoid}
        if isinstance(activation, str) and activation not in (*named, "swish_layernorm"):
            raise ValueError(f"MLP: activation={activation!r} is not one of 'relu', 'sigmoid', "
                             f"'swish_layernorm'; pass a function or module for any other")
        layers = []
        for i, out in enumerate(layer_sizes):
            if not activation_on_last and i == len(layer_sizes) - 1:
                act = nn.Identity()
            elif activation == "swish_layernorm":
                act = SwishLayerNorm(out, device=device)
            else:
                act = _activation_for_layer(named.get(activation, activation)
                                            if isinstance(activation, str) else activation)
            layers.append(Perceptron(layer_sizes[i - 1] if i else in_size, out, bias=bias, activation=act,
                                     device=device, dtype=dtype))
        self._mlp = nn.Sequential(*layers)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self._mlp(input)
