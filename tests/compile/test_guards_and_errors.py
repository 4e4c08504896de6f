"""Re-tracing guards, learning-rate schedules and error messages of the compiled step."""
from __future__ import annotations

import pytest

from shardwise.testing.harness import run_on_ranks
from tests.compile import guard_cases


@pytest.mark.parametrize("style", ["replicate", "fully_shard"])
def test_guards_and_scheduler(style):
    for log in run_on_ranks(guard_cases.guards, 2, style):
        traces = [t for t, _ in log]
        # 3 scheduled-lr steps share a trace; shape and betas changes re-trace; a seen key is cached
        assert traces == [1, 1, 1, 2, 3, 3], traces
        assert max(d for _, d in log) < 1e-5, log


def test_dtype_change_retraces_and_transformation_runs_per_trace():
    assert run_on_ranks(guard_cases.dtype_guard, 2) == [(2, 2, True)] * 2


def test_trace_cache_is_bounded_and_warns():
    for traces, cached, msgs, diff in run_on_ranks(guard_cases.trace_cap, 2):
        assert traces == [1, 2, 3, 3, 4, 5], traces
        assert cached == 2 and diff < 1e-5
        assert len(msgs) == 1 and "has traced 3 times" in msgs[0] and "Pad batches" in msgs[0], msgs


def test_errors_are_clear_and_identical_on_all_ranks():
    per_rank = run_on_ranks(guard_cases.errors, 2)
    assert per_rank[0] == per_rank[1]
    out = per_rank[0]
    expect = {
        "no_module": ("TypeError", "torch.nn.Module"),
        "no_optimizer": ("TypeError", "torch.optim.Optimizer"),
        "indivisible_batch": ("ValueError", "not divisible"),
        "unsupported_optimizer": ("TypeError", "RMSprop"),
        "amsgrad": ("ValueError", "amsgrad"),
        "no_backward": ("ValueError", "backward"),
        "bad_style": ("ValueError", "zero3"),
        "bad_input": ("ValueError", "input='sliced' is not one of ('local', 'global')"),
        "two_styles": ("TypeError", "style='replicate' and parallel_style='fully_shard'"),
        "style_twice": ("TypeError", "got style twice"),
        "mesh_twice": ("TypeError", "mesh was given twice"),
        "too_many_positional": ("TypeError", "at most 1 positional argument(s) (style), got 2"),
        "batch_dim_none": ("TypeError", "input_batch_dim=None must be"),
        "two_d_mesh": ("ValueError", "needs a 1-D DeviceMesh"),
        "local_missing_batch_dim": ("ValueError", "no batch dim 0"),
        "local_ranks_differ": ("ValueError", "ranks disagree on the batch"),
    }
    for name, (kind, text) in expect.items():
        assert out[name] is not None, f"{name} did not raise"
        assert out[name][0] == kind and text in out[name][1], (name, out[name])
    assert out["untouched"]


@pytest.mark.parametrize("style", ["replicate", "fully_shard"])
def test_input_gradient_in_step_and_readable_graph(style):
    for r in run_on_ranks(guard_cases.input_grad_and_printing, 2, style):
        # the first step's parameters are identical, so this rank's input gradient matches eager
        assert r["diffs"][0][0] < 1e-6 and r["diffs"][0][1] < 1e-6, r["diffs"]
        header = r["text"].split("class ")[0]
        kinds = ("all_reduce",) if style == "replicate" else ("all_gather", "reduce_scatter")
        assert all(k in header for k in kinds) and "MiB" in header, header


@pytest.mark.parametrize("style", ["replicate", "fully_shard"])
def test_tied_weights(style):
    for r in run_on_ranks(guard_cases.tied_weights, 2, style):
        assert r["tied"] and r["diff"] < 1e-5, r


@pytest.mark.parametrize("style,opt", [("fully_shard", "adam"), ("replicate", "sgd")])
def test_existing_optimizer_state_is_taken_over(style, opt):
    for r in run_on_ranks(guard_cases.resume_from_eager, 2, style, opt):
        assert r["diff"] < 1e-5 and r["traces"] == 1, r


@pytest.mark.parametrize("style", ["replicate", "fully_shard"])
def test_buffers_are_never_sharded(style):
    for r in run_on_ranks(guard_cases.with_buffers, 2, style):
        assert r["plain_full"] and r["params"] < 1e-5 and r["buffers"] < 1e-5, r


@pytest.mark.parametrize("style", ["replicate", "fully_shard"])
def test_compiled_step_raises_no_warnings(style):
    # `shardwise train` used to print torch's FutureWarning for all_gather_into_tensor once per rank
    for caught in run_on_ranks(guard_cases.warnings_of_a_run, 2, style):
        ours = [w for w in caught if "/shardwise/" in w[2] or "deprecated" in w[1]]
        assert not ours, ours


def test_parameters_off_the_mesh_device_are_refused_before_anything_changes(monkeypatch):
    import types

    import torch

    from shardwise.compile.state import _check_devices

    monkeypatch.setenv("LOCAL_RANK", "1")
    mesh = types.SimpleNamespace(device_type="cuda")  # no GPU here: the check only reads the mesh's device type
    with pytest.raises(ValueError, match=r"parameter 'w' is on cpu but the mesh is a 'cuda' mesh; move the model "
                                         r"to this rank's device first \(model.to\('cuda:1'\)\)"):
        _check_devices({"w": torch.zeros(2)}, mesh)
    _check_devices({"w": torch.zeros(2)}, types.SimpleNamespace(device_type="cpu"))
