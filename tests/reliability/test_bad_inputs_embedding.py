"""Bad-input matrix for sparse batches, shard(), the sharded forward, state dicts/DCP, reshard and the
planner.

Distributed rows run on 2 gloo ranks; every rank catches and reports its exception and the row passes
only when all ranks raised the same type and message and the shards, the fused optimizer state and
any checkpoint folder hash the same as before the call.
"""


import pytest
import torch
from torch.distributed.checkpoint.api import CheckpointException

from shardwise.embedding import EmbeddingBagConfig, GreedyShardingPlanner, row_wise, table_wise
from shardwise.embedding.plan import column_wise
from shardwise.testing import run_on_ranks

from . import _cases_embedding as cases
from ._runner import check_rows, run_case

MOD = cases.__name__
# one-rank rows run on a 3 s group timeout (_runner.short_timeout_mesh): a hang fails well inside this
ROW_TIMEOUT = 20.0   # and a fresh worker importing torch on 2 loaded cores can take 10+ s

ROWS = [
    ("shard_not_an_ebc", TypeError, "expects an EmbeddingBagCollection"),
    ("shard_plan_missing_table", ValueError, "missing ['tb']"),
    ("shard_plan_entry_wrong_type", TypeError, "must be a ParameterSharding"),
    ("shard_rank_outside_world", ValueError, "table_wise names rank 2 but the mesh has 2 ranks"),
    ("shard_column_ranks_outside_world", ValueError, "column_wise names rank 2"),
    ("shard_unsupported_optimizer", ValueError, "RMSprop cannot be fused"),
    ("shard_sgd_momentum", ValueError, "momentum=0.9"),
    ("shard_rowwise_adagrad_on_columns", ValueError, "column-wise tables ['ta']"),
    ("shard_plan_differs_one_rank", ValueError, "shard(): ranks [1] were given other tables, another plan or another mesh"),
    ("shard_mesh_differs_one_rank", ValueError, "shard(): ranks [1] were given other tables, another plan or another mesh"),
    ("shard_tables_differ_one_rank", ValueError, "shard(): ranks [1] were given other tables, another plan or another mesh"),
    # the forward reports every rank's batch problem as one ValueError on all ranks (docs/embedding.md)
    ("forward_unknown_feature", ValueError, "features ['fz'] are not looked up"),
    ("forward_not_a_kjt", ValueError, "rank 0: TypeError: forward expects a KeyedJaggedTensor"),
    ("forward_unknown_feature_one_rank", ValueError, "rank(s) [1] is invalid"),
    ("forward_missing_weights_one_rank", ValueError, "rank 1: ValueError: this collection is weighted"),
    ("forward_unexpected_weights_one_rank", ValueError, "rank 1: ValueError: this collection is not weighted"),
    ("forward_id_too_large_one_rank", ValueError, "rank 1: ValueError: id 10 of feature 'fa' is outside"),
    ("forward_negative_id_one_rank", ValueError, "rank 1: ValueError: id -2 of feature 'fa' is outside"),
    ("forward_float_ids_one_rank", ValueError, "rank 1: TypeError: ids of features ['fa', 'fb'] have dtype torch.float32"),
    ("load_missing_key", ValueError, "missing keys ['embedding_bags.tb.weight']"),
    ("load_wrong_shape_second_table", ValueError, "shape (8, 4) does not match the table's (7, 4)"),
    ("optim_load_steps_differ", ValueError, "different steps per table [1, 5]"),
    ("dcp_load_into_other_tables", CheckpointException, "Size mismatch"),
    ("reshard_changes_not_a_dict", TypeError, "changes must be a dict"),
    ("reshard_unknown_table", ValueError, "unknown tables ['tz']"),
    ("reshard_entry_wrong_type", TypeError, "must be a ParameterSharding"),
    ("reshard_rank_outside_world", ValueError, "table_wise names rank 2"),
    ("reshard_changes_differ_one_rank", ValueError, "changes differ across ranks (ranks [1]"),
    ("reshard_over_memory_limit", ValueError, "over max_bytes_per_rank=64"),
    ("reshard_rowwise_adagrad_to_columns", ValueError, "column-wise tables ['ta']"),
    ("rebalance_bad_stats", TypeError, "must be a LoadStats"),
    ("rebalance_negative_budget", ValueError, "max_bytes=-1"),
    ("load_value_not_a_tensor", TypeError, "embedding_bags.ta.weight: a list is not a tensor"),
]

@pytest.mark.parametrize("case, exc, fragment", ROWS)
def test_bad_input_fails_identically_on_every_rank(case, exc, fragment):
    results = run_on_ranks(run_case, 2, MOD, case, timeout=ROW_TIMEOUT)
    check_rows(results, exc, fragment)


@pytest.mark.parametrize("make, exc, fragment", cases.kjt_bad_values())
def test_sparse_constructors_reject_malformed_batches(make, exc, fragment):
    with pytest.raises(exc, match=None) as e:
        make()
    assert fragment.lower() in str(e.value).lower()


_TABLES = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=1000 * (i + 1), embedding_dim=8, feature_names=[f"f{i}"]) for i in range(3)]


@pytest.mark.parametrize("make, exc, fragment", [
    (lambda: GreedyShardingPlanner(0, 2**20), ValueError, "world_size=0"),
    (lambda: GreedyShardingPlanner(2, -1), ValueError, "memory_per_rank_bytes"),
    (lambda: GreedyShardingPlanner(2, [2**20]), ValueError, "one per rank (2)"),
    (lambda: GreedyShardingPlanner(2, 2**20, optimizer="lion"), ValueError, "unknown to the planner"),
    (lambda: GreedyShardingPlanner(2, 1000).plan(_TABLES), ValueError, "t2"),
    (lambda: GreedyShardingPlanner(2, 2**20).plan([]), ValueError, "at least one"),
    (lambda: GreedyShardingPlanner(2, 2**20).plan(["t0"]), TypeError, "EmbeddingBagConfig"),
    (lambda: GreedyShardingPlanner(2, 2**20).estimate({"t0": row_wise()}, _TABLES), ValueError,
     "missing ['t1', 't2']"),
    (lambda: GreedyShardingPlanner(2, 2**20).estimate(
        {"t0": table_wise(2), "t1": row_wise(), "t2": row_wise()}, _TABLES), ValueError, "outside world_size 2"),
    (lambda: GreedyShardingPlanner(2, 2**20).estimate(
        {"t0": "rw", "t1": row_wise(), "t2": row_wise()}, _TABLES), TypeError, "ParameterSharding"),
    (lambda: column_wise([0, 0]), ValueError, "repeat a rank"),
    (lambda: table_wise(-1), ValueError, "non-negative int"),
    (lambda: EmbeddingBagConfig(name="t.x", num_embeddings=10, embedding_dim=4, feature_names=["f"]), ValueError, "without '.'"),
    (lambda: EmbeddingBagConfig(name="t", num_embeddings=0, embedding_dim=4, feature_names=["f"]), ValueError, "positive int"),
    (lambda: EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=4, feature_names=["f"], pooling="max"), ValueError, "not supported"),
])
def test_planner_and_plan_helpers_reject_bad_input(make, exc, fragment):
    with pytest.raises(exc) as e:
        make()
    assert fragment in str(e.value)


def _plan_on_rank(rank, world):
    tables = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=500 * (i % 4 + 1), embedding_dim=8 * (i % 3 + 1), feature_names=[f"f{i}"]) for i in range(12)]
    plan = GreedyShardingPlanner(world, 2**22, batch_size_per_rank=64).plan(tables)
    return {name: repr(ps) for name, ps in plan.items()}


def test_planner_gives_every_rank_the_same_plan():
    # workers run with different PYTHONHASHSEEDs: a plan that depends on set/dict hashing order
    # would differ here and every later collective would mismatch
    plans = run_on_ranks(_plan_on_rank, 2)
    assert plans[0] == plans[1]
    assert len(plans[0]) == 12


def test_float_ids_are_rejected_by_the_lookup_not_the_kjt():
    # a KeyedJaggedTensor holds values of any dtype, as TorchRec's; the collection's forward refuses
    # non-integer ids with a TypeError naming the dtype and the fix
    from shardwise.sparse import KeyedJaggedTensor

    kjt = KeyedJaggedTensor(["fa"], torch.tensor([1.0, 2.0]), lengths=torch.tensor([2]))
    assert kjt.values().dtype == torch.float32 and kjt["fa"].values().tolist() == [1.0, 2.0]
    with pytest.raises(TypeError, match=r"dtype torch.float32, but a lookup needs integer ids; cast .* \.long\(\)"):
        cases._ebc()(kjt)
