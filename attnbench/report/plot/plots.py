"""The figures: one function per figure, each drawing what the analysis derived for it
(analyse/figure_data.py) and returning a matplotlib Figure (the shared layout and line
drawing: layout.py)."""

from __future__ import annotations

import textwrap

import numpy as np
from matplotlib.ticker import FuncFormatter

from attnbench.report.analyse.figure_data import Ringed, Roofline, SpeedSeries, SupportGrid
from attnbench.report.analyse.figure_lines import LineFigure, Panel
from attnbench.report.plot import layout
from attnbench.report.plot.layout import plt, save_figure  # noqa: F401
from attnbench.report.plot.style import impl_style, run_colors  # noqa: F401

# the support matrix's family names: wrapped at this many characters (a 1.7 in column at
# 8 pt), each line this many inches tall
FAMILY_CHARS, FAMILY_LINE_IN = 24, 0.14


# ---------------------------------------------------------------- the figures


def plot_time_vs_seq(data: LineFigure, *, colors: dict | None = None):
    """Median time per call vs N, log-log, p20–p80 band, fitted slope in the legend."""
    return layout.line_figure(data, ylabel="time (ms, log)", colors=colors)


def plot_memory_vs_seq(data: LineFigure, *, colors: dict | None = None):
    """Peak memory above the inputs vs N, log-log, fitted slope in the legend."""
    return layout.line_figure(
        data, ylabel="peak memory (MiB, log)", colors=colors, draw_extra=_growth_guides
    )


def _growth_guides(ax, panel: Panel) -> None:
    """Grey guide lines growing like N and like N² (figure_data.Guides), so that a reader
    sees which impls hold an N² buffer."""
    guides = panel.extra
    if guides is None:
        return
    n = np.geomspace(guides.n0, guides.n1, 16)
    for power, style, label in ((1, ":", "O(N) guide"), (2, "-.", "O(N²) guide")):
        ax.plot(
            n, guides.y0 * (n / guides.n0) ** power, color="grey", ls=style, lw=1.0, label=label
        )


def plot_bandwidth_vs_seq(data: LineFigure, *, colors: dict | None = None):
    """Achieved GB/s of decode rows vs the cache length, under the device's HBM: its
    published peak and the run's measured copy speed (figure_data.Roofs)."""

    def roofs(ax, panel: Panel):
        r = panel.extra
        if r.published_gb_s is not None:
            ax.axhline(r.published_gb_s, color="black", ls="--", lw=1.0, label="HBM, published")
        if r.copy_gb_s:
            ax.axhline(r.copy_gb_s, color="grey", ls=":", lw=1.0, label="copy, measured")
        roof = max(r.copy_gb_s or 0.0, r.published_gb_s or 0.0)
        ax.set_ylim(0, max(ax.get_ylim()[1], 1.05 * roof))  # the roofs in view on every panel

    return layout.line_figure(
        data, ylabel="GB/s", logy=False, y_from_zero=True, colors=colors, draw_extra=roofs
    )


def plot_tflops_vs_seq(data: LineFigure, *, colors: dict | None = None):
    """Achieved TFLOP/s (unmasked matmul FLOPs / median time) vs N."""
    return layout.line_figure(data, ylabel="TFLOP/s", logy=False, y_from_zero=True, colors=colors)


def plot_speedup_vs_seq(data: LineFigure, baseline: str, *, colors: dict | None = None):
    """baseline time / impl time vs N; above 1 is faster than the baseline; ringed: the
    points resting on a caveat."""

    def reference(ax, panel: Panel):
        ax.axhline(1.0, color="black", lw=1.2, ls="--", label=f"{baseline} (baseline)")
        _ring(ax, panel.extra, "0.35", s=110, linewidths=1.3)

    fig = layout.line_figure(
        data, ylabel=f"speedup vs {baseline} (log)", draw_extra=reference, colors=colors
    )
    for ax in fig.axes:
        if ax.get_yscale() == "log":
            layout.ratio_axis(ax, "x")
    return fig


def _ring(ax, ringed: Ringed | None, colour, **kw) -> None:
    if ringed is not None:
        ax.scatter(
            ringed.x,
            ringed.y,
            facecolors="none",
            edgecolors=colour,
            zorder=5,
            label=ringed.label,
            **kw,
        )


def plot_error_vs_seq(data: LineFigure, *, colors: dict | None = None):
    """rel_err vs N against the agreement bound (err_bound) each row was held to."""
    style = impl_style(data.impls, colors)

    def bounds(ax, panel: Panel):
        b = panel.extra
        if b is not None and b.shared is not None:
            x, bound = b.shared
            ax.plot(x, bound, color="black", ls="--", lw=1.2, label="agreement bound (err_bound)")
        elif b is not None:
            for impl, x, bound in b.per_impl:
                ax.plot(x, bound, color=style[impl][0], ls="--", lw=1.1)
            ax.plot(
                [], [], color="grey", ls="--", lw=1.1, label="dashed: each impl's agreement bound"
            )
        _readable_log_y(ax)

    return layout.line_figure(data, ylabel="relative error (log)", draw_extra=bounds, colors=colors)


def _readable_log_y(ax) -> None:
    """Log y ticks as 4e-07 on every panel (one format per figure); on a panel spanning under
    a decade, the minor ticks are labelled too."""
    ax.autoscale_view()
    lo, hi = ax.get_ylim()
    fmt = FuncFormatter(lambda v, _: f"{v:.0e}")
    ax.yaxis.set_major_formatter(fmt)
    if lo > 0 and hi / lo < 10:
        ax.yaxis.set_minor_formatter(fmt)


def plot_support_matrix(grid: SupportGrid):
    """impl x case family: colour = share of ok rows, text = counts per status."""
    if grid.share.empty:
        return layout.empty_figure(grid.title, "no rows")
    share, text = grid.share, grid.text
    impls, families = list(share.index), list(share.columns)
    # family names (model, phase, mask, modifier...) wrapped to a column's width, the figure
    # as tall as the most lines: tight_layout then has room for them (a long name rotated
    # would need more margin than the figure has, and leave it as it was, overlapping)
    names = [textwrap.fill(f, FAMILY_CHARS) for f in families]
    lines = max(name.count("\n") + 1 for name in names)
    fig, ax = plt.subplots(
        figsize=(
            max(5.0, 1.7 * len(families) + 2.5),
            max(2.6, 0.75 * len(impls) + 1.6) + FAMILY_LINE_IN * lines,
        )
    )
    ax.set_facecolor("#d9d9d9")  # NaN cells (nothing ran) show the axes background
    # a heatmap: one cell per (impl, family), the first impl on top, no spines
    mesh = ax.pcolormesh(
        np.ma.masked_invalid(share.to_numpy(dtype=float)),
        cmap="RdYlGn",
        vmin=0,
        vmax=1,
        linewidths=0.5,
        edgecolor="white",
    )
    ax.set(xlim=(0, len(families)), ylim=(0, len(impls)))
    ax.invert_yaxis()
    ax.spines[:].set_visible(False)
    fig.colorbar(mesh, ax=ax, label="share ok (of rows that ran)").outline.set_linewidth(0)
    ax.set_xticks(np.arange(len(families)) + 0.5)
    ax.set_yticks(np.arange(len(impls)) + 0.5, impls, va="center")
    # every cell's counts, the empty (NaN) ones too
    for i, impl in enumerate(impls):
        for j, fam in enumerate(families):
            v = share.loc[impl, fam]
            dark = not np.isnan(v) and (v < 0.2 or v > 0.8)
            ax.text(
                j + 0.5,
                i + 0.5,
                text.loc[impl, fam],
                ha="center",
                va="center",
                fontsize=8,
                color="white" if dark else "black",
            )
    ax.set_xlabel("case family")
    ax.set_ylabel("impl")
    ax.set_xticklabels(names, rotation=0, fontsize=8)
    ax.tick_params(axis="y", labelrotation=0)
    fig.suptitle(grid.title, fontsize=11)
    fig.tight_layout()
    return fig


def plot_ratio_vs_seq(
    data: LineFigure, *, fail_above_pct: float | None = None, colors: dict | None = None
):
    """compare.compare_runs output (figure_data.ratio_lines): time_B / time_A vs N per impl;
    above 1 is slower in B; ringed: the ratios over the gate."""

    def lines(ax, panel: Panel):
        ax.axhline(1.0, color="black", lw=1.2, ls="--", label="no change")
        if fail_above_pct is not None:
            gate = 1 + fail_above_pct / 100
            ax.axhline(gate, color="red", lw=1.0, ls=":", label=f"gate: +{fail_above_pct:g}%")
            _ring(ax, panel.extra, "red", s=120, linewidths=1.5)

    fig = layout.line_figure(data, ylabel="time_B / time_A (log)", draw_extra=lines, colors=colors)
    for ax in fig.axes:
        if ax.get_yscale() == "log":
            layout.ratio_axis(ax)
    return fig


def plot_roofline(data: Roofline, *, colors: dict | None = None):
    """Achieved TFLOP/s vs arithmetic intensity (FLOPs per byte of the least traffic), with
    the run's measured ceilings: the matmul rate of each dtype and the copy bandwidth."""
    if data.empty:
        return layout.empty_figure(data.title, data.empty)
    fig, axes = layout.grid(1, data.title)
    ax = axes[0]
    style = impl_style(data.impls, colors)
    for impl, mode, intensity, tflops in data.points:  # forward filled, backward hollow
        colour, marker = style[impl]
        ax.scatter(
            intensity,
            tflops,
            facecolors=colour if mode == "fwd" else "none",
            edgecolors=colour,
            marker=marker,
            label=f"{impl} {mode}",
            s=28,
            alpha=0.85,
        )
    x = np.geomspace(*data.x_range, 200)
    bandwidth_tb_s = data.copy_gb_s / 1e3
    copy = f" · copy {data.copy_gb_s:.3g} GB/s" if bandwidth_tb_s else ""
    for i, dtype, peak in data.roofs:
        roof = np.minimum(peak, bandwidth_tb_s * x) if bandwidth_tb_s else np.full_like(x, peak)
        ax.plot(
            x,
            roof,
            color="black",
            lw=1,
            ls=("--", ":", "-.")[i % 3],
            label=f"roof {dtype}: matmul {peak:.3g} TFLOP/s{copy}",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(
        FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "25" else "")
    )
    ax.set_xlabel("arithmetic intensity, FLOP per byte moved (each tensor once: docs/method.md)")
    ax.set_ylabel("TFLOP/s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    layout.log_ticks_in_view(ax)
    return fig


def plot_speed_over_time(series: tuple[SpeedSeries, ...], *, device_name: str | None = None):
    """The machine's speed over the run (figure_data.speed_series): each anchor time as a
    speed relative to the run's first case, compute (matmul) and memory (copy), against the
    seconds since the run's start, with a running median."""
    title = "Machine speed over the run (speed anchor, relative to the first case)"
    title += f"\n{device_name}" if device_name else ""
    if not series:
        return layout.empty_figure(title, "no anchor times")
    fig, axes = layout.grid(1, title)
    ax = axes[0]
    colours = {"compute": "tab:blue", "memory": "tab:orange"}
    what = {"compute": "compute (matmul)", "memory": "memory (copy)"}
    for s in series:
        colour = colours.get(s.resource, "tab:grey")
        ax.scatter(s.t_s, s.speed, s=8, color=colour, alpha=0.35, lw=0)
        label = f"{what.get(s.resource, s.resource)}: {s.low:.2f}–{s.high:.2f}"
        ax.plot(s.t_s, s.running, color=colour, lw=1.8, label=label)
    ax.axhline(1.0, color="black", lw=1.0, ls="--", label="speed at the first case")
    ax.set_xlabel("time since the run started (s)")
    # log: speeds span 0.5x to hundreds of x when the first case ran on a cold machine, and a
    # linear axis flattens every dip below the largest value into one line
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.set_ylabel("speed (first case = 1, log)")
    ax.grid(True, alpha=0.4)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    layout.log_ticks_in_view(ax)
    return fig
