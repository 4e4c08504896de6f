"""Bad inputs for sharded embedding bags, built on every rank (see ``_runner.run_case``).

``_one_rank`` cases give only the last rank the bad input (its own batch, its own plan): every rank
must still fail, the shards and the fused optimizer state must be untouched.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from shardwise.embedding import (
    EmbeddingBagCollection, EmbeddingBagConfig, RowWiseAdagrad, column_wise, data_parallel, row_wise, shard,
    table_wise,
)
from shardwise.sparse import KeyedJaggedTensor

from shardwise.testing import worker_mesh

from ._runner import short_timeout_mesh

_ADAGRAD = functools.partial(torch.optim.Adagrad, lr=0.1)


def _ebc(weighted=False):
    torch.manual_seed(0)
    return EmbeddingBagCollection([
        EmbeddingBagConfig(name="ta", num_embeddings=10, embedding_dim=4, feature_names=["fa"]),
        EmbeddingBagConfig(name="tb", num_embeddings=7, embedding_dim=4, feature_names=["fb"], pooling="mean"),
    ], is_weighted=weighted)


def _plan():
    return {"ta": row_wise(), "tb": table_wise(1)}


def _sharded(plan=None, weighted=False, mesh=None):
    return shard(_ebc(weighted), plan or _plan(), mesh=mesh, optimizer=_ADAGRAD)


def _kjt(values=(1, 2, 9, 3, 6), keys=("fa", "fb"), weights=None):
    values = torch.tensor(values)
    return KeyedJaggedTensor(list(keys), values, lengths=torch.tensor([1, 2, 1, 1]), weights=weights)


def _train_one_step(s):
    # one good step first, so the optimizer state is not all zeros and a corruption would show
    s(_kjt()).values().sum().backward()


def _state(s):
    return [s, s.fused_optimizer]


# ---- shard() -----------------------------------------------------------------------------------
def shard_not_an_ebc(rank, world):
    return lambda: shard(torch.nn.Linear(2, 2), _plan()), []


def shard_plan_missing_table(rank, world):
    ebc = _ebc()
    return lambda: shard(ebc, {"ta": row_wise()}), [ebc]


def shard_plan_entry_wrong_type(rank, world):
    ebc = _ebc()
    return lambda: shard(ebc, {"ta": row_wise(), "tb": "table_wise"}), [ebc]


def shard_rank_outside_world(rank, world):
    ebc = _ebc()
    return lambda: shard(ebc, {"ta": row_wise(), "tb": table_wise(world)}), [ebc]


def shard_column_ranks_outside_world(rank, world):
    ebc = _ebc()
    return lambda: shard(ebc, {"ta": column_wise([0, world]), "tb": table_wise(0)}), [ebc]


def shard_unsupported_optimizer(rank, world):
    ebc = _ebc()
    return lambda: shard(ebc, _plan(), optimizer=torch.optim.RMSprop), [ebc]


def shard_sgd_momentum(rank, world):
    ebc = _ebc()
    return lambda: shard(ebc, _plan(), optimizer=functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9)), [ebc]


def shard_rowwise_adagrad_on_columns(rank, world):
    ebc = _ebc()
    return lambda: shard(ebc, {"ta": column_wise([0, 1]), "tb": table_wise(0)}, optimizer=RowWiseAdagrad), [ebc]


def shard_plan_differs_one_rank(rank, world):
    plan = {"ta": row_wise(), "tb": table_wise(1 if rank == world - 1 else 0)}
    mesh = short_timeout_mesh()
    ebc = _ebc()
    return lambda: shard(ebc, plan, mesh=mesh)(_kjt()).values().sum().backward(), [ebc]


def shard_tables_differ_one_rank(rank, world):
    rows = 11 if rank == world - 1 else 10
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection([EmbeddingBagConfig(name="ta", num_embeddings=rows, embedding_dim=4, feature_names=["fa"]), EmbeddingBagConfig(name="tb", num_embeddings=7, embedding_dim=4, feature_names=["fb"])])
    mesh = short_timeout_mesh()
    return lambda: shard(ebc, _plan(), mesh=mesh)(_kjt()).values().sum().backward(), [ebc]


def shard_mesh_differs_one_rank(rank, world):
    flat, two_d = short_timeout_mesh(), worker_mesh((1, world))  # collective: every rank builds both
    mesh = two_d if rank == world - 1 else flat
    ebc = _ebc()
    return lambda: shard(ebc, _plan(), mesh=mesh)(_kjt()).values().sum().backward(), [ebc]


# ---- forward on this rank's batch ----------------------------------------------------------------
def forward_unknown_feature(rank, world):
    s = _sharded()
    _train_one_step(s)
    return lambda: s(_kjt(keys=("fa", "fz"))), _state(s)


def forward_not_a_kjt(rank, world):
    s = _sharded()
    _train_one_step(s)
    return lambda: s(torch.tensor([1, 2])), _state(s)


def forward_unknown_feature_one_rank(rank, world):
    s = _sharded(mesh=short_timeout_mesh())
    _train_one_step(s)
    keys = ("fa", "fz") if rank == world - 1 else ("fa", "fb")
    return lambda: s(_kjt(keys=keys)), _state(s)


def forward_missing_weights_one_rank(rank, world):
    s = _sharded(weighted=True, mesh=short_timeout_mesh())
    s(_kjt(weights=torch.ones(5))).values().sum().backward()
    weights = None if rank == world - 1 else torch.ones(5)
    return lambda: s(_kjt(weights=weights)), _state(s)


def forward_unexpected_weights_one_rank(rank, world):
    s = _sharded(mesh=short_timeout_mesh())
    _train_one_step(s)
    weights = torch.ones(5) if rank == world - 1 else None
    return lambda: s(_kjt(weights=weights)), _state(s)


def forward_id_too_large_one_rank(rank, world):
    s = _sharded(mesh=short_timeout_mesh())
    _train_one_step(s)
    values = (1, 2, 10, 3, 6) if rank == world - 1 else (1, 2, 9, 3, 6)
    return lambda: s(_kjt(values)).values().sum().backward(), _state(s)


def forward_negative_id_one_rank(rank, world):
    s = _sharded(mesh=short_timeout_mesh())
    _train_one_step(s)
    values = (1, -2, 9, 3, 6) if rank == world - 1 else (1, 2, 9, 3, 6)
    return lambda: s(_kjt(values)).values().sum().backward(), _state(s)


def forward_float_ids_one_rank(rank, world):
    s = _sharded(mesh=short_timeout_mesh())
    _train_one_step(s)
    kjt = _kjt()
    if rank == world - 1:
        kjt = KeyedJaggedTensor(kjt.keys(), kjt.values().float(), lengths=kjt.lengths())
    return lambda: s(kjt).values().sum().backward(), _state(s)


# ---- state dicts and checkpoints ---------------------------------------------------------------
def load_missing_key(rank, world):
    s = _sharded()
    _train_one_step(s)
    sd = {k: v for k, v in s.state_dict().items() if "tb" not in k}
    return lambda: s.load_state_dict(sd), _state(s)


def load_wrong_shape_second_table(rank, world):
    # the first table is fine, the second has the wrong shape: nothing may be copied before raising
    s = _sharded()
    _train_one_step(s)
    sd = {"embedding_bags.ta.weight": torch.zeros(10, 4), "embedding_bags.tb.weight": torch.zeros(8, 4)}
    return lambda: s.load_state_dict(sd), _state(s)


def load_value_not_a_tensor(rank, world):
    s = _sharded()
    _train_one_step(s)
    sd = {"embedding_bags.ta.weight": [[0.0] * 4] * 10, "embedding_bags.tb.weight": torch.zeros(7, 4)}
    return lambda: s.load_state_dict(sd), _state(s)


def optim_load_steps_differ(rank, world):
    s = _sharded()
    _train_one_step(s)
    sd = s.fused_optimizer.state_dict()
    sd["state"]["embedding_bags.ta.weight"]["ta.momentum1"] = torch.ones(10, 4)
    sd["state"]["embedding_bags.tb.weight"]["tb.step"] = torch.tensor(5.0)
    return lambda: s.fused_optimizer.load_state_dict(sd), _state(s)


def dcp_load_into_other_tables(rank, world):
    # a checkpoint of another model: loading must fail and leave both the module and the files alone
    s = _sharded()
    _train_one_step(s)
    root = [tempfile.mkdtemp(prefix="rel-ckpt-")] if rank == 0 else [None]
    dist.broadcast_object_list(root)
    path = Path(root[0])
    dcp.save({"model": s.state_dict()}, checkpoint_id=str(path))
    torch.manual_seed(0)
    other = shard(EmbeddingBagCollection([EmbeddingBagConfig(name="ta", num_embeddings=12, embedding_dim=4, feature_names=["fa"]),
                                          EmbeddingBagConfig(name="tb", num_embeddings=7, embedding_dim=4, feature_names=["fb"])]), _plan(), optimizer=_ADAGRAD)
    _train_one_step(other)

    def call():
        target = {"model": other.state_dict()}
        dcp.load(target, checkpoint_id=str(path))
        other.load_state_dict(target["model"])
    return call, [other, other.fused_optimizer, path]


# ---- sparse constructors: pure, no ranks ---------------------------------------------------------
def kjt_bad_values():
    """(call, exception, fragment) for KeyedJaggedTensor / JaggedTensor inputs."""
    from shardwise.sparse import JaggedTensor

    v = torch.tensor([1, 2, 3])
    return [
        (lambda: KeyedJaggedTensor(["a", "b"], v, lengths=torch.tensor([1, 1, 0, 0])), ValueError,
         "lengths sum to 2 but there are 3 values"),
        (lambda: KeyedJaggedTensor(["a", "b"], v, lengths=torch.tensor([2, -1, 1, 1])), ValueError,
         "lengths must be >= 0"),
        (lambda: KeyedJaggedTensor(["a", "b"], v, lengths=torch.tensor([1.0, 1.0, 1.0, 0.0])), TypeError,
         "integer dtype"),
        (lambda: KeyedJaggedTensor(["a", "b"], v, lengths=torch.tensor([1, 1, 1])), ValueError,
         "cannot be split evenly over 2 keys"),
        (lambda: KeyedJaggedTensor(["a", "a"], v, lengths=torch.tensor([1, 1, 1, 0])), ValueError,
         "keys must be unique"),
        (lambda: KeyedJaggedTensor(["a", 3], v, lengths=torch.tensor([1, 1, 1, 0])), TypeError,
         "keys must be strings"),
        (lambda: KeyedJaggedTensor(["a"], v, lengths=torch.tensor([3]), weights=torch.ones(2)), ValueError,
         "weights must have one entry per value"),
        # [N, D] values are a KJT TorchRec accepts; a lookup refuses them (ids are one per value)
        (lambda: _ebc()(KeyedJaggedTensor(["fa"], v.view(3, 1), lengths=torch.tensor([3]))), ValueError,
         "a lookup needs one id per value (1-D values)"),
        (lambda: KeyedJaggedTensor(["a"], v, lengths=torch.tensor([3]), stride=2), ValueError, "stride=2"),
        (lambda: KeyedJaggedTensor(["a"], v, offsets=torch.tensor([0, 2, 1, 3])), ValueError, "non-decreasing"),
        (lambda: KeyedJaggedTensor(["a"], v, offsets=torch.tensor([1, 3])), ValueError, "start with 0"),
        (lambda: KeyedJaggedTensor(["a"], v, lengths=torch.tensor([3])).permute([1]), ValueError,
         "out of range"),
        (lambda: KeyedJaggedTensor(["a", "b"], v, lengths=torch.tensor([1, 1, 1, 0])).split([1, 2]),
         ValueError, "summing to the number of"),
        (lambda: KeyedJaggedTensor(["a"], v, lengths=torch.tensor([3]))["b"], KeyError, "is not in this"),
        (lambda: JaggedTensor(v, lengths=torch.tensor([2, 2])), ValueError, "lengths sum to 4"),
        (lambda: JaggedTensor(v), ValueError, "pass lengths or offsets"),
        # wrong device: no accelerator here, the meta device stands in for "not where the values are"
        (lambda: KeyedJaggedTensor(["a"], v, lengths=torch.tensor([3], device="meta")), ValueError,
         "lengths are on meta but values on cpu"),
        (lambda: KeyedJaggedTensor(["a"], v.to("meta"), lengths=torch.tensor([3])), ValueError,
         "lengths are on cpu but values on meta"),
        (lambda: KeyedJaggedTensor(["a"], v, lengths=torch.tensor([3]), weights=torch.ones(3, device="meta")),
         ValueError, "weights are on meta"),
        (lambda: KeyedJaggedTensor(["a"], v, offsets=torch.tensor([0, 1]), lengths=torch.tensor([3])),
         ValueError, "offsets [0, 1] do not match lengths [3]"),
        (lambda: KeyedJaggedTensor(["a"], v, offsets=torch.tensor([0, 2])), ValueError,
         "offsets end at 2 but there are 3 values"),
        (lambda: KeyedJaggedTensor(["a"], v, offsets=torch.tensor([[0, 3]])), ValueError, "must be 1-D"),
        (lambda: KeyedJaggedTensor(["a"], v, lengths=torch.tensor([3]), weights=torch.ones(3, dtype=torch.long)),
         TypeError, "weights must have a floating-point dtype, got torch.int64"),
        (lambda: KeyedJaggedTensor("ab", v, lengths=torch.tensor([1, 2])), TypeError, "list of feature names"),
        (lambda: KeyedJaggedTensor(["a", "b"], v, lengths=torch.tensor([1, 2])).permute([0, 0]), ValueError,
         "keys must be unique"),
        (lambda: KeyedJaggedTensor(["a", "b"], v, lengths=torch.tensor([1, 2])).split([3, -1]), ValueError,
         "must be non-negative ints"),
        (lambda: KeyedJaggedTensor.from_jt_dict({"a": JaggedTensor(v, lengths=torch.tensor([3])),
                                                 "b": JaggedTensor(v, lengths=torch.tensor([1, 2]))}),
         ValueError, "batch sizes differ per key"),
    ]


# ---- reshard / propose_rebalance -----------------------------------------------------------------
def _reshard(s, changes, **kw):
    from shardwise.embedding.reshard import reshard

    return lambda: reshard(s, changes, **kw)


def reshard_changes_not_a_dict(rank, world):
    s = _sharded()
    _train_one_step(s)
    return _reshard(s, [("ta", table_wise(0))]), _state(s)


def reshard_unknown_table(rank, world):
    s = _sharded()
    _train_one_step(s)
    return _reshard(s, {"tz": table_wise(0)}), _state(s)


def reshard_entry_wrong_type(rank, world):
    s = _sharded()
    _train_one_step(s)
    return _reshard(s, {"ta": "row_wise"}), _state(s)


def reshard_rank_outside_world(rank, world):
    s = _sharded()
    _train_one_step(s)
    return _reshard(s, {"ta": table_wise(world)}), _state(s)


def reshard_changes_differ_one_rank(rank, world):
    s = _sharded()
    _train_one_step(s)
    target = table_wise(1) if rank == world - 1 else table_wise(0)
    return _reshard(s, {"ta": target}), _state(s)


def reshard_over_memory_limit(rank, world):
    s = _sharded()
    _train_one_step(s)
    return _reshard(s, {"ta": table_wise(0), "tb": table_wise(0)}, max_bytes_per_rank=64), _state(s)


def reshard_rowwise_adagrad_to_columns(rank, world):
    s = shard(_ebc(), _plan(), optimizer=RowWiseAdagrad)
    _train_one_step(s)
    return _reshard(s, {"ta": column_wise([0, 1])}), _state(s)


def rebalance_bad_stats(rank, world):
    from shardwise.embedding.reshard import propose_rebalance

    return lambda: propose_rebalance({"ta": 3}, 1 << 20), []


def rebalance_negative_budget(rank, world):
    from shardwise.embedding.reshard import load_stats, propose_rebalance

    s = _sharded()
    _train_one_step(s)
    stats = load_stats(s)
    return lambda: propose_rebalance(stats, -1), _state(s)
