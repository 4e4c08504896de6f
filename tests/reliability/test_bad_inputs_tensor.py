"""Bad-input matrix for the DTensor core: placements, constructors, redistribute, ops, embedding lookups.

Each row runs on 2 real gloo ranks; every rank catches its own exception and reports it, and the row
passes only when all ranks raised the same type and message and the module they held is unchanged.
A rank left waiting in a collective shows up as a ``DistributedTestTimeout``.
"""

import pytest

from shardwise.parallel import EmbeddingIndexError
from shardwise.testing import run_on_ranks

from . import _cases_tensor as cases
from ._runner import check_rows, run_case

MOD = cases.__name__
# a row either raises at once or hangs: a short timeout keeps a hanging row cheap
ROW_TIMEOUT = 20.0   # (a fresh worker importing torch on 2 loaded cores can take 10+ s)

ROWS = [
    # (case, exception, message fragment)
    ("dist_shard_dim_out_of_range", ValueError, "dim must be in [-2, 1]"),
    ("dist_too_many_placements", ValueError, "has 2 entries but the mesh has 1 dimension"),
    ("dist_placement_not_a_placement", TypeError, "is not a Placement"),
    ("dist_of_a_dtensor", TypeError, "use .redistribute"),
    ("dist_shard_0d", ValueError, "a 0-d tensor cannot be sharded"),
    ("from_local_of_a_dtensor", TypeError, "plain torch.Tensor"),
    ("from_local_not_a_tensor", TypeError, "plain torch.Tensor, got list"),
    ("from_local_shape_differs_one_rank", ValueError, "rank 1 has (3, 3), expected (2, 3)"),
    ("from_local_ndim_differs_one_rank", ValueError, "ranks disagree on the placements"),
    ("from_local_bad_placement_one_rank", ValueError, "rank 1: S(2) on a 2-D tensor"),
    ("from_local_bad_shape_arg", ValueError, "global shape (7, 3)"),
    ("from_local_dtype_differs_one_rank", ValueError, "ranks disagree on the dtype"),
    ("from_local_placements_differ_one_rank", ValueError, "ranks disagree on the placements"),
    ("redist_no_placements", ValueError, "needs target placements"),
    ("redist_shard_dim_out_of_range", ValueError, "S(3) on a 2-D tensor"),
    ("redist_wrong_count", ValueError, "has 2 entries but the mesh has 1"),
    ("redist_other_mesh", ValueError, "cannot move a DTensor to another mesh"),
    ("op_shape_mismatch", RuntimeError, "same reduction dim"),
    ("op_meshes_differ", ValueError, "different meshes"),
    ("embed_id_too_large_one_rank", EmbeddingIndexError, "id 10 is out of range"),
    ("embed_negative_id_one_rank", EmbeddingIndexError, "id -1 is out of range"),
    ("embed_float_ids", RuntimeError, "indices"),
]

RANK_MISMATCHES = [
    # rank-local layouts that differ are caught by distribute_tensor's metadata all-gather
    ("dist_shape_differs_one_rank", ValueError, "ranks disagree on the shape"),
    ("dist_dtype_differs_one_rank", ValueError, "ranks disagree on the dtype"),
    ("dist_placements_differ_one_rank", ValueError, "ranks disagree on the placements"),
    # checked mode (shardwise.tensor.rank_checks): ranks compare their requests before moving data
    ("redist_targets_differ_one_rank", ValueError, "rank 1: (S(0)) -> (S(1))"),
    ("redist_target_invalid_one_rank", ValueError, "rank 1: (S(0)) -> an invalid call (S(3) on a 2-D tensor"),
    ("redist_noop_differs_one_rank", ValueError, "ranks disagree (rank 0: (S(0)) -> (R)"),
]


@pytest.mark.parametrize("case, exc, fragment", ROWS + RANK_MISMATCHES)
def test_bad_input_fails_identically_on_every_rank(case, exc, fragment):
    results = run_on_ranks(run_case, 2, MOD, case, timeout=ROW_TIMEOUT)
    check_rows(results, exc, fragment)


@pytest.mark.parametrize("make, exc, fragment", cases.placement_bad_values())
def test_placement_values_reject_bad_fields(make, exc, fragment):
    with pytest.raises(exc, match=fragment):
        make()
