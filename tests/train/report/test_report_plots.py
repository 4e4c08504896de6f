"""The run report's plots: written as PNGs without touching the process's matplotlib backend."""

import subprocess
import sys
import textwrap


def test_plots_are_written_without_switching_the_backend_or_importing_pyplot(tmp_path):
    # a fresh interpreter: the check must not depend on what other tests imported
    script = textwrap.dedent(f"""
        import sys
        import matplotlib
        matplotlib.use("svg")     # a user's own choice, which writing a report must leave alone
        from pathlib import Path
        from shardwise.train.report.summary import _plot_load, _plot_loss

        seg = {{"index": 0, "kind": "start", "attempt": 0, "world_size": 2, "first_step": 0, "last_step": 9}}
        m = {{"loss": {{"step": list(range(10)), "value": [1.0 / (s + 1) for s in range(10)]}},
             "auc": {{"step": [4, 9], "train_window": [0.6, None], "eval": 0.7}},
             "segments": [seg, {{**seg, "index": 1, "kind": "resume", "first_step": 5}}],
             "reshards": [{{"step": 5, "status": "done"}}],
             "load_windows": [{{"segment": 0, "per_rank": [3.0, 1.0], "label": "before", "first_step": 0,
                               "last_step": 4, "max_over_mean": 1.5}}]}}
        out = Path({str(tmp_path)!r})
        _plot_loss(out / "loss.png", m)
        _plot_load(out / "load.png", m)
        print(matplotlib.get_backend(), "matplotlib.pyplot" in sys.modules)
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["svg", "False"]
    for name in ("loss.png", "load.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
