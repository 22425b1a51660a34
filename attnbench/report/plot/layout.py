"""The figures' shared layout: the panel grid, titles, axes, and the line figure every
"metric vs N" plot is drawn with (plots.py), from what the analysis holds for it
(analyse/figure_lines.py: its panels and lines, the rules they follow).

Conventions shared by every figure:
  * only ok rows are drawn as measurements; failed rows are counted in the legend label
    ("naive (1 oom)") so a line that stops early is explained, never drawn as a number;
  * an impl has the same colour and marker in every figure (style.impl_style);
  * panels are facets of mode x causal and of whatever else varies besides the lengths;
    the suptitle names the device, the dtype and everything held fixed;
  * the x axis is the length N the series varies (seq_q, or the cache length seq_kv in a
    decode series) on a log2 scale with the swept lengths as ticks.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import (  # noqa: E402
    FixedLocator,
    FuncFormatter,
    Locator,
    LogLocator,
    NullFormatter,
    NullLocator,
)

from attnbench.measure.flags import NOISY_SPREAD  # noqa: E402
from attnbench.report.analyse.figure_lines import Line, LineFigure  # noqa: E402
from attnbench.report.plot.style import impl_style  # noqa: E402

PANEL_W_IN, PANEL_H_IN = 7.4, 3.9  # width includes the legend beside the axes
# a panel's slot, in inches: the y axis' labels left of the axes, the legend right of them,
# the panel's title above and the x axis' labels below; the figure's title over all panels.
# Placed once (no layout engine: each of its passes drew the whole figure again)
LEFT_IN, LEGEND_IN, ABOVE_IN, BELOW_IN, SUPTITLE_IN = 0.85, 3.0, 0.4, 0.85, 0.9
LEGEND_CHARS = 46  # a legend label wraps here, so it fits LEGEND_IN at its font size
DPI = 130
# zlib's level for the PNGs: 3 encodes a report's figures in 60% of the default's (6) time,
# for files 9% larger (the same pixels)
PNG_LEVEL = 3
MAX_COLS = 2  # panels are wide: the legend sits beside each one
LOG_SPAN = 2.0  # a log y axis only where a panel's values span this factor (64–65 MiB: linear)


def save_figure(fig, stem: Path, svg: bool = False, crop: bool = True) -> list[Path]:
    """Write ``stem``.png (and .svg when asked) and close the figure; ``crop``: to its
    contents, which draws it once more (a figure laid out by ``grid`` needs no crop)."""
    stem = Path(stem)
    paths = [stem.with_suffix(".png")]
    bbox = "tight" if crop else None
    fig.savefig(paths[0], dpi=DPI, bbox_inches=bbox, pil_kwargs={"compress_level": PNG_LEVEL})
    if svg:
        paths.append(stem.with_suffix(".svg"))
        fig.savefig(paths[1], bbox_inches=bbox)
    plt.close(fig)
    return paths


# ---------------------------------------------------------------- layout helpers


def grid(n_panels: int, title: str, extra_h: float = 0.0):
    # the column count (<= MAX_COLS) that leaves the fewest empty slots, wider on ties
    ncols = min(
        range(min(MAX_COLS, max(n_panels, 1)), 0, -1),
        key=lambda c: -(-n_panels // c) * c - n_panels,
    )
    nrows = max(1, math.ceil(n_panels / ncols))
    width, height = PANEL_W_IN * ncols, PANEL_H_IN * nrows + SUPTITLE_IN + extra_h
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False)
    ax_w, ax_h = PANEL_W_IN - LEFT_IN - LEGEND_IN, PANEL_H_IN - ABOVE_IN - BELOW_IN
    fig.subplots_adjust(
        left=LEFT_IN / width,
        right=1 - LEGEND_IN / width,
        bottom=BELOW_IN / height,
        top=1 - (SUPTITLE_IN + extra_h + ABOVE_IN) / height,
        wspace=(LEGEND_IN + LEFT_IN) / ax_w,
        hspace=(ABOVE_IN + BELOW_IN) / ax_h,
    )
    for ax in axes.flat[n_panels:]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=11, y=1 - 0.1 / height, va="top")
    return fig, list(axes.flat[:n_panels])


def seq_axis(ax, seqs, axis: str = "seq_q") -> None:
    """A log2 x axis of the lengths ``seqs`` of ``axis`` (seq_q, or seq_kv for a decode
    series), each swept length a tick."""
    seqs = sorted({int(s) for s in seqs})
    ax.set_xscale("log", base=2)
    if seqs:
        ax.xaxis.set_major_locator(FixedLocator(seqs))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{int(round(v))}"))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.tick_params(axis="x", labelrotation=45 if len(seqs) > 6 else 0)
        lo, hi = seqs[0], seqs[-1]
        ax.set_xlim(lo / 1.25, hi * 1.25)
    what = "cache length N (seq_kv)" if axis == "seq_kv" else "sequence length N (seq_q)"
    ax.set_xlabel(what)


class _InView(Locator):
    """A locator's ticks in the axis' view only. matplotlib makes a tick (and formats its
    label) for every location a locator returns, a log locator's decades beyond each side
    too, then draws those in view: most of a log panel's drawing time went to ticks never
    drawn. The view's edges keep a tolerance wider than matplotlib's, so every tick it
    would draw is kept."""

    def __init__(self, base: Locator):
        self.base = base

    def set_axis(self, axis):
        super().set_axis(axis)
        self.base.set_axis(axis)

    def __call__(self):
        lo, hi = sorted(self.axis.get_view_interval())
        return [t for t in self.base() if lo * (1 - 1e-6) <= t <= hi * (1 + 1e-6)]

    def tick_values(self, vmin, vmax):
        return self.base.tick_values(vmin, vmax)

    def nonsingular(self, v0, v1):
        return self.base.nonsingular(v0, v1)

    def view_limits(self, vmin, vmax):
        return self.base.view_limits(vmin, vmax)


def log_ticks_in_view(ax) -> None:
    """Each log axis of ``ax`` makes only the ticks it draws (``_InView``): call once its
    scale and locators are set (a later set_yscale puts matplotlib's own back)."""
    for axis in (ax.xaxis, ax.yaxis):
        if axis.get_scale() != "log":
            continue
        for get, put in (
            (axis.get_major_locator, axis.set_major_locator),
            (axis.get_minor_locator, axis.set_minor_locator),
        ):
            if not isinstance(get(), (_InView, FixedLocator, NullLocator)):
                put(_InView(get()))


def ratio_axis(ax, suffix: str = "") -> None:
    """A ratio y axis: linear when the data span less than 4x (log ticks would be sparse),
    log with 1-2-5 ticks otherwise; ticks read as plain numbers, never 10^0 notation."""
    lo, hi = ax.get_ylim()
    fmt = FuncFormatter(lambda v, _: f"{v:g}{suffix}")
    if lo > 0 and hi / lo >= 4:
        span = hi / lo  # 1-2-5 crowds past 2.5 decades and leaves 2 ticks under one
        subs = (
            (1.0,)
            if span > 300
            else (1.0, 2.0, 5.0)
            if span > 10
            else (1.0, 1.5, 2.0, 3.0, 5.0, 7.0)
        )
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
    else:
        ax.set_yscale("linear")
        ax.set_ylim(lo, hi)
    ax.yaxis.set_major_formatter(fmt)
    ax.yaxis.set_minor_formatter(NullFormatter())
    log_ticks_in_view(ax)
    label = ax.get_ylabel().replace(" (log)", "")
    ax.set_ylabel(label if ax.get_yscale() == "linear" else f"{label} (log)")


def empty_figure(title: str, why: str):
    fig, ax = plt.subplots(figsize=(PANEL_W_IN, 2.0))
    ax.axis("off")
    ax.text(0.5, 0.5, why, ha="center", va="center", wrap=True)
    fig.suptitle(title, fontsize=11)
    return fig


def line_figure(
    data: LineFigure,
    *,
    ylabel: str,
    logy: bool = True,
    draw_extra=None,
    y_from_zero=False,
    colors=None,
):
    """One panel per facet, one line per impl (analyse/figure_lines.py holds them);
    ``draw_extra(ax, panel)`` draws what the panel holds besides its lines."""
    if not data.panels:
        return empty_figure(data.title, f"no ok rows with {data.y}: nothing to plot")
    style = impl_style(data.impls, colors)
    fig, axes = grid(len(data.panels), data.title)
    for ax, panel in zip(axes, data.panels):
        marks = _Marks()
        for line in panel.lines:
            _draw_line(ax, line, style[line.impl], marks)
        seq_axis(ax, panel.seqs, panel.axis)
        if logy:
            ax.set_yscale("log")
        elif y_from_zero:
            ax.set_ylim(bottom=0)
        if draw_extra:
            draw_extra(ax, panel)
        low, high = ax.dataLim.intervaly  # everything drawn: lines, bands, reference lines
        linear = not logy or (low > 0 and high < LOG_SPAN * low)
        if logy and linear:  # a log axis over 64–65 MiB shows one tick and reads as flat
            ax.set_yscale("linear")
        ax.set_ylabel(ylabel.replace(", log)", ")").replace(" (log)", "") if linear else ylabel)
        # a log axis has no offset text for the title to clear: its place is fixed, which
        # spares matplotlib laying out the y axis' ticks once more to find it
        ax.set_title(panel.title, fontsize=10, y=1.0 if ax.get_yscale() == "log" else None)
        _legend(ax, marks)
        log_ticks_in_view(ax)
    if data.absent:
        fig.text(
            0.01,
            0.005,
            f"not shown, no ok rows with {data.y}: {', '.join(data.absent)} "
            "(see the support matrix)",
            fontsize=8,
            ha="left",
            va="bottom",
        )
    return fig


class _Marks:
    """What a panel circled or greyed, for its legend."""

    flagged: str | bool = False
    noisy: bool = False


def _draw_line(ax, line: Line, style, marks: _Marks) -> None:
    """One impl's line on a panel: dashed when it repeats a line drawn before it, noisy
    points grey, the band, disagreeing points circled in red."""
    colour, marker = style
    x, v = line.x, line.y
    dashed = dict(ls="--", mfc="none") if line.same_as else dict(ls="-", mfc=colour)
    ax.plot(x, v, color=colour, marker=marker, ms=5, lw=1.6, label=line.label, **dashed)
    if line.noisy.any():
        marks.noisy = True
        ax.scatter(x[line.noisy], v[line.noisy], s=60, color="0.6", zorder=4)
    if line.band:
        lo, hi = line.band
        ax.fill_between(x, lo, hi, color=colour, alpha=0.18, lw=0)
    bad = line.flagged
    if bad.any():
        marks.flagged = (
            "disagrees / not checked"
            if line.unchecked
            else marks.flagged or "disagrees with reference"
        )
        ax.scatter(
            x[bad], v[bad], s=110, facecolors="none", edgecolors="red", linewidths=1.5, zorder=5
        )


def _legend(ax, marks: _Marks) -> None:
    """The panel's legend beside it, never over the data, however many impls there are."""
    handles, labels = ax.get_legend_handles_labels()
    if marks.flagged:
        handles.append(Line2D([], [], ls="", marker="o", mfc="none", mec="red", ms=9))
        labels.append(marks.flagged + " (rel or max-abs bound: see reason)")
    if marks.noisy:
        handles.append(Line2D([], [], ls="", marker="o", color="0.6", ms=7))
        labels.append(f"noisy: p20–p80 spread > {100 * NOISY_SPREAD:.0f}% of the median")
    labels = [textwrap.fill(label, LEGEND_CHARS, subsequent_indent="  ") for label in labels]
    ax.legend(
        handles,
        labels,
        fontsize=7.5,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        borderaxespad=0.0,
        frameon=False,
    )
    ax.grid(True, which="major", alpha=0.4)
