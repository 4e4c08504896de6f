"""JaggedTensor / KeyedJaggedTensor / KeyedTensor against plain per-bag Python lists."""

import pytest
import torch

from shardwise.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor


def _kjt(weighted=True):
    # keys a, b; batch 3; bags a: [1,2] [] [3]; b: [4] [5,6,7] []
    values = torch.tensor([1, 2, 3, 4, 5, 6, 7])
    lengths = torch.tensor([2, 0, 1, 1, 3, 0])
    w = torch.arange(7, dtype=torch.float32) if weighted else None
    return KeyedJaggedTensor(["a", "b"], values, lengths=lengths, weights=w)


def test_accessors_and_to_dict():
    kjt = _kjt()
    assert kjt.stride() == 3
    assert kjt.length_per_key() == [3, 4]
    assert kjt.offsets().tolist() == [0, 2, 2, 3, 4, 7, 7]
    d = kjt.to_dict()
    assert [t.tolist() for t in d["a"].to_dense()] == [[1, 2], [], [3]]
    assert [t.tolist() for t in d["b"].to_dense()] == [[4], [5, 6, 7], []]
    assert d["b"].weights().tolist() == [3.0, 4.0, 5.0, 6.0]
    assert _kjt(weighted=False).weights_or_none() is None


def test_offsets_constructor_matches_lengths():
    a = _kjt()
    b = KeyedJaggedTensor.from_offsets(["a", "b"], a.values(), a.offsets(), weights=a.weights())
    assert torch.equal(b.lengths(), a.lengths())
    jt = JaggedTensor.from_offsets(torch.tensor([9, 8, 7]), torch.tensor([0, 0, 3]))
    assert jt.lengths().tolist() == [0, 3]


def test_permute_and_split():
    kjt = _kjt()
    p = kjt.permute([1, 0])
    assert p.keys() == ["b", "a"]
    assert p.values().tolist() == [4, 5, 6, 7, 1, 2, 3]
    assert p.lengths().tolist() == [1, 3, 0, 2, 0, 1]
    assert p.weights().tolist() == [3.0, 4.0, 5.0, 6.0, 0.0, 1.0, 2.0]
    sel = kjt.permute([1])
    assert sel.keys() == ["b"] and sel.values().tolist() == [4, 5, 6, 7]
    first, second = kjt.split([1, 1])
    assert first.keys() == ["a"] and first.values().tolist() == [1, 2, 3]
    assert second.lengths().tolist() == [1, 3, 0] and second.weights().tolist() == [3.0, 4.0, 5.0, 6.0]
    empty, whole = kjt.split([0, 2])
    assert empty.keys() == [] and empty.stride() == 3 and whole.keys() == ["a", "b"]


def test_from_jt_dict_round_trip():
    kjt = _kjt()
    back = KeyedJaggedTensor.from_jt_dict(kjt.to_dict())
    assert torch.equal(back.values(), kjt.values()) and torch.equal(back.lengths(), kjt.lengths())


@pytest.mark.parametrize("kwargs, match", [
    (dict(values=torch.tensor([1, 2]), lengths=torch.tensor([1, 0, 0, 0])), "lengths sum to 1 but there are 2"),
    (dict(values=torch.tensor([1, 2]), lengths=torch.tensor([3, -1, 0, 0])), "lengths must be >= 0"),
    (dict(values=torch.tensor([1, 2]), lengths=torch.tensor([1, 1, 0])), "cannot be split evenly over 2 keys"),
    (dict(values=torch.tensor([1, 2]), lengths=torch.tensor([1, 1, 0, 0]), weights=torch.ones(3)),
     "weights must have one entry per value"),
    (dict(values=torch.tensor([1, 2]), lengths=torch.tensor([1.0, 1.0, 0.0, 0.0])), "integer dtype"),
])
def test_validation_errors(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        KeyedJaggedTensor(["a", "b"], **kwargs)


def test_key_errors():
    with pytest.raises(ValueError, match="unique"):
        KeyedJaggedTensor(["a", "a"], torch.tensor([1]), lengths=torch.tensor([1, 0]))
    # no keys: batch size 0, as TorchRec's (KeyedJaggedTensor([], torch.Tensor()) is its empty KJT)
    empty = KeyedJaggedTensor([], torch.zeros(0, dtype=torch.int64), lengths=torch.zeros(0, dtype=torch.int64))
    assert empty.stride() == 0 and empty.to_dict() == {}
    assert KeyedJaggedTensor([], torch.Tensor()).stride() == 0
    with pytest.raises(KeyError, match="not in this KeyedJaggedTensor"):
        _kjt()["zzz"]
    with pytest.raises(ValueError, match="out of range"):
        _kjt().permute([2])
    with pytest.raises(ValueError, match="summing to the number of keys"):
        _kjt().split([1])


def test_keyed_tensor():
    values = torch.arange(10.0).view(2, 5)
    kt = KeyedTensor(["x", "y"], [2, 3], values)
    assert kt.keys() == ["x", "y"] and kt.values() is values
    d = kt.to_dict()
    assert torch.equal(d["y"], values[:, 2:]) and torch.equal(kt["x"], values[:, :2])
    with pytest.raises(ValueError, match="sum to values.shape"):
        KeyedTensor(["x"], [4], values)
    with pytest.raises(ValueError, match="2 keys but 1 lengths"):
        KeyedTensor(["x", "y"], [5], values)


def _same_kjt(a: KeyedJaggedTensor, b: KeyedJaggedTensor) -> None:
    """Every attribute equal (tensors by value and dtype), so no accessor can tell the two apart."""
    va, vb = vars(a), vars(b)
    assert va.keys() == vb.keys()
    for k in va:
        x, y = va[k], vb[k]
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and torch.equal(x, y), k
        else:
            assert x == y, k


@pytest.mark.parametrize("lengths", [[1, 0, 2, 1, 1, 0], [0, 0, 0, 0, 0, 0], []])
def test_consistent_parts_build_what_the_checked_constructor_builds(lengths):
    keys = ["a", "b", "c"] if lengths else ["a"]
    n = torch.tensor(lengths, dtype=torch.int64)
    values = torch.arange(int(n.sum()), dtype=torch.int64) * 7
    want = KeyedJaggedTensor(keys, values, lengths=n).sync()
    per_key = want.length_per_key()
    got = KeyedJaggedTensor._from_consistent_parts(list(keys), values, n, torch.cat([torch.zeros(1, dtype=torch.int64),
                                                   n.cumsum(0)]), per_key, want.offset_per_key())
    _same_kjt(got, want)
    assert got.stride() == want.stride() and got.offsets().tolist() == want.offsets().tolist()
    assert [got[k].values().tolist() for k in keys] == [want[k].values().tolist() for k in keys]
