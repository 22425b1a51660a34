"""The figures' shared layout: one colour and marker per impl, facets, titles, axes, and the
line figure every "metric vs N" plot is drawn with (plots.py).

Conventions shared by every figure:
  * only ok rows are drawn as measurements; failed rows are counted in the legend label
    ("naive (1 oom)") so a line that stops early is explained, never drawn as a number;
  * an impl has the same colour and marker in every figure (``impl_style``);
  * panels are facets of mode x causal and of whatever else varies besides the lengths;
    the suptitle names the device, the dtype and everything held fixed;
  * the x axis is the length N the series varies (derived.with_series: seq_q, or the
    cache length seq_kv in a decode series) on a log2 scale with the swept lengths as ticks.
"""

from __future__ import annotations

import math
import textwrap
import zlib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator  # noqa: E402

from attnbench.dims import DIMS, SPEC_COLUMNS  # noqa: E402
from attnbench.measure.timing import NOISY_SPREAD  # noqa: E402
from attnbench.report.analyse import derived  # noqa: E402

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h", "*", "p")
FACET_COLUMNS = ("mode", "causal")
# every series key column besides the impl and the facets: its title prefix (dims.py)
CONFIG_LABELS = {d.name: d.title_prefix for d in DIMS} | {"seq_kv_rule": "", "batch_rule": ""}
CONFIG_COLUMNS = tuple(c for c in derived.SERIES_KEY if c not in ("impl", *FACET_COLUMNS))
PANEL_W_IN, PANEL_H_IN = 7.4, 3.9  # width includes the legend beside the axes
# a panel's slot, in inches: the y axis' labels left of the axes, the legend right of them,
# the panel's title above and the x axis' labels below; the figure's title over all panels.
# Placed once (no layout engine: each of its passes drew the whole figure again)
LEFT_IN, LEGEND_IN, ABOVE_IN, BELOW_IN, SUPTITLE_IN = 0.85, 3.0, 0.4, 0.85, 0.9
LEGEND_CHARS = 46  # a legend label wraps here, so it fits LEGEND_IN at its font size
DPI = 130
MAX_COLS = 2  # panels are wide: the legend sits beside each one
LOG_SPAN = 2.0  # a log y axis only where a panel's values span this factor (64–65 MiB: linear)


def impl_style(impls, colors: dict[str, str] | None = None) -> dict[str, tuple]:
    """impl -> (colour, marker): the colour an impl declared at registration (recorded in the
    run's env.json, ``colors``), else a palette colour in sorted-name order."""
    colors = colors or {}
    names = sorted(set(impls))
    palette = sns.color_palette("tab10", 10) + sns.color_palette("husl", max(len(names), 1))
    return {  # markers follow the name alone, so they too stay put from run to run
        name: (colors.get(name) or palette[i], MARKERS[zlib.crc32(name.encode()) % len(MARKERS)])
        for i, name in enumerate(names)
    }


def run_colors(env: dict, impls=()) -> dict[str, object]:
    """Every impl's colour for all the figures of a run: the colour it declared (env.json
    ``impls``), else a palette colour picked once among the run's impls (``impls`` and those
    env.json names), so that a figure drawing fewer impls (speedups leave the baseline out)
    colours each one as the others do."""
    declared = {
        name: info["color"] for name, info in (env.get("impls") or {}).items() if info.get("color")
    }
    names = {*(env.get("impls") or {}), *(str(i) for i in impls if not pd.isna(i))}
    return {name: colour for name, (colour, _) in impl_style(names, declared).items()}


def save_figure(fig, stem: Path, svg: bool = False, crop: bool = True) -> list[Path]:
    """Write ``stem``.png (and .svg when asked) and close the figure; ``crop``: to its
    contents, which draws it once more (a figure laid out by ``grid`` needs no crop)."""
    stem = Path(stem)
    paths = [stem.with_suffix(".png")]
    bbox = "tight" if crop else None
    fig.savefig(paths[0], dpi=DPI, bbox_inches=bbox)
    if svg:
        paths.append(stem.with_suffix(".svg"))
        fig.savefig(paths[1], bbox_inches=bbox)
    plt.close(fig)
    return paths


# ---------------------------------------------------------------- layout helpers


def fixed_and_varying(df: pd.DataFrame) -> tuple[list[str], list[str]]:
    fixed, varying = [], []
    for c in (c for c in CONFIG_COLUMNS if c in df):
        (fixed if df[c].nunique(dropna=False) <= 1 else varying).append(c)
    return fixed, varying


def _said(value) -> bool:
    """A value worth printing: not missing, not blank (model and phase of a plain case)."""
    return not pd.isna(value) and str(value) != ""


def _fmt_config(row, columns) -> str:
    return ", ".join(f"{CONFIG_LABELS[c]}{row[c]}" for c in columns if _said(row[c]))


def title(what: str, df: pd.DataFrame, device_name: str | None) -> str:
    fixed, _ = fixed_and_varying(df)
    device = device_name or ", ".join(sorted(map(str, df["device"].dropna().unique())))
    dtype = str(df["dtype"].iloc[0]) if "dtype" in fixed and len(df) else "dtype varies by panel"
    skip = {"dtype", "device"}
    if len(df) and (df["kv_heads"] == df["heads"]).all():
        skip.add("kv_heads")  # plain multi-head attention: Hkv = H says nothing
    if len(df) and (df["mask"] == "none").all() and (df["level"] == "op").all():
        skip |= {"mask", "level", *SPEC_COLUMNS}  # the defaults say nothing either
    if "causal_align" in df and (df["causal_align"].fillna("top_left") == "top_left").all():
        skip.add("causal_align")
    held = (  # a value held fixed at "missing" (a spec of a kind without one) says nothing
        ", ".join(
            f"{CONFIG_LABELS[c]}{df[c].iloc[0]}"
            for c in fixed
            if c not in skip and _said(df[c].iloc[0])
        )
        if len(df)
        else ""
    )
    return f"{what}\n{device} · {dtype}" + (f" · fixed: {held}" if held else "")


def panels(df: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(panel title, rows) for each facet, in a stable order."""
    _, varying = fixed_and_varying(df)
    keys = [*FACET_COLUMNS, *varying]
    out = []
    for key, g in df.groupby(keys, dropna=False, sort=True):
        row = dict(zip(keys, key))
        title = f"{row['mode']} · {'causal' if derived.flag(row['causal']) else 'full'}"
        if varying:
            title += " · " + _fmt_config(row, varying)
        out.append((derived.mode_rank(row["mode"]), len(out), title, g))
    return [(title, g) for _, _, title, g in sorted(out, key=lambda t: t[:2])]


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
    label = ax.get_ylabel().replace(" (log)", "")
    ax.set_ylabel(label if ax.get_yscale() == "linear" else f"{label} (log)")


def _fail_note(g: pd.DataFrame) -> str:
    failed = g.loc[~g["_ok"], "status"]
    if failed.empty:
        return ""
    counts = failed.fillna("missing").value_counts()
    return " (" + ", ".join(f"{n} {s}" for s, n in counts.items()) + ")"


def empty_figure(title: str, why: str):
    fig, ax = plt.subplots(figsize=(PANEL_W_IN, 2.0))
    ax.axis("off")
    ax.text(0.5, 0.5, why, ha="center", va="center", wrap=True)
    fig.suptitle(title, fontsize=11)
    return fig


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Two lines with the same values to 0.1% (relative only: errors near 1e-7 are not the
    same because both are small)."""
    return bool(np.allclose(a, b, rtol=1e-3, atol=0.0))


def line_figure(
    df: pd.DataFrame,
    y: str,
    *,
    what: str,
    ylabel: str,
    device_name,
    logy: bool = True,
    band: tuple[str, str] | None = None,
    label_suffix=None,
    draw_extra=None,
    y_from_zero=False,
    colors=None,
):
    """One panel per facet, one line per impl of ``y`` vs the series' length over ok rows."""
    df = derived.with_series(df)
    df = df.assign(_ok=derived.is_ok(df))  # once: panels and impls filter by it
    fig_title = title(what, df, device_name)
    ok = df[df["_ok"] & df[y].notna()]
    if ok.empty:
        return empty_figure(fig_title, f"no ok rows with {y}: nothing to plot")
    style = impl_style(df["impl"].unique(), colors)
    shown = [(t, g) for t, g in panels(df) if (g["_ok"] & g[y].notna()).any()]
    fig, axes = grid(len(shown), fig_title)
    for ax, (ptitle, g) in zip(axes, shown):
        marks = _Marks()
        drawn: dict[str, np.ndarray] = {}  # impl -> its values, to point out identical lines
        for impl, gi in g.groupby("impl", sort=True):
            label = impl + (label_suffix(impl, gi) if label_suffix else "") + _fail_note(gi)
            _draw_impl(ax, gi, y, style[impl], label, drawn, band, marks)
        seq_axis(ax, g["seq_n"], derived.length_axis(g["seq_kv_rule"].iloc[0]))
        if logy:
            ax.set_yscale("log")
        elif y_from_zero:
            ax.set_ylim(bottom=0)
        if draw_extra:
            draw_extra(ax, g)
        low, high = ax.dataLim.intervaly  # everything drawn: lines, bands, reference lines
        linear = not logy or (low > 0 and high < LOG_SPAN * low)
        if logy and linear:  # a log axis over 64–65 MiB shows one tick and reads as flat
            ax.set_yscale("linear")
        ax.set_ylabel(ylabel.replace(", log)", ")").replace(" (log)", "") if linear else ylabel)
        ax.set_title(ptitle, fontsize=10)
        _legend(ax, marks)
    absent = sorted(set(df["impl"].dropna()) - set(ok["impl"]))
    if absent:
        fig.text(
            0.01,
            0.005,
            f"not shown, no ok rows with {y}: {', '.join(absent)} (see the support matrix)",
            fontsize=8,
            ha="left",
            va="bottom",
        )
    return fig


class _Marks:
    """What a panel circled or greyed, for its legend."""

    flagged: str | bool = False
    noisy: bool = False


def _draw_impl(ax, gi, y, style, label, drawn, band, marks: _Marks) -> None:
    """One impl's line on a panel: its ok points vs seq_n, dashed when it repeats a line
    drawn before it, noisy points grey, the band, disagreeing points circled in red."""
    pts = gi[gi["_ok"] & gi[y].notna()].sort_values("seq_n")
    if pts.empty:
        return
    colour, marker = style
    x = pts["seq_n"].to_numpy(dtype=float)
    v = pts[y].to_numpy(dtype=float)
    twin = next((o for o, w in drawn.items() if len(w) == len(v) and _same(w, v)), None)
    if twin:  # an identical line would hide under the other: dashed, and said so
        label += f" (same as {twin})"
    drawn[str(gi["impl"].iloc[0])] = v
    dashed = dict(ls="--", mfc="none") if twin else dict(ls="-", mfc=colour)
    ax.plot(x, v, color=colour, marker=marker, ms=5, lw=1.6, label=label, **dashed)
    noisy = derived.noisy(pts).to_numpy(dtype=bool) if y == "time_ms" else None
    if noisy is not None and noisy.any():
        marks.noisy = True
        ax.scatter(x[noisy], v[noisy], s=60, color="0.6", zorder=4)
    if band:
        lo, hi = (pts[c].to_numpy(dtype=float, na_value=np.nan) for c in band)
        ax.fill_between(x, lo, hi, color=colour, alpha=0.18, lw=0)
    bad = ~pts["agrees"].eq(True).fillna(False).to_numpy(dtype=bool)
    if bad.any():
        marks.flagged = (
            "disagrees / not checked"
            if pts["agrees"].isna().any()
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
