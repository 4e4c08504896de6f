"""TorchRec's helper API around the sparse types: equality, pytree registration, KJT <-> dict modules.

Example:
    >>> kjt = KeyedJaggedTensor(["f"], torch.tensor([1, 2]), lengths=torch.tensor([2, 0]))
    >>> kjt_is_equal(kjt, KeyedJaggedTensor.from_jt_dict(kjt.to_dict()))
    True
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.utils._pytree as pytree
from torch.fx._pytree import register_pytree_flatten_spec

from .jagged import JaggedTensor
from .keyed_jagged import KeyedJaggedTensor
from .keyed_tensor import KeyedTensor

__all__ = ["jt_is_equal", "kjt_is_equal", "ComputeKJTToJTDict", "ComputeJTDictToKJT"]


def _same(a: Optional[torch.Tensor], b: Optional[torch.Tensor]) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and bool(torch.equal(a, b))


def jt_is_equal(jt_1, jt_2) -> bool:
    """True when both are JaggedTensors with equal values, lengths and weights (either both unweighted).

    Example:
        >>> jt = JaggedTensor(torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 1]))
        >>> jt_is_equal(jt, JaggedTensor(torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 2])))
        False
    """
    if not isinstance(jt_1, JaggedTensor) or not isinstance(jt_2, JaggedTensor):
        return False
    return (_same(jt_1.values(), jt_2.values()) and _same(jt_1.lengths(), jt_2.lengths())
            and _same(jt_1.weights_or_none(), jt_2.weights_or_none()))


def kjt_is_equal(kjt_1, kjt_2) -> bool:
    """True when both are KeyedJaggedTensors with the same keys (in order), batch sizes and tensors.

    Example:
        >>> kjt = KeyedJaggedTensor(["f1", "f2"], torch.tensor([1, 2]), lengths=torch.tensor([1, 1]))
        >>> kjt_is_equal(kjt, kjt.permute([1, 0])), kjt_is_equal(kjt, kjt.permute([0, 1]))
        (False, True)
    """
    if not isinstance(kjt_1, KeyedJaggedTensor) or not isinstance(kjt_2, KeyedJaggedTensor):
        return False
    return (kjt_1.keys() == kjt_2.keys() and kjt_1.stride() == kjt_2.stride()
            and kjt_1.stride_per_key() == kjt_2.stride_per_key()
            and _same(kjt_1.values(), kjt_2.values()) and _same(kjt_1.lengths(), kjt_2.lengths())
            and _same(kjt_1.weights_or_none(), kjt_2.weights_or_none()))


# ---- pytree: lets torch.compile / export / tree_map see the tensors inside -------------------------
def _register_pytrees() -> None:
    pytree.register_pytree_node(
        JaggedTensor,
        lambda jt: ([jt.values(), jt.weights_or_none(), jt.lengths()], None),
        lambda children, _: JaggedTensor(children[0], children[1], children[2]),
        serialized_type_name="shardwise.sparse.JaggedTensor")
    pytree.register_pytree_node(
        KeyedJaggedTensor,
        lambda k: ([k.values(), k.weights_or_none(), k.lengths()],
                   (tuple(k.keys()), k.stride(), tuple(map(tuple, k.stride_per_key_per_rank())) or None)),
        lambda c, ctx: KeyedJaggedTensor(list(ctx[0]), c[0], c[1], c[2], stride=ctx[1],
                                         stride_per_key_per_rank=None if ctx[2] is None else [list(r) for r in ctx[2]]),
        serialized_type_name="shardwise.sparse.KeyedJaggedTensor")
    pytree.register_pytree_node(
        KeyedTensor,
        lambda kt: ([kt.values()], (tuple(kt.keys()), tuple(kt.length_per_key()), kt.key_dim())),
        lambda c, ctx: KeyedTensor(list(ctx[0]), list(ctx[1]), c[0], ctx[2]),
        serialized_type_name="shardwise.sparse.KeyedTensor")


_register_pytrees()


def _kt_flatten_spec(kt: KeyedTensor, spec) -> list:
    # an exported program flattens its outputs by the spec it was traced with: take the keys in
    # that order, whatever order this KeyedTensor holds them in
    keys, lengths, key_dim = spec.context
    return [torch.cat([kt[k] for k in keys], dim=key_dim)]


register_pytree_flatten_spec(KeyedTensor, _kt_flatten_spec)


class ComputeKJTToJTDict(torch.nn.Module):
    """``forward(kjt) -> {key: JaggedTensor}`` (``kjt.to_dict()`` as a module, e.g. a leaf in a trace).

    Example:
        >>> kjt = KeyedJaggedTensor(["f1", "f2"], torch.tensor([1, 2]), lengths=torch.tensor([1, 1]))
        >>> d = ComputeKJTToJTDict()(kjt); list(d), d["f2"].values()
        (['f1', 'f2'], tensor([2]))
        >>> kjt_is_equal(ComputeJTDictToKJT()(d), kjt)       # and back
        True
    """

    def forward(self, keyed_jagged_tensor: KeyedJaggedTensor) -> dict:
        return keyed_jagged_tensor.to_dict()


class ComputeJTDictToKJT(torch.nn.Module):
    """``forward({key: JaggedTensor}) -> KeyedJaggedTensor`` (``from_jt_dict`` as a module).

    Example: see :class:`ComputeKJTToJTDict`'s.
    """

    def forward(self, jt_dict: dict) -> KeyedJaggedTensor:
        return KeyedJaggedTensor.from_jt_dict(jt_dict)
