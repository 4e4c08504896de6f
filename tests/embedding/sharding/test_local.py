"""The local lookup of a sharded bag collection in a group of one rank (sharding/local.py): outputs,
updated weights and load counts bit for bit those of the general path (routing, id all-to-all, output
dist), which is forced on a twin module (``_local_shortcut = False``); both against the unsharded module
in plain PyTorch."""

from __future__ import annotations

import functools

import torch

from shardwise.embedding import (column_wise, data_parallel, reshard, row_wise, shard, table_row_wise,
                                 table_wise)
from shardwise.embedding.qcomm import CommType, QCommsConfig, get_qcomm_codecs_registry
from shardwise.embedding.torchrec_api.sharded_api import use_qcomm
from shardwise.sparse import KeyedJaggedTensor
from shardwise.testing import run_on_ranks, worker_mesh

from .. import common
from ..test_variable_batch import make_vbe

# at world 1 every plan keeps each table whole on rank 0 ("groups": three sharding-type groups)
_NAMES = [n for n, *_ in common.TABLES]
_KINDS = {"table_wise": table_wise(0), "row_wise": row_wise(), "column_wise": column_wise([0]),
          "data_parallel": data_parallel(), "table_row_wise": table_row_wise(0)}
PLANS = {kind: {n: ps for n in _NAMES} for kind, ps in _KINDS.items()}
PLANS["groups"] = {"t_a": row_wise(), "t_b": table_wise(0), "t_tiny": column_wise([0]), "t_c": data_parallel()}
DIM = sum(d * len(f) for _, _, d, f, _ in common.TABLES)


def _twins(ebc, plan, optimizer, mesh):
    """(local path, general path) modules of the same tables and plan."""
    local = shard(ebc, plan, mesh=mesh, optimizer=optimizer, load_sample_every=1)
    general = shard(ebc, plan, mesh=mesh, optimizer=optimizer, load_sample_every=1)
    general._local_shortcut = False
    return local, general


def _weights(module) -> dict:
    return {k: v.full_tensor() for k, v in module.state_dict().items()}


def train_both_paths(rank, world, names, optimizer, weighted, steps=3):
    """Per plan: (local path taken, outputs identical, weights identical, load counts identical, max
    output error vs the unsharded module, max weight error vs the dense reference, how far it moved)."""
    mesh = worker_mesh((world,))
    ebc = common.make_ebc(seed=2, weighted=weighted)
    want = common.reference_train(ebc, optimizer, world, steps, weighted)
    moved = max((w - ebc.embedding_bags[t].weight).abs().max().item() for t, w in want.items())
    plain = common.make_ebc(seed=2, weighted=weighted)   # forward ground truth of the first step
    out = {}
    for name in names:
        local, general = _twins(ebc, PLANS[name], optimizer, mesh)
        same_out, out_err = True, 0.0
        for step in range(steps):
            batch = common.rank_batches(world, step, weighted)[rank]
            target = common.targets(world, step, [batch.stride()], DIM)[0]
            a, b = local(batch), general(batch)
            same_out &= torch.equal(a.values(), b.values()) and a.keys() == b.keys()
            if step == 0:
                out_err = (a.values() - plain(batch).values()).abs().max().item()
            common.loss_fn(a, target).backward()
            common.loss_fn(b, target).backward()
        wa, wb = _weights(local), _weights(general)
        same_w = all(torch.equal(wa[k], wb[k]) for k in wa)
        err = max((wa[f"embedding_bags.{t}.weight"] - w).abs().max().item() for t, w in want.items())
        la, lb = local.load_stats(), general.load_stats()
        out[name] = (local._local_lookup() is not None, same_out, same_w, la == lb, out_err, err, moved)
    return out


def test_local_path_equals_general_path_and_plain_pytorch():
    names = list(PLANS)
    cases = [(common.SGD, False), (common.ADAGRAD, True)]
    for optimizer, weighted in cases:
        (res,) = run_on_ranks(train_both_paths, 1, names, optimizer, weighted, timeout=300.0)
        for name, (local, same_out, same_w, same_load, out_err, err, moved) in res.items():
            key = (name, optimizer.func.__name__, weighted)
            assert local, f"{key}: the local path was not taken"
            assert same_out and same_w and same_load, f"{key}: outputs {same_out}, weights {same_w}, load {same_load}"
            assert out_err < 1e-5, f"{key}: output error {out_err} against the unsharded module"
            assert moved > 1e-3 and err < 1e-5, f"{key}: weight error {err} (reference moved {moved})"


def errors_vbe_reshard_qcomm(rank, world):
    """A bad id (the general path's message; nothing changed, nothing counted), a VBE batch, a reshard
    (the local lookup is rebuilt over the new stores) and quantized comms (the general path)."""
    mesh = worker_mesh((world,))
    ebc = common.make_ebc(seed=3)
    plan = {n: table_wise(0) for n, *_ in common.TABLES}
    sgd = functools.partial(torch.optim.SGD, lr=0.1)
    local, general = _twins(ebc, plan, sgd, mesh)
    before = _weights(local)
    bad = KeyedJaggedTensor(["fb", "fa1"], torch.tensor([0, 7, 3]), lengths=torch.tensor([2, 1]))
    messages = []
    for m in (local, general):
        try:
            m(bad)
        except ValueError as exc:
            messages.append(str(exc))
    unchanged = all(torch.equal(before[k], v) for k, v in _weights(local).items())
    counted = (local._lookup_counter.steps, general._lookup_counter.steps)
    vbe, written = make_vbe(5, 4, False)
    got, other, want = local(vbe), general(vbe), ebc(written)
    vbe_same = torch.equal(got.values(), other.values())
    vbe_err = (got.values() - want.values()).abs().max().item()
    got.values().sum().backward()
    other.values().sum().backward()
    vbe_weights = all(torch.equal(a, b) for a, b in zip(_weights(local).values(), _weights(general).values()))
    batch = common.rank_batches(1, 0, False)[0]
    old = local._local_lookup()
    changes = {"t_a": row_wise(), "t_c": data_parallel()}
    reshard(local, changes)
    reshard(general, changes)
    rebuilt = local._local_lookup() not in (None, old)
    a, b = local(batch), general(batch)
    a.values().sum().backward()
    b.values().sum().backward()
    after_reshard = torch.equal(a.values(), b.values()) and \
        all(torch.equal(x, y) for x, y in zip(_weights(local).values(), _weights(general).values()))
    registry = get_qcomm_codecs_registry(QCommsConfig(CommType.BF16, CommType.BF16))
    use_qcomm(local, registry)
    use_qcomm(general, registry)
    quantized = local._local_lookup() is None and torch.equal(local(batch).values(), general(batch).values())
    return messages, unchanged, counted, vbe_same, vbe_err, vbe_weights, rebuilt, after_reshard, quantized


def test_bad_ids_vbe_reshard_and_qcomm_on_the_local_path():
    messages, unchanged, counted, vbe_same, vbe_err, vbe_weights, rebuilt, after_reshard, quantized = \
        run_on_ranks(errors_vbe_reshard_qcomm, 1, timeout=120.0)[0]
    assert len(messages) == 2 and messages[0] == messages[1], messages
    assert "rank(s) [0]" in messages[0] and "id 7 of feature 'fb' is outside its table's rows [0, 7)" in messages[0]
    assert unchanged and counted == (0, 0)
    assert vbe_same and vbe_err < 1e-5 and vbe_weights
    assert rebuilt and after_reshard and quantized


def edge_batches(rank, world):
    """Per edge batch (weighted module): (outputs identical, both require grad, weights identical after
    the backward of their sum) for the local and the general path."""
    mesh = worker_mesh((world,))
    ebc = common.make_ebc(seed=1, weighted=True)
    local, general = _twins(ebc, {n: table_wise(0) for n in _NAMES}, common.SGD, mesh)
    i64, f32 = torch.int64, torch.float32
    cases = {
        "no_samples": KeyedJaggedTensor(["fa1"], torch.zeros(0, dtype=i64), weights=torch.zeros(0),
                                        lengths=torch.zeros(0, dtype=i64), stride=0),
        "no_keys": KeyedJaggedTensor([], torch.zeros(0, dtype=i64), weights=torch.zeros(0, dtype=f32),
                                     lengths=torch.zeros(0, dtype=i64), stride=3),
        "no_ids": KeyedJaggedTensor(["fa1", "fc2"], torch.zeros(0, dtype=i64), weights=torch.zeros(0),
                                    lengths=torch.zeros(4, dtype=i64)),
        "int32_ids_f64_weights": KeyedJaggedTensor(["fc2", "fa1"], torch.tensor([1, 2, 3], dtype=torch.int32),
                                                   weights=torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64),
                                                   lengths=torch.tensor([1, 0, 2, 0], dtype=torch.int32)),
    }
    out = {}
    for name, kjt in cases.items():
        a, b = local(kjt).values(), general(kjt).values()
        a.sum().backward()
        b.sum().backward()
        out[name] = (torch.equal(a, b), a.requires_grad and b.requires_grad,
                     all(torch.equal(x, y) for x, y in zip(_weights(local).values(), _weights(general).values())))
    return out


def test_edge_batches_on_the_local_path():
    for name, (same_out, grads, same_w) in run_on_ranks(edge_batches, 1, timeout=120.0)[0].items():
        assert same_out and grads and same_w, f"{name}: outputs {same_out}, require grad {grads}, weights {same_w}"


def fused_sgd_occurrences(rank, world):
    """Tables large enough for the fused SGD's per-occurrence kernel (optim/occurrence_sgd.py, what the
    many-small-tables benchmark runs): (calls of that kernel on each path, outputs identical, weights
    identical, max weight error vs torch.optim.SGD on the unsharded module)."""
    from shardwise.embedding import EmbeddingBagCollection, EmbeddingBagConfig
    from shardwise.embedding.optim.occurrence_sgd import OccurrenceSGD

    mesh = worker_mesh((world,))
    cfgs = [EmbeddingBagConfig(256, 32, f"t{i}", feature_names=[f"f{i}"]) for i in range(4)]
    ebc = EmbeddingBagCollection(cfgs, init_seed=5)
    ref = EmbeddingBagCollection(cfgs, init_seed=5)
    opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    local, general = _twins(ebc, {c.name: table_wise(0) for c in cfgs}, common.SGD, mesh)
    calls, real = [0, 0], OccurrenceSGD.__call__

    def counted(self, weight, *args):
        calls[0 if weight.data_ptr() == local._groups[0].store.buffers[0].data_ptr() else 1] += 1
        return real(self, weight, *args)

    OccurrenceSGD.__call__ = counted
    try:
        same_out = True
        for step in range(2):
            g = torch.Generator().manual_seed(step)
            lengths = torch.randint(0, 40, (4 * 32,), generator=g)
            kjt = KeyedJaggedTensor([c.feature_names[0] for c in cfgs], torch.randint(0, 256, (int(lengths.sum()),),
                                    generator=g), lengths=lengths)
            a, b, want = local(kjt), general(kjt), ref(kjt)
            same_out &= torch.equal(a.values(), b.values())
            for out in (a, b, want):
                (out.values() ** 2).sum().backward()
            opt.step()
            opt.zero_grad()
    finally:
        OccurrenceSGD.__call__ = real
    wa, wb = _weights(local), _weights(general)
    err = max((wa[f"embedding_bags.{c.name}.weight"] - ref.embedding_bags[c.name].weight).abs().max().item()
              for c in cfgs)
    return calls, same_out, all(torch.equal(wa[k], wb[k]) for k in wa), err


def test_fused_sgd_occurrence_kernel_on_the_local_path():
    calls, same_out, same_w, err = run_on_ranks(fused_sgd_occurrences, 1, timeout=300.0)[0]
    assert calls == [2, 2], f"the per-occurrence kernel ran {calls} times (local, general), expected 2 each"
    assert same_out and same_w and err < 1e-5, f"outputs {same_out}, weights {same_w}, error vs torch.optim {err}"
