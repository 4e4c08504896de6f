"""shardwise.models.dlrm against the same model written out in plain torch (always on)."""

import pytest
import torch
import torch.nn.functional as F

from shardwise.datasets import Batch
from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig
from shardwise.models.dlrm import DLRM, DLRM_DCN, DLRMTrain, InteractionArch, OverArch, choose
from shardwise.sparse import KeyedJaggedTensor

D = 4


def _ebc():
    return EmbeddingBagCollection([EmbeddingBagConfig(20, D, "t1", feature_names=["f1", "f3"]),
                                   EmbeddingBagConfig(30, D, "t2", feature_names=["f2"])])


def _kjt():
    # keys in another order than the tables' features: the sparse arch orders them by the tables
    lengths = torch.tensor([1, 2, 0, 3, 1, 1, 2, 0, 1])          # f2, f1, f3 over 3 examples
    values = torch.tensor([5, 7, 29, 1, 2, 3, 9, 4, 4, 19, 0])
    return KeyedJaggedTensor(["f2", "f1", "f3"], values, lengths=lengths)


def _pooled(model, kjt):
    """Sum-pooled rows per feature in the tables' feature order (f1, f3, f2), B x F x D."""
    w = {n: model.sparse_arch.embedding_bag_collection.embedding_bags[n].weight for n in ("t1", "t2")}
    table = {"f1": "t1", "f3": "t1", "f2": "t2"}
    out = []
    for f in ("f1", "f3", "f2"):
        jt = kjt[f]
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), jt.lengths().cumsum(0)])
        out.append(F.embedding_bag(jt.values(), w[table[f]], offsets[:-1], mode="sum"))
    return torch.stack(out, 1)


def _mlp(x, linears, last_relu=True):
    for i, lin in enumerate(linears):
        x = F.linear(x, lin.weight, lin.bias)
        if last_relu or i < len(linears) - 1:
            x = torch.relu(x)
    return x


def _dense_and_over(model):
    bottom = [p._linear for p in model.dense_arch.model._mlp]
    top = [p._linear for p in model.over_arch.model[0]._mlp] + [model.over_arch.model[1]]
    return bottom, top


def test_dlrm_equals_plain_torch():
    torch.manual_seed(0)
    model, kjt, dense = DLRM(_ebc(), 5, [8, D], [6, 1]), _kjt(), torch.randn(3, 5)
    bottom, top = _dense_and_over(model)
    x = _mlp(dense, bottom)
    feats = torch.cat([x.unsqueeze(1), _pooled(model, kjt)], 1)
    dots = feats @ feats.transpose(1, 2)
    pairs = [dots[:, i, j] for i in range(4) for j in range(i + 1, 4)]
    want = _mlp(torch.cat([x, torch.stack(pairs, 1)], 1), top, last_relu=False)
    torch.testing.assert_close(model(dense, kjt), want)
    assert model.over_arch.model[0]._mlp[0]._linear.in_features == D + 3 + choose(3, 2)


def test_dlrm_dcn_equals_plain_torch():
    torch.manual_seed(0)
    model, kjt, dense = DLRM_DCN(_ebc(), 5, [8, D], [6, 1], dcn_num_layers=2, dcn_low_rank_dim=3), _kjt(), torch.randn(3, 5)
    bottom, top = _dense_and_over(model)
    net = model.inter_arch.crossnet
    for b in net.bias:                       # zero at start: give the bias a part in the check
        torch.nn.init.normal_(b)
    x0 = torch.cat([_mlp(dense, bottom).unsqueeze(1), _pooled(model, kjt)], 1).reshape(3, -1)
    x = x0
    for w, v, b in zip(net.W_kernels, net.V_kernels, net.bias):
        x = x0 * (x @ v.T @ w.T + b) + x
    torch.testing.assert_close(model(dense, kjt), _mlp(x, top, last_relu=False))


def test_dlrm_train_returns_torchrecs_tuple_and_trains():
    torch.manual_seed(0)
    train = DLRMTrain(DLRM(_ebc(), 5, [8, D], [6, 1]))
    batch = Batch(torch.randn(3, 5), _kjt(), torch.tensor([1, 0, 1]))
    loss, (detached, logits, labels) = train(batch)
    want = F.binary_cross_entropy_with_logits(train.model(batch.dense_features, batch.sparse_features).squeeze(1),
                                              torch.tensor([1.0, 0.0, 1.0]))
    torch.testing.assert_close(loss, want)
    assert torch.equal(detached, loss.detach()) and logits.shape == (3,) and torch.equal(labels, batch.labels)
    loss.backward()
    assert train.model.sparse_arch.embedding_bag_collection.embedding_bags["t1"].weight.grad is not None


def test_interaction_pairs_in_torchrecs_order():
    dense, sparse = torch.randn(2, 3), torch.randn(2, 2, 3)
    out = InteractionArch(2)(dense, sparse)
    rows = [dense, sparse[:, 0], sparse[:, 1]]
    want = [(rows[i] * rows[j]).sum(1) for i, j in ((0, 1), (0, 2), (1, 2))]
    torch.testing.assert_close(out, torch.cat([dense, torch.stack(want, 1)], 1))


@pytest.mark.parametrize("build, match", [
    (lambda: DLRM(_ebc(), 5, [8, 3], [6, 1]), "embedding_dim 4"),
    (lambda: DLRM(EmbeddingBagCollection([EmbeddingBagConfig(5, 4, "a", feature_names=["x"]),
                                          EmbeddingBagConfig(5, 8, "b", feature_names=["y"])]), 5, [4], [2, 1]),
     "same embedding_dim"),
    (lambda: OverArch(4, [1]), "at least two sizes"),
    (lambda: DLRM_DCN(_ebc(), 5, [8, D], [6, 1], dcn_num_layers=1, dcn_low_rank_dim=0), "low_rank=0"),
])
def test_bad_arguments_are_refused(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def _sharded_vs_unsharded(rank, world):
    from shardwise.embedding import row_wise, shard, table_wise
    from shardwise.testing import worker_mesh

    torch.manual_seed(0)
    ebc = EmbeddingBagCollection([EmbeddingBagConfig(20, D, "t1", feature_names=["f1", "f3"]),
                                  EmbeddingBagConfig(30, D, "t2", feature_names=["f2"])], init_seed=1)
    plain = DLRM_DCN(ebc, 5, [8, D], [6, 1], dcn_num_layers=1, dcn_low_rank_dim=2)
    # t2 row-wise, t1 table-wise on the last rank: the sharded output comes grouped by sharding type
    sharded = shard(ebc, {"t1": table_wise(world - 1), "t2": row_wise()}, mesh=worker_mesh((world,)))
    model = DLRM_DCN(sharded, 5, [8, D], [6, 1], dcn_num_layers=1, dcn_low_rank_dim=2)
    model.load_state_dict({k: v for k, v in plain.state_dict().items() if "sparse_arch" not in k}, strict=False)
    dense = torch.randn(3, 5)
    return (model(dense, _kjt()) - plain(dense, _kjt())).abs().max().item()


def test_dlrm_over_a_sharded_collection_equals_the_unsharded_model():
    from shardwise.testing import run_on_ranks

    assert all(err <= 1e-6 for err in run_on_ranks(_sharded_vs_unsharded, 2))
