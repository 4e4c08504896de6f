"""State dicts of sharded collections: round trips, cross-plan loads, optimizer state, DCP."""

from shardwise.testing import run_on_ranks

from . import workers


def test_state_dict_and_dcp_round_trip(tmp_path):
    results = run_on_ranks(workers.state_round_trip, 2, str(tmp_path), timeout=300.0)
    for rank, errs in enumerate(results):
        assert len(errs) == 5 * 7
        for key, err in errs.items():
            if key[1] == "moved":
                assert err < -1e-3, f"rank {rank} {key}: weights did not train, the check would be vacuous"
            else:
                assert err == 0.0, f"rank {rank} {key}: {err}"


def test_row_wise_reduce_scatter_path():
    # The reduce-scatter output dist (NCCL's path) forced on gloo: same forward and training.
    for world in (2, 3):
        for fwd_err, train_err in run_on_ranks(workers.reduce_scatter_path, world):
            assert fwd_err < 1e-5 and train_err < 1e-5


def test_dtensor_layouts_in_state_dict():
    # Replicate / Shard(0) (uneven, an empty shard at world 4) / Shard(1) tables become our DTensor
    for world in (2, 4):
        for kinds, err, err2 in run_on_ranks(workers.dtensor_state_dict, world):
            assert set(kinds.values()) == {"DTensor"}, kinds
            assert err == 0.0 and err2 == 0.0
