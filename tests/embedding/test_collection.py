"""The unsharded EmbeddingBagCollection against per-bag Python loops, and input validation."""

import functools

import pytest
import torch
import torch.nn.functional as F

from shardwise.embedding import (
    EmbeddingBagCollection, EmbeddingBagConfig, RowWiseAdagrad, column_wise, row_wise, table_wise,
)
from shardwise.embedding.optim import resolve_optimizer
from shardwise.sparse import KeyedJaggedTensor

from . import common


@pytest.mark.parametrize("weighted", [False, True])
def test_forward_matches_per_bag_loop(weighted):
    ebc = common.make_ebc(seed=0, weighted=weighted)
    kjt = common.make_batch(seed=3, batch=4, weighted=weighted, drop=("fc2",))
    out = ebc(kjt)
    assert out.keys() == common.all_features()
    cfg = {f: (n, p) for n, _, _, fs, p in common.TABLES for f in fs}
    present = kjt.to_dict()
    for f, block in out.to_dict().items():
        table, pooling = cfg[f]
        weight = ebc.embedding_bags[table].weight.detach()
        for b in range(kjt.stride()):
            if f not in present:
                want = torch.zeros(weight.shape[1])
            else:
                jt = present[f]
                lo, hi = jt.offsets()[b].item(), jt.offsets()[b + 1].item()
                want = torch.zeros(weight.shape[1])
                for i in range(lo, hi):
                    w = jt.weights()[i].item() if weighted else 1.0
                    want += w * weight[jt.values()[i]]
                if pooling == "mean" and hi > lo:
                    want /= hi - lo
            torch.testing.assert_close(block[b].detach(), want, rtol=1e-5, atol=1e-6)


def test_unweighted_mean_equals_torch_mean_mode():
    ebc = common.make_ebc(seed=0)
    kjt = common.make_batch(seed=5, batch=6, weighted=False)
    jt = kjt["fb"]
    want = torch.nn.functional.embedding_bag(jt.values(), ebc.embedding_bags["t_b"].weight, jt.offsets(),
                                             mode="mean", include_last_offset=True)
    torch.testing.assert_close(ebc(kjt)["fb"], want)


def test_collection_errors():
    ebc = common.make_ebc(seed=0, weighted=True)
    with pytest.raises(ValueError, match=r"features \['nope'\] are not looked up"):
        ebc(KeyedJaggedTensor(["nope"], torch.tensor([1]), lengths=torch.tensor([1]), weights=torch.ones(1)))
    with pytest.raises(ValueError, match="has no weights"):
        ebc(KeyedJaggedTensor(["fa1"], torch.tensor([1]), lengths=torch.tensor([1])))
    a = EmbeddingBagConfig(name="a", num_embeddings=4, embedding_dim=2, feature_names=["f"])
    with pytest.raises(ValueError, match="feature 'f' is used by tables 'a' and 'b'"):
        EmbeddingBagCollection([a, EmbeddingBagConfig(name="b", num_embeddings=4, embedding_dim=2, feature_names=["f"])])
    with pytest.raises(ValueError, match="pooling='max' is not supported"):
        EmbeddingBagConfig(name="c", num_embeddings=4, embedding_dim=2, feature_names=["g"], pooling="max")
    with pytest.raises(ValueError, match="num_embeddings=0 must be a positive int"):
        EmbeddingBagConfig(name="c", num_embeddings=0, embedding_dim=2, feature_names=["g"])


def test_plan_helper_errors():
    with pytest.raises(ValueError, match="must be a non-negative int"):
        table_wise(-1)
    with pytest.raises(ValueError, match="repeat a rank"):
        column_wise([0, 0])
    with pytest.raises(ValueError, match="needs at least one rank"):
        row_wise([])


def test_optimizer_resolution():
    rule, hp = resolve_optimizer(functools.partial(torch.optim.Adagrad, lr=0.3))
    assert rule.name == "Adagrad" and hp["lr"] == 0.3 and hp["eps"] == 1e-10
    assert resolve_optimizer(RowWiseAdagrad)[0].name == "RowWiseAdagrad"
    with pytest.raises(ValueError, match="RMSprop cannot be fused.*supported: SGD, Adagrad, Adam"):
        resolve_optimizer(functools.partial(torch.optim.RMSprop, lr=0.1))
    with pytest.raises(ValueError, match=r"SGD\(momentum=0.9\) is not supported fused.*use momentum=0"):
        resolve_optimizer(functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9))
    with pytest.raises(TypeError, match="must be a torch optimizer class"):
        resolve_optimizer("adagrad")


def test_row_wise_adagrad_dense_rule():
    # one accumulator per row: mean of the squared row gradient
    p = torch.nn.Parameter(torch.ones(3, 2))
    opt = RowWiseAdagrad([p], lr=0.5)
    p.grad = torch.tensor([[3.0, 4.0], [0.0, 0.0], [1.0, 1.0]])
    opt.step()
    acc = torch.tensor([12.5, 0.0, 1.0])
    torch.testing.assert_close(opt.state[p]["sum"], acc)
    torch.testing.assert_close(p.detach()[0], 1 - 0.5 * torch.tensor([3.0, 4.0]) / (acc[0].sqrt() + 1e-10))
    torch.testing.assert_close(p.detach()[1], torch.ones(2))


def test_state_dict_layout_detection():
    # which box layouts are exactly a DTensor placement (Replicate / Shard(0) / Shard(1)) on 1-D meshes
    from shardwise.embedding.plan import ShardBox
    from shardwise.embedding.state_dict import _placement

    def rows(blocks):
        return [ShardBox("t", r, o, n, 0, 4) for r, (o, n) in enumerate(blocks)]

    assert _placement(rows([(0, 2), (2, 1), (3, 0)]), (3, 4), 3, False) is None      # not chunk sizes
    assert _placement(rows([(0, 1), (1, 1), (2, 1), (3, 0)]), (3, 4), 4, False) == "shard0"
    assert _placement(rows([(0, 2), (2, 1)]), (3, 4), 2, False) == "shard0"
    assert _placement(rows([(0, 2), (2, 1)])[::-1], (3, 4), 2, False) == "shard0"    # order-free
    swapped = [ShardBox("t", 1, 0, 2, 0, 4), ShardBox("t", 0, 2, 1, 0, 4)]
    assert _placement(swapped, (3, 4), 2, False) is None                              # rank 1 holds block 0
    cols = [ShardBox("t", 0, 0, 3, 0, 2), ShardBox("t", 1, 0, 3, 2, 2)]
    assert _placement(cols, (3, 4), 2, False) == "shard1"
    assert _placement([ShardBox("t", 0, 0, 3, 0, 4)], (3, 4), 2, False) is None       # table-wise
    assert _placement([ShardBox("t", r, 0, 3, 0, 4) for r in range(2)], (3, 4), 2, True) == "replicate"


ODD_NAMES = ["items", "keys", "values", "type", "update", "training"]


def _odd_ebc():
    from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig

    torch.manual_seed(5)
    return EmbeddingBagCollection([EmbeddingBagConfig(name=n, num_embeddings=7 + i, embedding_dim=4, feature_names=[f"f_{n}"]) for i, n in enumerate(ODD_NAMES)])


def _odd_batch(seed):
    g = torch.Generator().manual_seed(seed)
    keys = [f"f_{n}" for n in ODD_NAMES]
    lengths = torch.randint(0, 3, (len(keys) * 2,), generator=g)
    values = torch.cat([torch.randint(0, 7, (int(n),), generator=g) for n in lengths])
    return KeyedJaggedTensor(keys, values, lengths=lengths)


def test_table_names_that_are_module_attributes():
    ebc = _odd_ebc()
    assert [k.split(".")[1] for k in ebc.state_dict()] == ODD_NAMES
    assert all(k == f"embedding_bags.{n}.weight" for k, n in zip(ebc.state_dict(), ODD_NAMES))
    kjt = _odd_batch(0)
    want = torch.cat([F.embedding_bag(kjt[f"f_{n}"].values(), ebc.embedding_bags[n].weight,
                                      kjt[f"f_{n}"].offsets(), mode="sum", include_last_offset=True)
                      for n in ODD_NAMES], dim=1)
    assert torch.allclose(ebc(kjt).values(), want)
    other = _odd_ebc()
    with torch.no_grad():
        for n in ODD_NAMES:
            other.embedding_bags[n].weight.zero_()
    other.load_state_dict(ebc.state_dict())
    assert all(torch.equal(other.embedding_bags[n].weight, ebc.embedding_bags[n].weight) for n in ODD_NAMES)
    assert ebc.embedding_bags.training is True and callable(ebc.embedding_bags.items)


def odd_names_sharded(rank, world):
    from shardwise.embedding import column_wise, data_parallel, row_wise, shard, table_wise

    ebc = _odd_ebc()
    plan = {"items": table_wise(0), "keys": row_wise(), "values": column_wise([0, 1]), "type": data_parallel(),
            "update": table_wise(1), "training": row_wise()}
    sharded = shard(ebc, plan)
    kjt = _odd_batch(10 + rank)
    err = (sharded(kjt).values() - ebc(kjt).values()).abs().max().item()
    full = {k: v.full_tensor() for k, v in sharded.state_dict().items()}
    same = all(torch.equal(full[k], v) for k, v in ebc.state_dict().items())
    return err, same, sorted(full) == sorted(ebc.state_dict())


def test_table_names_that_are_module_attributes_shard():
    from shardwise.testing import run_on_ranks

    for err, same, keys in run_on_ranks(odd_names_sharded, 2, timeout=120.0):
        assert err < 1e-6 and same and keys


def test_config_takes_torchrecs_field_order_and_data_type():
    from shardwise.embedding import DataType

    c = EmbeddingBagConfig(100, 8, "t", DataType.FP16, ["f"], 0.5, 0.25)
    assert (c.num_embeddings, c.embedding_dim, c.name, c.feature_names) == (100, 8, "t", ("f",))
    assert c.data_type is DataType.FP16 and (c.weight_init_max, c.weight_init_min) == (0.5, 0.25)
    assert EmbeddingBagConfig(10, 4, "u", "bf16", ["g"]).data_type is DataType.BF16
    ebc = EmbeddingBagCollection([c, EmbeddingBagConfig(10, 4, "u", feature_names=["g"])])
    assert ebc.embedding_bags["t"].weight.dtype == torch.float16
    assert ebc.embedding_bags["u"].weight.dtype == torch.float32
    w = ebc.embedding_bags["t"].weight
    assert w.min() >= 0.25 and w.max() <= 0.5
    with pytest.raises(ValueError, match="data_type='int8' is not supported"):
        EmbeddingBagConfig(10, 4, "t", "int8", ["f"])
    with pytest.raises(ValueError, match="need_pos"):
        EmbeddingBagConfig(10, 4, "t", feature_names=["f"], need_pos=True)


def vbe_refused(rank, world):
    from shardwise.embedding import shard

    sharded = shard(common.make_ebc(seed=1), {n: table_wise(0) for n, *_ in common.TABLES})
    feats = common.all_features()
    kjt = KeyedJaggedTensor(feats, torch.zeros(len(feats), dtype=torch.int64), lengths=torch.ones(len(feats),
                            dtype=torch.int64), stride_per_key_per_rank=[[1]] * len(feats))
    vbe = kjt.variable_stride_per_key()
    try:
        sharded(kjt if rank == 1 else common.rank_batches(world, 0, False)[rank])
    except ValueError as exc:
        return vbe, str(exc)
    return vbe, None


def test_a_vbe_batch_is_refused_on_every_rank():
    from shardwise.testing import run_on_ranks

    for vbe, err in run_on_ranks(vbe_refused, 2, timeout=60.0):
        assert err is not None and "rank(s) [1]" in err and "VBE" in err
