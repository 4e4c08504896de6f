"""TorchRec-shaped awaitables and the staged methods of the sharded collections."""

import pytest
import torch

from shardwise.embedding.awaitable import Awaitable, LazyAwaitable, LazyNoWait, NoWait
from shardwise.testing import run_on_ranks

from .. import common
from ..workers import mesh_for


class _Ones(LazyAwaitable):   # the introduction tutorial's ExampleAwaitable
    def __init__(self, size):
        super().__init__()
        self._size = size
        self.waits = 0

    def _wait_impl(self):
        self.waits += 1
        return torch.ones(self._size)


class _Forgot(LazyAwaitable):
    def __init__(self):   # no super().__init__()
        pass

    def _wait_impl(self):
        return 1


def test_lazy_awaitable_waits_once_where_needed():
    a = _Ones([3, 2])
    assert a.wait().shape == (3, 2)
    b = _Ones([2])
    assert torch.equal(torch.add(b, 1), torch.full((2,), 2.0)) and b.shape == (2,) and (b * 3).sum().item() == 6.0
    assert b.waits == 1                                       # one wait, the value kept
    assert (2 - _Ones([2])).tolist() == [1.0, 1.0]             # reflected operators
    with pytest.raises(RuntimeError, match="super"):
        _Forgot().shape
    n = NoWait(5)
    n.callbacks.append(lambda x: x * 2)
    assert n.wait() == 10 and isinstance(n, Awaitable)
    assert LazyNoWait(torch.zeros(2)).sum().item() == 0.0


def staged_matches_forward(rank, world):
    from shardwise.embedding import shard

    ebc = common.make_ebc(seed=6)
    sharded = shard(ebc, common.plans(world)["mixed"], mesh=mesh_for(world, 1), optimizer=common.SGD)
    kjt = common.rank_batches(world, 0, False)[rank]
    ctx = sharded.create_context()
    outer = sharded.input_dist(ctx, kjt)
    inner = outer.wait()
    out = sharded.compute_and_output_dist(ctx, inner.wait())
    assert isinstance(out, LazyAwaitable)
    err = (out.wait().values() - ebc(kjt).values()).abs().max().item()
    common.loss_fn(out.wait(), torch.zeros_like(out.values())).backward()   # trains like forward's output
    moved = (sharded.state_dict()["embedding_bags.t_a.weight"].full_tensor()
             - ebc.embedding_bags["t_a"].weight).abs().max().item()
    stages = (len(sharded._input_dists), len(sharded._lookups), len(sharded._output_dists), len(sharded._groups))
    waited = sharded(kjt).wait() is not None
    try:
        torch.jit.script(sharded)
        scripted = "scripted"
    except TypeError as exc:
        scripted = str(exc)
    from shardwise.embedding.inference import Tracer
    try:
        Tracer().trace(torch.nn.Sequential(sharded))
        traced = "traced"
    except TypeError as exc:
        traced = str(exc)
    return err, moved, stages, waited, scripted + traced


def test_staged_awaitables_on_two_ranks():
    for err, moved, stages, waited, scripted in run_on_ranks(staged_matches_forward, 2):
        assert err < 1e-6 and moved > 1e-3
        assert stages[0] == stages[1] == stages[2] == stages[3] == 4
        assert waited
        assert "TorchScript cannot script a sharded collection" in scripted, scripted
        assert "a sharded collection cannot be traced for TorchScript" in scripted, scripted


def bag_configs_worker(rank, world):
    from shardwise.embedding import EmbeddingCollection, EmbeddingConfig, reshard, row_wise, shard, table_wise

    ebc = common.make_ebc(seed=6, device="meta")
    sharded = shard(ebc, common.plans(world)["mixed"], mesh=mesh_for(world, 1), optimizer=common.SGD)
    got = [sharded.embedding_bag_configs() == ebc.embedding_bag_configs()]
    got.append(list(sharded.named_parameters()) == [])     # documented: unlike TorchRec's, see docs/embedding.md
    reshard(sharded, {c.name: table_wise(0) for c in ebc.embedding_bag_configs()})
    got.append(sharded.embedding_bag_configs() == ebc.embedding_bag_configs())
    ec = EmbeddingCollection([EmbeddingConfig(10, 4, "s", feature_names=["f"])])
    try:
        shard(ec, {"s": row_wise()}, mesh=mesh_for(world, 1)).embedding_bag_configs()
    except AttributeError as exc:
        return got, str(exc)
    return got, None


def test_embedding_bag_configs_of_a_sharded_collection_are_the_unsharded_ones():
    for same, refusal in run_on_ranks(bag_configs_worker, 2):
        assert same == [True, True, True]      # under a mixed plan and after a reshard, in the unsharded order
        assert refusal and "ShardedEmbeddingCollection has no embedding_bag_configs()" in refusal
        assert "use embedding_configs()" in refusal
