"""The ranks' agreement check costs no collective of its own after the first step (compile/agreement.py)."""
from __future__ import annotations

import pytest
import torch

from shardwise.testing.harness import run_on_ranks
from tests.compile import agreement_cases


@pytest.mark.parametrize("style", ["replicate", "fully_shard"])
def test_a_step_runs_only_its_graphs_collectives_and_still_catches_disagreement(style):
    res = run_on_ranks(agreement_cases.steady_state_collectives, 2, style)
    for r in res:
        assert r["per_step"] == r["in_graph"], r       # no check collective beside the graph's own
        assert sum(r["carriers"]) == 1, r              # exactly one gradient bucket carries the bits
        assert r["err"] is not None and "ranks disagree on the lr (rank 0: [0.02]; rank 1: [0.01])" in r["err"], r
    assert res[0]["err"] == res[1]["err"]


def test_low_precision_gradients_send_the_bits_alone():
    # bfloat16 sums of 0/1 values stop being exact past 256 ranks: the bits travel in float32, alone
    for r in run_on_ranks(agreement_cases.steady_state_collectives, 2, "replicate", torch.bfloat16):
        assert r["per_step"] == r["in_graph"] and sum(r["carriers"]) == 1, r
        assert r["err"] is not None and "ranks disagree on the lr" in r["err"], r


@pytest.mark.parametrize("transform", [False, True])
def test_a_transformation_gets_a_graph_torch_compile_can_take(transform):
    # default: in-place bucket all-reduce into kept buffers, one fused Adam kernel per bucket; with a
    # gm_transformation (e.g. torch.compile, which cannot functionalize those): none of them
    for r in run_on_ranks(agreement_cases.steady_state_collectives, 2, "replicate", torch.float32, transform):
        assert r["in_place_collective"] is not transform and r["fused"] is not transform, r
        assert (r["kept_buffers"] > 0) is not transform, r
        assert r["per_step"] == r["in_graph"] and "ranks disagree on the lr" in r["err"], r
