"""The figures' shared promises: one colour per impl in every figure, '(same as X)' only on
lines that are the same, one tick format per figure, titles without missing values."""

import re

import matplotlib.colors as mcolors
import numpy as np
import pandas as pd
from synth import env, ok_row, smoke_rows

from attnbench.case import Case
from attnbench.report.analyse import figure_data as data
from attnbench.report.decide.verdicts import speedups
from attnbench.report.plot import plots

SEQS = (64, 128, 256, 512)


def _with_plugin(rows):
    """The synthetic smoke rows plus an impl that declares no colour (a user's plugin)."""
    extra = [dict(r, impl="zz_mine") for r in rows if r["impl"] == "tiled"]
    return pd.DataFrame(rows + extra)


def _colours(fig) -> dict[str, str]:
    """impl -> the colour of its line, from every panel of a figure."""
    out = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            label = line.get_label()
            if label.startswith("_") or not line.get_marker() or line.get_marker() == "None":
                continue
            impl = label.split()[0]
            colour = mcolors.to_hex(line.get_color())
            assert out.setdefault(impl, colour) == colour, (impl, label)
    return out


def test_every_figure_colours_an_impl_alike(tmp_path):
    df = _with_plugin(smoke_rows("c", seqs=SEQS))
    run_env = env()
    run_env["impls"] = {
        "naive": {"color": "#1f77b4"},
        "sdpa": {"color": "#ff7f0e", "baseline": True},
        "tiled": {"color": "#d62728"},
        "zz_mine": {"color": None},
    }
    colors = plots.run_colors(run_env)  # env.json names every impl of the run
    figures = {
        "time": plots.plot_time_vs_seq(data.time_lines(df), colors=colors),
        "speedup": plots.plot_speedup_vs_seq(  # sdpa left out
            data.speedup_lines(speedups(df, "sdpa"), "sdpa"), "sdpa", colors=colors
        ),
        "error": plots.plot_error_vs_seq(data.error_lines(df), colors=colors),
        "tflops": plots.plot_tflops_vs_seq(data.tflops_lines(df), colors=colors),
    }
    seen = {name: _colours(fig) for name, fig in figures.items()}
    for fig in figures.values():
        plots.plt.close(fig)
    assert seen["error"]["naive"] == "#1f77b4" and seen["error"]["tiled"] == "#d62728"
    for impl in ("naive", "tiled", "zz_mine"):
        assert len({s[impl] for s in seen.values()}) == 1, (impl, seen)


def test_compare_figure_uses_the_runs_colours(tmp_path):
    from attnbench.report.compare.compare import write_compare

    rows = smoke_rows("a", seqs=SEQS)
    run_env = env()
    run_env["impls"] = {"naive": {"color": "#123456"}, "sdpa": {"color": "#ff7f0e"}}
    df = pd.DataFrame(rows)
    captured = {}
    original = plots.plot_ratio_vs_seq

    def keep(*args, **kwargs):
        fig = original(*args, **kwargs)
        captured.update(_colours(fig))
        return fig

    plots.plot_ratio_vs_seq = keep
    try:
        write_compare(("a", df, run_env), ("b", df.copy(), run_env), tmp_path / "cmp")
    finally:
        plots.plot_ratio_vs_seq = original
    assert captured["naive"] == "#123456"


def _error_rows(errs: dict[str, float]) -> pd.DataFrame:
    rows = []
    for n in SEQS:
        case = Case(1, 4, 4, n, n, 64, "float32", False, "fwd", "cpu")
        for impl, err in errs.items():
            rows.append(ok_row("e", impl, case, 1.0, 1.0, rel_err=err, bound=1e-5))
    return pd.DataFrame(rows)


def _error_lines(errs: dict[str, float]):
    return data.error_lines(_error_rows(errs))


def _labels(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().texts]


def test_same_as_only_for_lines_that_are_the_same():
    fig = plots.plot_error_vs_seq(_error_lines({"naive": 3.32e-7, "sdpa": 3.37e-7}))
    labels = _labels(fig)
    plots.plt.close(fig)
    assert not [x for x in labels if "same as" in x], labels  # 1.5% apart near 1e-7
    fig = plots.plot_error_vs_seq(_error_lines({"naive": 3.32e-7, "sdpa": 3.32e-7}))
    labels = _labels(fig)
    plots.plt.close(fig)
    assert "sdpa (same as naive)" in labels


def test_every_panel_of_the_error_plot_labels_its_ticks_alike():
    rows = []
    for causal, (lo, hi) in ((False, (3e-7, 4e-7)), (True, (1e-8, 1e-4))):  # < and > a decade
        for n, err in zip(SEQS, np.geomspace(lo, hi, len(SEQS))):
            case = Case(1, 4, 4, n, n, 64, "float32", causal, "fwd", "cpu")
            rows.append(ok_row("t", "naive", case, 1.0, 1.0, rel_err=float(err), bound=1e-3))
    fig = plots.plot_error_vs_seq(data.error_lines(pd.DataFrame(rows)))
    fig.canvas.draw()
    labels = [
        [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
        for ax in fig.axes
        if ax.get_visible()
    ]
    plots.plt.close(fig)
    assert len(labels) == 2 and all(labels), labels
    for panel in labels:
        assert all(re.fullmatch(r"\d(\.\d+)?e[-+]\d+", text) for text in panel), labels


def test_titles_leave_out_values_that_are_missing():
    rows = []
    for n in SEQS:
        case = Case(1, 4, 4, n, n, 64, "float32", False, "fwd", "cpu")
        rows.append({**ok_row("t", "naive", case, 1.0, 1.0), "mask": "padding"})
    df = pd.DataFrame(rows)
    assert df["window"].isna().all()
    fig = plots.plot_time_vs_seq(data.time_lines(df))
    title = fig._suptitle.get_text()
    plots.plt.close(fig)
    assert "mask=padding" in title and "<NA>" not in title and "W=" not in title, title


def test_the_support_matrix_has_room_for_long_family_names():
    """A family named by its model, phase, mask and modifier fits under its column: no
    'Tight layout not applied' (which leaves the title over the heatmap), labels inside."""
    import warnings

    long = dict(model="llama3-8b", phase="prefill", mask="prefix_lm", score_mod="softcap:50")
    df = pd.DataFrame(smoke_rows("c", seqs=SEQS)).assign(**long)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="Tight layout not applied")
        fig = plots.plot_support_matrix(data.support_grid(df))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    labels = [t for t in ax.get_xticklabels() if t.get_text()]
    assert labels and all(
        len(line) <= plots.FAMILY_CHARS for t in labels for line in t.get_text().splitlines()
    )
    assert all(t.get_window_extent(renderer).y0 >= 0 for t in labels)  # inside the figure
    title = fig._suptitle.get_window_extent(renderer)
    assert title.y0 >= ax.get_window_extent(renderer).y1  # the title above the heatmap
    plots.plt.close(fig)


def test_the_analysis_holds_each_figures_points_and_failures():
    """What a figure draws is derived in the analysis (DeviceAnalysis.figures): per panel and
    impl its ok points in N order, its failed rows counted in its legend label; plot/ draws
    only that."""
    from attnbench.report.analysis import analyse_device

    figures = analyse_device(pd.DataFrame(smoke_rows("c", seqs=SEQS)), env()).figures
    assert figures.one_n is None and figures.bandwidth is None  # no decode rows
    naive = [line for p in figures.time.panels if p.title == "fwd · full" for line in p.lines]
    naive = next(line for line in naive if line.impl == "naive")
    assert naive.label.endswith("(1 oom)")  # the largest N ran out of memory
    assert list(naive.x) == [64.0, 128.0, 256.0]  # the ok points only, ascending
    assert {"triton_flash", "xformers"} <= set(figures.time.absent)  # unsupported on CPU
    assert figures.support.share.loc["naive"].between(0, 1).all()


def test_a_report_imports_no_seaborn_or_scipy():
    """Importing the report (and what it draws with) costs no seaborn, whose import pulls in
    scipy.stats: seconds of `attnbench report` on two cores."""
    import subprocess
    import sys

    code = (
        "import sys, attnbench.report.report as r, attnbench.report.plot.plots; "
        "print(sorted(m for m in ('seaborn', 'scipy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
