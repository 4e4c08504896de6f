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


def test_the_loss_plot_keeps_its_legend_and_labels_off_the_data():
    from shardwise.train.report.summary import _loss_figure

    seg = {"index": 0, "kind": "start", "attempt": 0, "world_size": 2, "first_step": 0, "last_step": 40}
    loss = [1.0 / s for s in range(1, 41)]
    loss[18] = 50.0   # the drift's first step: a spike that would flatten the rest of the curve
    m = {"loss": {"step": list(range(1, 41)), "value": loss},
         "auc": {"step": [10, 20, 30, 40], "train_window": [0.6, 0.7, 0.72, 0.75], "eval": 0.74},
         "eval_data": "held-out synthetic examples",
         # a resume and a reshard at the same step, a drift just before: their labels must not overlap
         "segments": [seg, {**seg, "index": 1, "kind": "resume", "first_step": 20}],
         "reshards": [{"step": 20, "status": "applied"}],
         "load_windows": [{"segment": 0, "label": "before the drift", "first_step": 0, "last_step": 18}]}
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = _loss_figure(m)
    canvas = FigureCanvasAgg(fig)   # the Agg canvas savefig uses, attached to this figure only
    canvas.draw()
    renderer = canvas.get_renderer()
    ax = fig.axes[0]
    axes_box = ax.get_window_extent(renderer)
    legend_box = fig.legends[0].get_window_extent(renderer)
    assert legend_box.y1 <= axes_box.y0, (legend_box, axes_box)      # below the plot, not on the curves
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "eval AUC 0.740 (held-out synthetic examples)" in labels
    assert any(lbl.startswith("drift (--drift-at), step 18") for lbl in labels)
    # the eval AUC is a point at the last step (not only a number in the title)
    star = [line for line in fig.axes[1].lines if line.get_marker() == "*"]
    assert len(star) == 1 and list(star[0].get_xdata()) == [40] and list(star[0].get_ydata()) == [0.74]
    assert ax.get_ylim()[1] < 5 and "peak 50.00" in ax.get_ylabel()
    boxes = [t.get_window_extent(renderer) for t in ax.texts]
    assert len(boxes) == 3 and not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
