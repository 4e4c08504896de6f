"""The TorchRec-compatible additions: validation of the new arguments, printing, pytree, equality."""

import pytest
import torch
import torch.utils._pytree as pytree

from shardwise.sparse import (
    ComputeJTDictToKJT, ComputeKJTToJTDict, JaggedTensor, KeyedJaggedTensor, KeyedTensor, jt_is_equal,
    kjt_is_equal,
)

V = torch.tensor([1, 2, 3, 4, 5, 6])


def _vbe():
    # a: 1 bag [1, 2]; b: 3 bags [3] [] [4, 5, 6]
    return KeyedJaggedTensor(["a", "b"], V, None, torch.tensor([2, 1, 0, 3]), stride_per_key_per_rank=[[1], [3]])


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(stride_per_key_per_rank=[[1], [2]]), ValueError, "3 in all\\) but there are 4 lengths"),
    (dict(stride_per_key_per_rank=[[1, 1, 2]]), ValueError, "one row of int batch sizes per key \\(2 rows\\)"),
    (dict(stride_per_key_per_rank=[[1], [-1]]), ValueError, "must be >= 0"),
    (dict(stride_per_key_per_rank="ab"), TypeError, "list of lists of ints"),
    (dict(stride_per_key_per_rank=[[1], [3]], stride_per_key=[2, 2]), ValueError, "differs from the row sums"),
    (dict(stride_per_key=[3, 3]), ValueError, "does not match batch size 2"),
    (dict(length_per_key=[4, 2]), ValueError, "length_per_key=\\[4, 2\\] but the lengths give \\[3, 3\\]"),
    (dict(offset_per_key=[0, 2, 6]), ValueError, "offset_per_key=\\[0, 2, 6\\] but the lengths give \\[0, 3, 6\\]"),
    (dict(lengths_offset_per_key=[0, 1, 4]), ValueError, "lengths_offset_per_key"),
    (dict(index_per_key={"b": 0, "a": 1}), ValueError, "index_per_key"),
    (dict(jt_dict={"x": None}), ValueError, "jt_dict keys"),
    (dict(inverse_indices=("a", torch.zeros(2, 2))), TypeError, "inverse_indices must be"),
    (dict(inverse_indices=(["a"], torch.zeros(2, 2, dtype=torch.long))), ValueError, "len\\(keys\\)=1"),
    (dict(inverse_indices=(["a"], torch.zeros(1, 2, dtype=torch.long, device="meta"))), ValueError,
     "inverse_indices are on meta"),
    (dict(inverse_indices=(["a"], torch.tensor([[0, 2]]))), ValueError,
     "inverse_indices of 'a' range over \\[0, 2\\] but the key has 2 bags"),
    (dict(inverse_indices=(["z"], torch.tensor([[0, 1]]))), ValueError, "name key 'z', which is not in keys"),
])
def test_new_kjt_arguments_are_validated(kwargs, exc, match):
    lengths = torch.tensor([2, 1, 0, 3])   # 2 keys x batch 2 unless the kwargs say otherwise
    with pytest.raises(exc, match=match):
        KeyedJaggedTensor(["a", "b"], V, None, lengths, **kwargs)


def test_vbe_accessors_and_empty_rows():
    kjt = _vbe()
    assert kjt.stride() == 3 and kjt.stride_per_key() == [1, 3] and kjt.length_per_key() == [2, 4]
    assert [t.tolist() for t in kjt["b"].to_dense()] == [[3], [], [4, 5, 6]]
    assert KeyedJaggedTensor(["a"], V[:0], None, torch.tensor([], dtype=torch.long),
                             stride_per_key_per_rank=[[]]).stride() == 0
    uneven = KeyedJaggedTensor(["a", "b"], V, None, torch.tensor([2, 1, 0, 3]), stride_per_key=[1, 3])
    assert uneven.variable_stride_per_key() and uneven.stride_per_key_per_rank() == [[1], [3]]
    consistent = KeyedJaggedTensor(["a", "b"], V, None, torch.tensor([2, 1, 0, 3]), length_per_key=[3, 3],
                                   offset_per_key=[0, 3, 6], lengths_offset_per_key=[0, 2, 4],
                                   index_per_key={"a": 0, "b": 1})
    assert consistent.length_per_key_or_none() == [3, 3]
    assert KeyedJaggedTensor.empty_like(kjt).stride() == 3
    copy = KeyedJaggedTensor.empty_like(kjt, torch.device("cpu"))
    assert copy.stride_per_key() == [1, 3] and torch.equal(copy.lengths(), kjt.lengths())


def test_concat_errors():
    a = KeyedJaggedTensor(["a"], V[:2], None, torch.tensor([2]))
    with pytest.raises(ValueError, match="non-empty list"):
        KeyedJaggedTensor.concat([])
    with pytest.raises(ValueError, match="weighted and unweighted"):
        KeyedJaggedTensor.concat([a, KeyedJaggedTensor(["b"], V[:1], torch.ones(1), torch.tensor([1]))])
    with pytest.raises(ValueError, match="batch sizes differ \\[1, 2\\]"):
        KeyedJaggedTensor.concat([a, KeyedJaggedTensor(["b"], V[:1], None, torch.tensor([1, 0]))])
    with pytest.raises(ValueError, match="VBE\\) and fixed-batch"):
        KeyedJaggedTensor.concat([a, _vbe()])
    with pytest.raises(ValueError, match="keys must be unique"):
        KeyedJaggedTensor.concat([a, a])


def test_jagged_and_keyed_tensor_errors():
    with pytest.raises(ValueError, match="one entry per row of values"):
        JaggedTensor.from_dense_lengths(torch.zeros(2, 3), torch.tensor([1, 4]))
    with pytest.raises(ValueError, match="non-empty list of tensors"):
        JaggedTensor.from_dense([])
    with pytest.raises(ValueError, match="2 weight tensors for 1 bags"):
        JaggedTensor.from_dense([torch.ones(2)], [torch.ones(2), torch.ones(1)])
    kt = KeyedTensor(["x", "y"], [1, 2], torch.zeros(2, 3))
    with pytest.raises(KeyError, match="\\['z'\\] are in none"):
        KeyedTensor.regroup([kt], [["x", "z"]])
    with pytest.raises(ValueError, match="key 'x' is in KeyedTensors 0 and 1"):
        KeyedTensor.regroup([kt, kt], [["x"]])
    with pytest.raises(ValueError, match="key_dim=2 is not a dim"):
        KeyedTensor(["x"], [3], torch.zeros(2, 3), key_dim=2)
    with pytest.raises(ValueError, match="2 groups but 1 names"):
        KeyedTensor.regroup_as_dict([kt], [["x"], ["y"]], ["g"])


def test_str_matches_torchrec_format():
    kjt = KeyedJaggedTensor(["a", "b"], V, None, torch.tensor([2, 1, 0, 3]))
    assert str(kjt) == 'KeyedJaggedTensor({\n    "a": [[1, 2], [3]],\n    "b": [[], [4, 5, 6]]\n})\n'
    w = KeyedJaggedTensor(["a"], V[:2], torch.tensor([0.5, 1.0]), torch.tensor([2]))
    assert str(w) == ('KeyedJaggedTensor({\n    "a": {\n        "values": [[1, 2]],\n'
                      '        "weights": [[0.5, 1.0]]\n    }\n})\n')
    assert str(KeyedJaggedTensor.empty()) == "KeyedJaggedTensor()\n"
    assert str(JaggedTensor(V[:3], None, torch.tensor([1, 2]))) == "JaggedTensor({\n    [[1], [2, 3]]\n})\n"


def test_pytree_round_trip_and_equality():
    for obj in (_vbe(), KeyedJaggedTensor(["a"], V[:2], torch.ones(2), torch.tensor([1, 1]))):
        leaves, spec = pytree.tree_flatten(obj)
        back = pytree.tree_unflatten(leaves, spec)
        assert kjt_is_equal(back, obj) and back.stride_per_key() == obj.stride_per_key()
    doubled = pytree.tree_map(lambda t: t * 2 if t.dtype.is_floating_point else t,
                              JaggedTensor(V[:2], torch.ones(2), torch.tensor([2])))
    assert doubled.weights().tolist() == [2.0, 2.0]
    leaves, spec = pytree.tree_flatten(KeyedTensor(["x"], [2], torch.ones(1, 2)))
    kt = pytree.tree_unflatten(leaves, spec)
    assert kt.keys() == ["x"] and kt.length_per_key() == [2]
    kjt = _vbe()
    assert not kjt_is_equal(kjt, kjt.permute([1, 0])) and not kjt_is_equal(kjt, "kjt")
    assert jt_is_equal(kjt["a"], JaggedTensor(V[:2], None, torch.tensor([2])))
    assert not jt_is_equal(kjt["a"], JaggedTensor(V[:2], torch.ones(2), torch.tensor([2])))


def test_kjt_dict_modules_round_trip():
    kjt = KeyedJaggedTensor(["a", "b"], V, torch.rand(6), torch.tensor([2, 1, 0, 3]))
    d = ComputeKJTToJTDict()(kjt)
    assert list(d) == ["a", "b"] and kjt_is_equal(ComputeJTDictToKJT()(d), kjt)


def test_keyed_tensor_str_flatten_spec_and_traced_regroup_as_dict():
    from torch.fx._pytree import tree_flatten_spec

    a, b = torch.arange(4.0).view(2, 2), torch.arange(2.0).view(2, 1)
    kt = KeyedTensor.from_tensor_list(["a", "b"], [a, b])
    assert str(kt) == 'KeyedTensor({\n    "a": [[0.0, 1.0], [2.0, 3.0]],\n    "b": [[0.0], [1.0]]\n})\n'
    assert str(KeyedTensor([], [], torch.Tensor())) == "KeyedTensor()\n"
    _, spec = pytree.tree_flatten(kt)
    swapped = KeyedTensor.from_tensor_list(["b", "a"], [b, a])   # same keys, other order
    assert torch.equal(tree_flatten_spec(swapped, spec)[0], kt.values())

    class M(torch.nn.Module):
        def forward(self, kts):
            return KeyedTensor.regroup_as_dict(kts, [["b"], ["a", "b"]], ["g0", "g1"])

    out = torch.fx.symbolic_trace(M())([kt])
    assert list(out) == ["g0", "g1"] and torch.equal(out["g1"], torch.cat([a, b], dim=1))


def test_pickle_round_trip_keeps_vbe_and_weights():
    # DataLoader workers and the test harness send batches between processes by pickling them
    import pickle

    kjt = KeyedJaggedTensor(["a", "b"], V, torch.rand(6), torch.tensor([2, 1, 0, 3]),
                            stride_per_key_per_rank=[[1], [3]],
                            inverse_indices=(["a", "b"], torch.tensor([[0, 0, 0], [2, 1, 0]])))
    back = pickle.loads(pickle.dumps(kjt))
    assert kjt_is_equal(back, kjt) and back.stride_per_key_per_rank() == [[1], [3]]
    assert torch.equal(back.inverse_indices()[1], kjt.inverse_indices()[1])


def test_sparse_tracer_keeps_named_modules_as_leaves():
    from shardwise.sparse import SparseTracer

    class Lookup(torch.nn.Module):
        def forward(self, kjt):
            return torch.stack([kjt[k].lengths().sum() for k in kjt.keys()])   # loops over keys: untraceable

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lookup = Lookup()

        def forward(self, kjt):
            return self.lookup(kjt) * 2

    graph = SparseTracer(leaf_modules=["Lookup"]).trace(M())
    gm = torch.fx.GraphModule(M(), graph)
    kjt = KeyedJaggedTensor(["a", "b"], V, None, torch.tensor([2, 1, 0, 3]))
    assert torch.equal(gm(kjt), torch.tensor([6, 6]))
    with pytest.raises(torch.fx.proxy.TraceError):
        torch.fx.symbolic_trace(M())
