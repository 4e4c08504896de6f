"""Bad-input matrix for ``shardwise.compile(parallel_mode=DataParallel(...))`` on 2 gloo ranks.

A row passes when every rank raised the same type and message and the model and optimizer state
(DTensors and Adam moments after one good step) hash the same as before the call.
"""

import pytest

from shardwise.testing import run_on_ranks

from . import _cases_compile as cases
from ._runner import check_rows, run_case

MOD = cases.__name__
ROW_TIMEOUT = 30.0   # the rows that train first trace one step (a few seconds on 2 busy cores)

ROWS = [
    ("bad_style", ValueError, "style='zero3' is not one of"),
    ("two_d_mesh", ValueError, "needs a 1-D DeviceMesh"),
    ("negative_batch_dim", TypeError, "input_batch_dim=-1"),
    ("mode_not_a_parallel_mode", TypeError, "must be a shardwise.compile.ParallelMode"),
    ("first_arg_not_a_module", TypeError, "must be the torch.nn.Module, got Adam"),
    ("unsupported_optimizer", TypeError, "unsupported optimizer RMSprop"),
    ("amsgrad_optimizer", ValueError, "amsgrad=True"),
    ("batch_not_divisible", ValueError, "not divisible by the 2 data-parallel ranks"),
    ("batch_missing_dim", ValueError, "no batch dim 0"),
    ("no_backward_in_step", ValueError, "before loss.backward()"),
    ("other_model_after_bind", ValueError, "bound to the model and optimizer of its first call"),
    ("lr_tensor", TypeError, "must be a Python float"),
]

# ranks compare batch layout, lr and optimizer settings on every call (compile/agreement.py: after the first
# step the bits ride in the first gradient bucket; a rank that cannot build its step replays the collectives)
RANK_MISMATCHES = [
    ("batch_size_differs_one_rank", ValueError, "ranks disagree on the batch"),
    ("lr_differs_one_rank", ValueError, "ranks disagree on the lr"),
    ("batch_size_differs_one_rank_fully_shard", ValueError, "ranks disagree on the batch"),
    ("width_differs_one_rank", ValueError, "only some ranks could not build the step (rank 1: RuntimeError"),
    ("batchnorm_batch_differs_one_rank", ValueError, "ranks disagree on the batch"),
]


@pytest.mark.parametrize("case, exc, fragment", ROWS + RANK_MISMATCHES)
def test_bad_input_fails_identically_on_every_rank(case, exc, fragment):
    results = run_on_ranks(run_case, 2, MOD, case, timeout=ROW_TIMEOUT)
    check_rows(results, exc, fragment)
