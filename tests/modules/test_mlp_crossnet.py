"""shardwise.modules against plain torch."""

import pytest
import torch
import torch.nn.functional as F

from shardwise.modules import MLP, CrossNet, LowRankCrossNet, SwishLayerNorm


def test_mlp_is_linear_then_activation_per_layer():
    torch.manual_seed(0)
    mlp, x = MLP(6, [5, 3], activation="sigmoid", activation_on_last=False), torch.randn(4, 6)
    l0, l1 = mlp._mlp[0]._linear, mlp._mlp[1]._linear
    torch.testing.assert_close(mlp(x), F.linear(torch.sigmoid(F.linear(x, l0.weight, l0.bias)), l1.weight, l1.bias))


def test_mlp_module_factory_gives_each_layer_its_own_module():
    mlp = MLP(4, [4, 4], activation=lambda: SwishLayerNorm(4))
    a, b = (p._activation_fn for p in mlp._mlp)
    assert isinstance(a, SwishLayerNorm) and a is not b
    assert MLP(4, [4], activation=torch.tanh)._mlp[0]._activation_fn is torch.tanh


@pytest.mark.parametrize("kwargs, match", [({"layer_sizes": []}, "non-empty"), ({"activation": "gelu"}, "'gelu'"),
                                           ({"activation": lambda: 3}, "not a torch.nn.Module")])
def test_mlp_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MLP(4, **{"layer_sizes": [2], **kwargs})


def test_crossnets_equal_their_formulas():
    torch.manual_seed(0)
    x0 = torch.randn(3, 5)
    low = LowRankCrossNet(5, num_layers=2, low_rank=2)
    full = CrossNet(5, num_layers=2)
    for p in list(low.bias) + list(full.bias):
        torch.nn.init.normal_(p)
    x = x0
    for w, v, b in zip(low.W_kernels, low.V_kernels, low.bias):
        x = x0 * (w @ (v @ x.T) + b[:, None]).T + x
    torch.testing.assert_close(low(x0), x)
    x = x0
    for w, b in zip(full.kernels, full.bias):
        x = x0 * (w @ x.T + b).T + x
    torch.testing.assert_close(full(x0), x)
    with pytest.raises(ValueError, match="num_layers=-1"):
        LowRankCrossNet(5, num_layers=-1)


def test_a_factory_that_fails_is_not_taken_for_a_tensor_function():
    def broken_factory():
        raise TypeError("unsupported operand type(s)")

    with pytest.raises(TypeError, match="unsupported operand"):
        MLP(4, [2], activation=broken_factory)
