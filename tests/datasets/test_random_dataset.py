"""RandomRecDataset (TorchRec's own test cases, rewritten) and Batch."""

import itertools

import pytest
import torch

from shardwise.datasets import DEFAULT_CAT_NAMES, DEFAULT_INT_NAMES, Batch, RandomRecDataset


def test_bag_lengths_follow_ids_per_features_and_min():
    ds = RandomRecDataset(["feat1", "feat2"], batch_size=16, hash_sizes=[100, 200], ids_per_features=[100, 200],
                          min_ids_per_features=[100, 200], num_dense=5)
    b = next(iter(ds))
    assert b.dense_features.shape == (16, 5) and b.labels.shape == (16,) and b.sparse_features.stride() == 16
    assert b.sparse_features["feat1"].lengths().tolist() == [100] * 16
    assert b.sparse_features["feat2"].lengths().tolist() == [200] * 16
    assert int(b.sparse_features["feat2"].values().max()) < 200 and set(b.labels.tolist()) <= {0, 1}


def test_ranges_without_a_minimum():
    b = next(iter(RandomRecDataset(["a"], batch_size=500, ids_per_features=[3], hash_size=7, manual_seed=0)))
    assert set(b.sparse_features.lengths().tolist()) == {0, 1, 2, 3}      # 0 .. ids (inclusive)
    assert set(b.sparse_features.values().tolist()) == set(range(7))


def test_len_chain_and_generation_on_the_fly():
    ds = RandomRecDataset(["a", "b"], batch_size=4, hash_size=100, ids_per_feature=5, num_dense=5,
                          num_generated_batches=-1, num_batches=5)
    assert len(ds) == 5
    it = itertools.chain(iter(ds), iter(ds))
    drawn = [next(it) for _ in range(10)]
    with pytest.raises(StopIteration):
        next(it)
    assert not torch.equal(drawn[0].dense_features, drawn[1].dense_features)


def test_cached_batches_cycle_and_seed_reproduces():
    def make(seed):
        return RandomRecDataset(["a"], batch_size=3, num_dense=2, manual_seed=seed, num_generated_batches=2,
                                num_batches=4)
    a, b, c = list(make(5)), list(make(5)), list(make(6))
    assert all(torch.equal(x.dense_features, y.dense_features) for x, y in zip(a, b))
    assert a[2] is a[0] and not torch.equal(a[0].dense_features, a[1].dense_features)
    assert not torch.equal(a[0].dense_features, c[0].dense_features)
    with pytest.raises(TypeError, match="num_batches"):
        len(RandomRecDataset(["a"], batch_size=3))


@pytest.mark.parametrize("kwargs, match", [
    ({"keys": []}, "keys"), ({"batch_size": 0}, "batch_size=0"), ({"hash_sizes": [5, 5]}, "2 entries for 1 keys"),
    ({"ids_per_feature": 2, "min_ids_per_feature": 3}, "minimum"), ({"hash_size": 0}, "entry 0"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RandomRecDataset(**{"keys": ["a"], "batch_size": 2, **kwargs})


def test_batch_moves_and_criteo_names():
    b = next(iter(RandomRecDataset(DEFAULT_CAT_NAMES[:2], batch_size=2, num_dense=len(DEFAULT_INT_NAMES))))
    moved = b.to(torch.device("meta"))
    assert isinstance(moved, Batch) and moved.dense_features.is_meta and moved.sparse_features.values().is_meta
    b.record_stream(None)        # host tensors: nothing to mark
    assert (DEFAULT_CAT_NAMES[0], DEFAULT_INT_NAMES[12]) == ("cat_0", "int_12")
