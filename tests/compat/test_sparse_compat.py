"""shardwise.sparse used the way TorchRec users' code uses TorchRec's sparse types.

Constructors by position, the helper methods, variable batch per feature and fx tracing; every
result is checked against the same computation on plain Python lists / plain PyTorch tensors.
"""

import pytest
import torch
import torch.nn.functional as F

from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig
from shardwise.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor, symbolic_trace

# ground truth as plain lists: per key, per sample, (ids, weights)
BAGS = {
    "user": [([3, 1], [0.5, 2.0]), ([], []), ([4], [1.5])],
    "item": [([0], [1.0]), ([2, 2, 5], [0.25, 0.5, 3.0]), ([7], [2.0])],
}


def _flat(bags=BAGS):
    keys = list(bags)
    values = [i for k in keys for ids, _ in bags[k] for i in ids]
    weights = [w for k in keys for _, ws in bags[k] for w in ws]
    lengths = [len(ids) for k in keys for ids, _ in bags[k]]
    return keys, torch.tensor(values), torch.tensor(weights), torch.tensor(lengths, dtype=torch.int32)


def _bags_of(jt: JaggedTensor):
    w = jt.weights_or_none()
    return [(v.tolist(), [] if w is None else ww.tolist())
            for v, ww in zip(jt.to_dense(), jt.to_dense_weights() or [torch.zeros(0)] * len(jt.to_dense()))]


def test_kjt_positional_order_is_keys_values_weights_lengths_offsets():
    keys, values, weights, lengths = _flat()
    kjt = KeyedJaggedTensor(keys, values, weights, lengths)   # TorchRec's order
    assert torch.equal(kjt.weights(), weights) and torch.equal(kjt.lengths(), lengths.long())
    for k in keys:
        assert _bags_of(kjt[k]) == [(ids, ws) for ids, ws in BAGS[k]]
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.long().cumsum(0)])
    by_offsets = KeyedJaggedTensor(keys, values, None, None, offsets)
    assert by_offsets.weights_or_none() is None and by_offsets.lengths().tolist() == lengths.tolist()
    assert by_offsets.lengths_or_none() is not None and kjt.stride() == by_offsets.stride() == 3
    # stride is the 6th positional argument, as in TorchRec
    assert KeyedJaggedTensor(keys, values, weights, lengths, None, 3).stride() == 3


def test_jagged_tensor_positional_order_is_values_weights_lengths_offsets():
    values, weights = torch.tensor([4, 5, 6]), torch.tensor([0.5, 1.0, 2.0])
    jt = JaggedTensor(values, weights, torch.tensor([2, 0, 1]))
    assert jt.weights() is weights and jt.lengths().tolist() == [2, 0, 1]
    jt2 = JaggedTensor(values, None, None, torch.tensor([0, 2, 2, 3]))
    assert jt.offsets_or_none() is None and jt2.lengths_or_none() is None   # not given, not asked for yet
    assert jt2.lengths().tolist() == [2, 0, 1] and jt2.weights_or_none() is None
    assert jt2.lengths_or_none() is not None
    assert jt.offsets().tolist() == [0, 2, 2, 3] and jt.offsets_or_none() is not None


def test_weighted_pooling_through_positional_kjt_matches_plain_torch():
    keys, values, weights, lengths = _flat()
    table = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    kjt = KeyedJaggedTensor.from_lengths_sync(keys, values, lengths, weights)
    for k in keys:
        jt = kjt[k]
        got = F.embedding_bag(jt.values(), table, jt.offsets()[:-1], mode="sum", per_sample_weights=jt.weights())
        want = torch.stack([sum((table[i] * w for i, w in zip(ids, ws)), torch.zeros(4)) for ids, ws in BAGS[k]])
        torch.testing.assert_close(got, want)


def test_ebc_forward_on_a_kjt_built_by_position():
    keys, values, weights, lengths = _flat()
    cfg = [EmbeddingBagConfig(name="t", num_embeddings=8, embedding_dim=4, feature_names=["user", "item"])]
    ebc = EmbeddingBagCollection(cfg, is_weighted=True)
    kt = ebc(KeyedJaggedTensor(keys, values, weights, lengths))
    table = ebc.embedding_bags["t"].weight.detach()
    for k in keys:
        want = torch.stack([sum((table[i] * w for i, w in zip(ids, ws)), torch.zeros(4)) for ids, ws in BAGS[k]])
        torch.testing.assert_close(kt[k].detach(), want)


def test_concat_split_permute_against_lists():
    keys, values, weights, lengths = _flat()
    a = KeyedJaggedTensor(["user"], values[:3], weights[:3], lengths[:3])
    b = KeyedJaggedTensor(["item"], values[3:], weights[3:], lengths[3:])
    whole = KeyedJaggedTensor.concat([a, b])
    assert whole.keys() == keys and torch.equal(whole.values(), values) and torch.equal(whole.weights(), weights)
    p = whole.permute([1, 0])
    assert p.keys() == ["item", "user"]
    assert [_bags_of(p[k]) for k in p.keys()] == [[tuple(b) for b in BAGS[k]] for k in ["item", "user"]]
    first, second = p.split([1, 1])
    assert _bags_of(first["item"]) == [tuple(b) for b in BAGS["item"]] and second.keys() == ["user"]
    assert whole.length_per_key() == [3, 5] and whole.offset_per_key() == [0, 3, 8]
    assert whole.lengths_offset_per_key() == [0, 3, 6] and whole.index_per_key() == {"user": 0, "item": 1}


def test_helpers_empty_sync_to_flatten():
    keys, values, weights, lengths = _flat()
    kjt = KeyedJaggedTensor(keys, values, weights, lengths)
    assert kjt.length_per_key_or_none() is None
    assert kjt.sync() is kjt and kjt.length_per_key_or_none() == [3, 5]
    assert kjt.unsync().length_per_key_or_none() is None
    e = KeyedJaggedTensor.empty(is_weighted=True)
    assert e.keys() == [] and e.stride() == 0 and e.values().numel() == 0 and e.weights().numel() == 0
    like = KeyedJaggedTensor.empty_like(kjt)
    assert like.keys() == [] and like.stride() == 3 and like.values().dtype == values.dtype
    moved = kjt.to(torch.device("cpu"), dtype=torch.float64)
    assert moved.device() == torch.device("cpu") and moved.weights().dtype == torch.float64
    assert torch.equal(moved.weights(), weights.double()) and torch.equal(moved.values(), values)
    flat = kjt.flatten_lengths()
    assert torch.equal(flat.lengths(), kjt.lengths()) and flat.keys() == keys
    assert {k: _bags_of(j) for k, j in kjt.to_dict().items()} == {k: [tuple(b) for b in v] for k, v in BAGS.items()}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pin_memory/record_stream need CUDA")
def test_pin_memory_and_record_stream_on_cuda():
    keys, values, weights, lengths = _flat()
    pinned = KeyedJaggedTensor(keys, values, weights, lengths).pin_memory()
    assert pinned.values().is_pinned() and torch.equal(pinned.values(), values)
    dev = pinned.to(torch.device("cuda", torch.cuda.current_device()), non_blocking=True)
    dev.record_stream(torch.cuda.current_stream())
    assert torch.equal(dev.values().cpu(), values)


def test_variable_batch_per_feature():
    # user has 2 bags (1 from rank 0, 1 from rank 1), item 3 (2 + 1)
    vbags = {"user": [[3, 1], [4]], "item": [[0], [2, 2, 5], [7]]}
    values = torch.tensor([i for k in vbags for b in vbags[k] for i in b])
    lengths = torch.tensor([len(b) for k in vbags for b in vbags[k]])
    kjt = KeyedJaggedTensor(list(vbags), values, None, lengths, stride_per_key_per_rank=[[1, 1], [2, 1]])
    assert kjt.variable_stride_per_key() and kjt.stride_per_key() == [2, 3] and kjt.stride() == 3
    assert kjt.stride_per_key_per_rank() == [[1, 1], [2, 1]] and kjt.lengths_offset_per_key() == [0, 2, 5]
    assert {k: [t.tolist() for t in j.to_dense()] for k, j in kjt.to_dict().items()} == vbags
    p = kjt.permute([1, 0])
    assert p.stride_per_key() == [3, 2] and [t.tolist() for t in p["user"].to_dense()] == vbags["user"]
    a, b = kjt.split([1, 1])
    assert a.stride_per_key() == [2] and [t.tolist() for t in b["item"].to_dense()] == vbags["item"]
    both = KeyedJaggedTensor.concat([a, b])
    assert torch.equal(both.lengths(), kjt.lengths()) and both.stride_per_key_per_rank() == [[1, 1], [2, 1]]
    plain = KeyedJaggedTensor(["user"], torch.tensor([1]), None, torch.tensor([1]))
    assert not plain.variable_stride_per_key() and plain.stride_per_key_per_rank() == []


def test_inverse_indices_expand_deduplicated_bags_to_the_batch():
    # a batch of 4 samples; distinct bags per key stored once, inverse_indices map samples to them
    batch = {"user": [[3], [3], [5, 6], [3]], "item": [[1], [2], [1], [1]]}
    uniq = {k: sorted({tuple(b) for b in v}) for k, v in batch.items()}
    inv = torch.tensor([[uniq[k].index(tuple(b)) for b in batch[k]] for k in batch])
    values = torch.tensor([i for k in uniq for b in uniq[k] for i in b])
    lengths = torch.tensor([len(b) for k in uniq for b in uniq[k]])
    kjt = KeyedJaggedTensor(list(batch), values, None, lengths,
                            stride_per_key_per_rank=[[len(uniq[k])] for k in batch],
                            inverse_indices=(list(batch), inv))
    assert kjt.stride() == 4 and kjt.inverse_indices()[0] == list(batch)
    for i, k in enumerate(kjt.inverse_indices()[0]):
        stored = kjt[k].to_dense()
        assert [stored[j].tolist() for j in kjt.inverse_indices()[1][i].tolist()] == batch[k]


def test_jagged_dense_conversions_match_plain_padding():
    rows = [[1.0, 2.0], [], [3.0, 4.0, 5.0]]
    jt = JaggedTensor.from_dense([torch.tensor(r) for r in rows], [torch.tensor(r) * 10 for r in rows])
    assert [t.tolist() for t in jt.to_dense()] == rows and jt.lengths().tolist() == [2, 0, 3]
    want = torch.tensor([r + [-1.0] * (3 - len(r)) for r in rows])
    assert torch.equal(jt.to_padded_dense(padding_value=-1.0), want)
    cut = torch.tensor([r[:2] + [0.0] * (2 - len(r[:2])) for r in rows])   # longer bags truncated
    assert torch.equal(jt.to_padded_dense(desired_length=2), cut)
    assert torch.equal(jt.to_padded_dense_weights(padding_value=-10.0), torch.where(want == -1, -10.0, want * 10))
    back = JaggedTensor.from_dense_lengths(want, torch.tensor([2, 0, 3]))
    assert torch.equal(back.values(), jt.values()) and torch.equal(back.lengths(), jt.lengths())
    emb = torch.arange(12.0).view(6, 2)   # [N, D] values: one embedding per id, jagged along dim 0
    ejt = JaggedTensor(emb, None, torch.tensor([1, 2, 0, 3]))
    assert torch.equal(ejt.to_padded_dense()[3], emb[3:6]) and ejt.to_dense()[1].shape == (2, 2)
    e = JaggedTensor.empty(is_weighted=True)
    assert len(e) == 0 and e.weights().numel() == 0
    assert JaggedTensor.empty_like(jt).values().dtype == jt.values().dtype


def test_keyed_tensor_from_tensor_list_and_regroup_with_gradients():
    g = torch.Generator().manual_seed(1)
    a, b, c = (torch.randn(3, d, generator=g, requires_grad=True) for d in (2, 3, 4))
    kt1 = KeyedTensor.from_tensor_list(["a", "b"], [a, b])
    kt2 = KeyedTensor(["c"], [4], c)
    assert kt1.key_dim() == 1 and kt1.length_per_key() == [2, 3] and kt1.offset_per_key() == [0, 2, 5]
    assert torch.equal(kt1.values(), torch.cat([a, b], dim=1)) and torch.equal(kt1.to_dict()["b"], b)
    g1, g2 = KeyedTensor.regroup([kt1, kt2], [["c", "a"], ["b"]])
    assert torch.equal(g1, torch.cat([c, a], dim=1)) and torch.equal(g2, b)
    d = KeyedTensor.regroup_as_dict([kt1, kt2], [["b", "c"]], ["bc"])
    assert torch.equal(d["bc"], torch.cat([b, c], dim=1))
    (g1 * 2).sum().backward()
    assert torch.equal(a.grad, torch.full_like(a, 2.0)) and torch.equal(c.grad, torch.full_like(c, 2.0))
    assert torch.equal(b.grad, torch.zeros_like(b))   # in kt1's values, but in no group used
    rows = torch.arange(6.0).view(3, 2)   # keys along dim 0: x is row 0, y rows 1-2
    kt0 = KeyedTensor(["x", "y"], [1, 2], rows, key_dim=0)
    assert torch.equal(kt0["y"], rows[1:]) and torch.equal(KeyedTensor.regroup([kt0], [["y", "x"]])[0], rows[[1, 2, 0]])


class _UsesKjt(torch.nn.Module):
    def forward(self, kjt: KeyedJaggedTensor):
        doubled = KeyedJaggedTensor(kjt.keys(), kjt.values() * 2, kjt.weights(), kjt.lengths())
        swapped = doubled.permute([1, 0])
        both = KeyedJaggedTensor.concat([swapped.split([1, 1])[0], kjt.split([1, 1])[0]])
        return both.values(), swapped["user"].weights() + 1, both.stride()


def test_fx_symbolic_trace_of_a_module_calling_kjt_methods():
    keys, values, weights, lengths = _flat()
    kjt = KeyedJaggedTensor(keys, values, weights, lengths)
    m = _UsesKjt()
    gm = torch.fx.symbolic_trace(m)
    assert "permute" in gm.code and "concat_kjts" in gm.code
    want, got = m(kjt), gm(kjt)
    assert torch.equal(got[0], torch.cat([values[3:] * 2, values[:3]])) and torch.equal(got[0], want[0])
    assert torch.equal(got[1], weights[:3] + 1) and got[2] == want[2] == 3


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ebc = EmbeddingBagCollection([EmbeddingBagConfig(name="t", num_embeddings=8, embedding_dim=4,
                                                              feature_names=["user", "item"])])
        self.over = torch.nn.Linear(8, 1)

    def forward(self, kjt):
        pooled = self.ebc(kjt)
        user, item = KeyedTensor.regroup([pooled], [["user"], ["item"]])
        return self.over(torch.cat([user * item, pooled.values()[:, :4]], dim=1))


def test_fx_trace_of_a_model_with_an_embedding_bag_collection():
    keys, values, _, lengths = _flat()
    kjt = KeyedJaggedTensor(keys, values, None, lengths)
    model = _Model()
    gm = symbolic_trace(model)
    assert any(n.op == "call_module" and n.target == "ebc" for n in gm.graph.nodes)
    table = model.ebc.embedding_bags["t"].weight.detach()
    pooled = {k: torch.stack([table[ids].sum(0) if ids else torch.zeros(4) for ids, _ in BAGS[k]]) for k in keys}
    want = model.over(torch.cat([pooled["user"] * pooled["item"], pooled["user"]], dim=1))
    torch.testing.assert_close(gm(kjt), want)
    torch.testing.assert_close(gm(kjt), model(kjt))


def test_meta_kjt_supports_shape_only_code_like_torchrec():
    # on the meta device nothing can be read: per-key sizes are TorchRec's stand-in (the values split
    # as evenly as they go, the remainder to the first key); everything shape-only runs
    keys, values, weights, lengths = _flat()
    real = KeyedJaggedTensor(keys, values.float(), weights, lengths)
    meta = KeyedJaggedTensor(keys, values.float().to("meta"), weights.to("meta"), lengths.to("meta"))
    assert meta.sync().length_per_key() == [4, 4]  # 8 values over 2 keys (the real split is [3, 5])
    assert sum(meta.length_per_key()) == meta.values().numel() == real.values().numel()
    assert meta.offset_per_key() == [0, 4, 8] and meta.unsync().length_per_key_or_none() is None
    jts = meta.to_dict()
    assert list(jts) == keys and all(jt.values().is_meta and jt.weights().is_meta for jt in jts.values())
    assert [jt.values().shape[0] for jt in jts.values()] == [4, 4]
    again = KeyedJaggedTensor.from_jt_dict(jts)
    assert again.keys() == keys and again.values().is_meta and again.stride() == real.stride()
    odd = KeyedJaggedTensor(keys + ["x"], torch.zeros(8, device="meta"),
                            lengths=torch.zeros(9, dtype=torch.long, device="meta"))
    assert odd.length_per_key() == [4, 2, 2]
    empty = KeyedJaggedTensor.from_lengths_sync([], torch.tensor([], device="meta"),
                                                lengths=torch.tensor([], device="meta"))
    assert empty.length_per_key() == []
    assert real.length_per_key() == [3, 5]  # real values: read from the lengths
