"""StackedTables (the engine of FusedEmbeddingBagCollection): tables stacked per (dtype, width), one
lookup and one fused update per buffer; checked against plain nn.EmbeddingBag + torch.optim.SGD on the
unsharded tables, with duplicate ids, empty bags, several widths, features absent or out of order."""

import functools

import pytest
import torch
from torch import nn

from shardwise.embedding import EmbeddingBagConfig
from shardwise.embedding.collection import stacked
from shardwise.embedding.collection.stacked import StackedTables
from shardwise.embedding.optim.rules import resolve_optimizer
from shardwise.sparse import KeyedJaggedTensor

# widths 4, 8, 4, 3 (two tables share width 4: one buffer for them), one table with two features
TABLES = [EmbeddingBagConfig(9, 4, "a", feature_names=["fa"]),
          EmbeddingBagConfig(5, 8, "b", feature_names=["fb", "fb2"]),
          EmbeddingBagConfig(6, 4, "c", feature_names=["fc"], pooling="mean"),
          EmbeddingBagConfig(3, 3, "d", feature_names=["fd"])]
ROWS = {"fa": 9, "fb": 5, "fb2": 5, "fc": 6, "fd": 3}
TABLE_OF = {"fa": "a", "fb": "b", "fb2": "b", "fc": "c", "fd": "d"}


def _kjt(keys, step, batch=4, dup=True):
    g = torch.Generator().manual_seed(step)
    lengths = torch.randint(0, 4, (len(keys) * batch,), generator=g)
    lengths[0], lengths[1] = 2, 0                                        # bag 0: two ids; bag 1: empty
    values = [torch.randint(0, ROWS[k], (int(n),), generator=g) for k in keys for n in lengths[keys.index(k) * batch:(keys.index(k) + 1) * batch]]
    values = torch.cat(values)
    if dup:
        values[1] = values[0]                                            # a duplicate id in one bag
    return KeyedJaggedTensor(keys, values, lengths=lengths, stride=batch)


def _reference():
    bags = {t.name: nn.EmbeddingBag(t.num_embeddings, t.embedding_dim, mode=t.pooling) for t in TABLES}
    return bags


def _ref_forward(bags, kjt, features):
    out = []
    batch = kjt.stride()
    for f in features:
        t = TABLE_OF[f]
        if f not in kjt.keys():
            out.append(torch.zeros(batch, bags[t].embedding_dim))
            continue
        jt = kjt[f]
        out.append(bags[t](jt.values(), jt.offsets()[:-1]))
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("keys", [["fa", "fb", "fb2", "fc", "fd"], ["fd", "fc", "fa", "fb2"]],
                         ids=["config_order", "permuted_and_missing"])
@pytest.mark.parametrize("loop", [False, True], ids=["shift_tensor", "shift_per_key"])
def test_lookup_and_sgd_match_nn_embedding_bag(keys, loop, monkeypatch):
    # loop: the ids of each key shifted to their base row by one add per key (long runs of ids per key)
    monkeypatch.setattr(stacked, "_LOOP_IDS_PER_KEY", 0 if loop else 1 << 30)
    rule, hp = resolve_optimizer(functools.partial(torch.optim.SGD, lr=0.3))
    stack = StackedTables(TABLES, init_seed=0, device="cpu", rule=rule, hp=hp)
    assert sorted(tuple(b.shape) for b in stack.buffers()) == sorted([(5, 8), (9 + 6, 4), (3, 3)])
    bags = _reference()
    for t in TABLES:
        bags[t.name].weight.data.copy_(stack.table_view(t.name))
    opt = torch.optim.SGD([b.weight for b in bags.values()], lr=0.3)
    features = [f for t in TABLES for f in t.feature_names]
    anchor = torch.zeros((), requires_grad=True)
    for step in range(3):
        kjt = _kjt(keys, step)
        target = torch.randn(kjt.stride(), 27, generator=torch.Generator().manual_seed(50 + step))
        got = stack.lookup(kjt, anchor)
        want = _ref_forward(bags, kjt, features)
        torch.testing.assert_close(got, want)
        ((got - target) ** 2).sum().backward()
        opt.zero_grad()
        ((want - target) ** 2).sum().backward()
        opt.step()
        for t in TABLES:
            torch.testing.assert_close(stack.table_view(t.name), bags[t.name].weight.detach(), msg=t.name)
    assert (stack.table_view("d") - bags["d"].weight).abs().max() < 1e-6
    # per_feature: each feature's own block, zeros for the absent one
    per = stack.lookup(_kjt(keys, 9), anchor, per_feature=True)
    assert list(per) == features and all(tuple(v.shape) == (4, d) for v, d in zip(per.values(), [4, 8, 8, 4, 3]))


def test_out_of_range_id_names_the_feature_before_any_lookup():
    stack = StackedTables(TABLES, init_seed=0, device="cpu")
    # "fc" id 6: table c has 6 rows; in the stacked buffer row 9 + 6 would exist (silently wrong)
    kjt = KeyedJaggedTensor(["fa", "fc"], torch.tensor([8, 6]), lengths=torch.tensor([1, 1]))
    with pytest.raises(ValueError, match=r"feature 'fc' has id 6, but its table has 6 rows"):
        stack.lookup(kjt, torch.zeros((), requires_grad=True))
    # fb and fb2 read one table (one bound for the whole slot: the min/max check)
    kjt = KeyedJaggedTensor(["fb", "fb2"], torch.tensor([4, 0, 5]), lengths=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"feature 'fb2' has id 5, but its table has 5 rows"):
        stack.lookup(kjt, torch.zeros((), requires_grad=True))
    with pytest.raises(ValueError, match=r"feature 'fa' has id -1"):
        stack.lookup(KeyedJaggedTensor(["fa"], torch.tensor([-1]), lengths=torch.tensor([1])),
                     torch.zeros((), requires_grad=True))


def test_values_are_the_collections_seeded_init():
    from shardwise.embedding.collection.init import init_rows
    stack = StackedTables(TABLES, init_seed=3, device="cpu")
    for t in TABLES:
        torch.testing.assert_close(stack.table_view(t.name), init_rows(t, 3, 0, t.num_embeddings, 0, t.embedding_dim),
                                   rtol=0, atol=0)
