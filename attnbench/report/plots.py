"""Figures from a results frame: one function per figure, each returning a matplotlib Figure.

Conventions shared by every figure:
  * only ok rows are drawn as measurements; failed rows are counted in the legend label
    ("naive (1 oom)") so a line that stops early is explained, never drawn as a number;
  * an impl has the same colour and marker in every figure (``impl_style``);
  * panels are facets of mode x causal and of whatever else varies besides the lengths;
    the suptitle names the device, the dtype and everything held fixed;
  * the x axis is the query length N = seq_q on a log2 scale with the swept lengths as ticks.
"""

from __future__ import annotations

import math
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

from attnbench.measure.timing import NOISY_SPREAD  # noqa: E402
from attnbench.report import analysis  # noqa: E402
from attnbench.store.schema import STATUSES  # noqa: E402

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h", "*", "p")
FACET_COLUMNS = ("mode", "causal")
CONFIG_COLUMNS = (
    "dtype",
    "batch",
    "heads",
    "kv_heads",
    "head_dim",
    "seq_kv_rule",
    "device",
    "mask",
    "window",
    "level",
)
CONFIG_LABELS = {
    "dtype": "",
    "batch": "B=",
    "heads": "H=",
    "kv_heads": "Hkv=",
    "head_dim": "D=",
    "seq_kv_rule": "",
    "device": "",
    "mask": "mask=",
    "window": "W=",
    "level": "level=",
}
PANEL_W_IN, PANEL_H_IN = 7.4, 3.9  # width includes the legend beside the axes
DPI = 130
MAX_COLS = 2  # panels are wide: the legend sits beside each one


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


def save_figure(fig, stem: Path, svg: bool = False) -> list[Path]:
    """Write ``stem``.png (and .svg when asked) and close the figure."""
    stem = Path(stem)
    paths = [stem.with_suffix(".png")]
    fig.savefig(paths[0], dpi=DPI, bbox_inches="tight")
    if svg:
        paths.append(stem.with_suffix(".svg"))
        fig.savefig(paths[1], bbox_inches="tight")
    plt.close(fig)
    return paths


# ---------------------------------------------------------------- layout helpers


def _fixed_and_varying(df: pd.DataFrame) -> tuple[list[str], list[str]]:
    fixed, varying = [], []
    for c in CONFIG_COLUMNS:
        (fixed if df[c].nunique(dropna=False) <= 1 else varying).append(c)
    return fixed, varying


def _fmt_config(row, columns) -> str:
    return ", ".join(f"{CONFIG_LABELS[c]}{row[c]}" for c in columns if not pd.isna(row[c]))


def _title(what: str, df: pd.DataFrame, device_name: str | None) -> str:
    fixed, _ = _fixed_and_varying(df)
    device = device_name or ", ".join(sorted(map(str, df["device"].dropna().unique())))
    dtype = str(df["dtype"].iloc[0]) if "dtype" in fixed and len(df) else "dtype varies by panel"
    skip = {"dtype", "device"}
    if len(df) and (df["kv_heads"] == df["heads"]).all():
        skip.add("kv_heads")  # plain multi-head attention: Hkv = H says nothing
    if len(df) and (df["mask"] == "none").all() and (df["level"] == "op").all():
        skip |= {"mask", "window", "level"}  # the defaults say nothing either
    held = (  # a value held fixed at "missing" (W of a mask without a window) says nothing
        ", ".join(
            f"{CONFIG_LABELS[c]}{df[c].iloc[0]}"
            for c in fixed
            if c not in skip and not pd.isna(df[c].iloc[0])
        )
        if len(df)
        else ""
    )
    return f"{what}\n{device} · {dtype}" + (f" · fixed: {held}" if held else "")


def _panels(df: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(panel title, rows) for each facet, in a stable order."""
    _, varying = _fixed_and_varying(df)
    keys = [*FACET_COLUMNS, *varying]
    out = []
    for key, g in df.groupby(keys, dropna=False, sort=True):
        row = dict(zip(keys, key))
        title = f"{row['mode']} · {'causal' if analysis.flag(row['causal']) else 'full'}"
        if varying:
            title += " · " + _fmt_config(row, varying)
        out.append((analysis.mode_rank(row["mode"]), len(out), title, g))
    return [(title, g) for _, _, title, g in sorted(out, key=lambda t: t[:2])]


def _grid(n_panels: int, title: str, extra_h: float = 0.0):
    # the column count (<= MAX_COLS) that leaves the fewest empty slots, wider on ties
    ncols = min(
        range(min(MAX_COLS, max(n_panels, 1)), 0, -1),
        key=lambda c: -(-n_panels // c) * c - n_panels,
    )
    nrows = max(1, math.ceil(n_panels / ncols))
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(PANEL_W_IN * ncols, PANEL_H_IN * nrows + 0.9 + extra_h),
        squeeze=False,
    )
    for ax in axes.flat[n_panels:]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=11)
    return fig, list(axes.flat[:n_panels])


def _seq_axis(ax, seqs) -> None:
    seqs = sorted({int(s) for s in seqs})
    ax.set_xscale("log", base=2)
    if seqs:
        ax.xaxis.set_major_locator(FixedLocator(seqs))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{int(round(v))}"))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.tick_params(axis="x", labelrotation=45 if len(seqs) > 6 else 0)
        lo, hi = seqs[0], seqs[-1]
        ax.set_xlim(lo / 1.25, hi * 1.25)
    ax.set_xlabel("sequence length N (seq_q)")


def _ratio_axis(ax, suffix: str = "") -> None:
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
    failed = g[~analysis.is_ok(g)]
    if failed.empty:
        return ""
    counts = failed["status"].fillna("missing").value_counts()
    return " (" + ", ".join(f"{n} {s}" for s, n in counts.items()) + ")"


def _empty(title: str, why: str):
    fig, ax = plt.subplots(figsize=(PANEL_W_IN, 2.0))
    ax.axis("off")
    ax.text(0.5, 0.5, why, ha="center", va="center", wrap=True)
    fig.suptitle(title, fontsize=11)
    return fig


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Two lines with the same values to 0.1% (relative only: errors near 1e-7 are not the
    same because both are small)."""
    return bool(np.allclose(a, b, rtol=1e-3, atol=0.0))


def _line_figure(
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
    """One panel per facet, one line per impl of ``y`` vs seq_q over ok rows."""
    df = analysis.with_series(df)
    title = _title(what, df, device_name)
    ok = analysis.ok_rows(df)
    ok = ok[ok[y].notna()]
    if ok.empty:
        return _empty(title, f"no ok rows with {y}: nothing to plot")
    style = impl_style(df["impl"].unique(), colors)
    panels = [(t, g) for t, g in _panels(df) if analysis.ok_rows(g)[y].notna().any()]
    fig, axes = _grid(len(panels), title)
    for ax, (ptitle, g) in zip(axes, panels):
        flagged = noisy_seen = False
        drawn: dict[str, np.ndarray] = {}  # impl -> its values, to point out identical lines
        for impl, gi in g.groupby("impl", sort=True):
            pts = analysis.ok_rows(gi)
            pts = pts[pts[y].notna()].sort_values("seq_q")
            if pts.empty:
                continue
            colour, marker = style[impl]
            x = pts["seq_q"].to_numpy(dtype=float)
            v = pts[y].to_numpy(dtype=float)
            label = impl + (label_suffix(impl, gi) if label_suffix else "") + _fail_note(gi)
            twin = next(
                (o for o, w in drawn.items() if len(w) == len(v) and _same(w, v)),
                None,
            )
            if twin:  # an identical line would hide under the other: dashed, and said so
                label += f" (same as {twin})"
            drawn[impl] = v
            ax.plot(
                x,
                v,
                color=colour,
                marker=marker,
                ms=5,
                lw=1.6,
                label=label,
                ls="--" if twin else "-",
                mfc="none" if twin else colour,
            )
            noisy = analysis.noisy(pts).to_numpy(dtype=bool) if y == "time_ms" else None
            if noisy is not None and noisy.any():
                noisy_seen = True
                ax.scatter(x[noisy], v[noisy], s=60, color="0.6", zorder=4)
            if band:
                lo, hi = (pts[c].to_numpy(dtype=float, na_value=np.nan) for c in band)
                ax.fill_between(x, lo, hi, color=colour, alpha=0.18, lw=0)
            bad = ~pts["agrees"].eq(True).fillna(False).to_numpy(dtype=bool)
            if bad.any():
                flagged = (
                    "disagrees / not checked"
                    if pts["agrees"].isna().any()
                    else flagged or "disagrees with reference"
                )
                ax.scatter(
                    x[bad],
                    v[bad],
                    s=110,
                    facecolors="none",
                    edgecolors="red",
                    linewidths=1.5,
                    zorder=5,
                )
        _seq_axis(ax, g["seq_q"])
        if logy:
            ax.set_yscale("log")
        elif y_from_zero:
            ax.set_ylim(bottom=0)
        if draw_extra:
            draw_extra(ax, g)
        ax.set_ylabel(ylabel)
        ax.set_title(ptitle, fontsize=10)
        handles, labels = ax.get_legend_handles_labels()
        if flagged:
            handles.append(Line2D([], [], ls="", marker="o", mfc="none", mec="red", ms=9))
            labels.append(flagged + " (rel or max-abs bound: see reason)")
        if noisy_seen:
            handles.append(Line2D([], [], ls="", marker="o", color="0.6", ms=7))
            labels.append(f"noisy: p20–p80 spread > {100 * NOISY_SPREAD:.0f}% of the median")
        # beside the panel, never over the data, however many impls there are
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
    fig.tight_layout()
    absent = sorted(set(df["impl"].dropna()) - set(ok["impl"]))
    if absent:
        fig.text(
            0.01,
            0.0,
            f"not shown, no ok rows with {y}: {', '.join(absent)} (see the support matrix)",
            fontsize=8,
            ha="left",
            va="top",
        )
    return fig


def _slope_suffix(fits: pd.DataFrame | None, metric: str):
    """Legend suffix with the fitted slope of this impl's series (``slope 1.98 ± 0.02``,
    ``slope ≥1.60 ± 0.10`` when overhead-limited)."""
    if fits is None or fits.empty:
        return None
    f = fits[fits["metric"] == metric]

    def suffix(impl, gi) -> str:
        first = gi.iloc[0]  # a panel holds one series per impl; seq_kv_rule already set
        match = f[f["impl"] == impl]
        for c in analysis.SERIES_KEY:
            if c != "impl":
                same = match[c].isna() if pd.isna(first[c]) else match[c].eq(first[c])
                match = match[same.fillna(False).astype(bool)]
        if match.empty or pd.isna(match["slope"].iloc[0]):
            return "  (no fit)"
        m = match.iloc[0]
        bound = "≥" if analysis.flag(m["overhead_limited"]) else ""
        return f"  slope {bound}{m['slope']:.2f} ± {m['slope_se']:.2f}"

    return suffix


# ---------------------------------------------------------------- the figures


def plot_time_vs_seq(
    df: pd.DataFrame,
    fits: pd.DataFrame | None = None,
    *,
    device_name: str | None = None,
    colors: dict | None = None,
):
    """Median time per call vs N, log-log, p20–p80 band, fitted slope in the legend."""
    fits = analysis.scaling_exponents(df) if fits is None else fits
    return _line_figure(
        df,
        "time_ms",
        what="Time per call vs sequence length (median, band: "
        "p20–p80; ≥ marks an overhead-limited fit)",
        ylabel="time (ms, log)",
        device_name=device_name,
        colors=colors,
        band=("time_ms_p20", "time_ms_p80"),
        label_suffix=_slope_suffix(fits, "time_ms"),
    )


def plot_memory_vs_seq(
    df: pd.DataFrame,
    fits: pd.DataFrame | None = None,
    *,
    device_name: str | None = None,
    colors: dict | None = None,
):
    """Peak memory above the inputs vs N, log-log, fitted slope in the legend."""
    fits = analysis.scaling_exponents(df) if fits is None else fits
    return _line_figure(
        df,
        "peak_mem_mib",
        what="Peak memory vs sequence length (above what was allocated before the call)",
        ylabel="peak memory (MiB, log)",
        device_name=device_name,
        colors=colors,
        label_suffix=_slope_suffix(fits, "peak_mem_mib"),
    )


def plot_tflops_vs_seq(
    df: pd.DataFrame, *, device_name: str | None = None, colors: dict | None = None
):
    """Achieved TFLOP/s (unmasked matmul FLOPs / median time) vs N."""
    return _line_figure(
        df,
        "tflops",
        what="Throughput vs sequence length (matmul FLOPs of unmasked pairs / median time)",
        ylabel="TFLOP/s",
        logy=False,
        y_from_zero=True,
        device_name=device_name,
        colors=colors,
    )


def plot_speedup_vs_seq(
    df: pd.DataFrame, baseline: str, *, device_name: str | None = None, colors: dict | None = None
):
    """baseline time / impl time vs N; above 1 is faster than the baseline."""
    sp = analysis.speedups(df, baseline)
    sp = sp[sp["impl"] != baseline].copy()

    def reference(ax, g):
        ax.axhline(1.0, color="black", lw=1.2, ls="--", label=f"{baseline} (baseline)")

    fig = _line_figure(
        sp,
        "speedup",
        what=f"Speedup vs {baseline} ({baseline} time / impl time; above 1 is faster)",
        ylabel=f"speedup vs {baseline} (log)",
        device_name=device_name,
        draw_extra=reference,
        colors=colors,
    )
    for ax in fig.axes:
        if ax.get_yscale() == "log":
            _ratio_axis(ax, "x")
    return fig


def plot_error_vs_seq(
    df: pd.DataFrame, *, device_name: str | None = None, colors: dict | None = None
):
    """rel_err vs N against the agreement bound (err_bound) each row was held to."""
    style = impl_style(df["impl"].dropna().unique(), colors)

    def bounds(ax, g):
        ok = analysis.ok_rows(g).dropna(subset=["err_bound"])
        if ok.empty:
            _readable_log_y(ax)
            return
        spread = ok.groupby("seq_q")["err_bound"].agg(["min", "max"])
        if (spread["max"] <= spread["min"] * 1.01).all():  # one bound for every impl
            ax.plot(
                spread.index.to_numpy(dtype=float),
                spread["max"].to_numpy(dtype=float),
                color="black",
                ls="--",
                lw=1.2,
                label="agreement bound (err_bound)",
            )
        else:
            for impl, gi in ok.groupby("impl", sort=True):
                gi = gi.sort_values("seq_q")
                ax.plot(
                    gi["seq_q"].to_numpy(dtype=float),
                    gi["err_bound"].to_numpy(dtype=float),
                    color=style[impl][0],
                    ls="--",
                    lw=1.1,
                )
            ax.plot(
                [], [], color="grey", ls="--", lw=1.1, label="dashed: each impl's agreement bound"
            )
        _readable_log_y(ax)

    return _line_figure(
        df,
        "rel_err",
        what="Relative error vs float64 reference "
        "(||x - ref|| / ||ref||, worst tensor) and the agreement bound",
        ylabel="relative error (log)",
        device_name=device_name,
        draw_extra=bounds,
        colors=colors,
    )


def _readable_log_y(ax) -> None:
    """Log y ticks as 4e-07 on every panel (one format per figure); on a panel spanning under
    a decade, the minor ticks are labelled too."""
    ax.autoscale_view()
    lo, hi = ax.get_ylim()
    fmt = FuncFormatter(lambda v, _: f"{v:.0e}")
    ax.yaxis.set_major_formatter(fmt)
    if lo > 0 and hi / lo < 10:
        ax.yaxis.set_minor_formatter(fmt)


def plot_support_matrix(df: pd.DataFrame, *, device_name: str | None = None):
    """impl x case family: colour = share of ok rows, text = counts per status."""
    device = device_name or ", ".join(sorted(map(str, df["device"].dropna().unique())))
    title = (
        f"Support matrix: rows per status\n{device} · colour: share ok among rows that "
        f"ran; grey: all unsupported"
    )
    counts = analysis.support_counts(df)
    if counts.empty:
        return _empty(title, "no rows")
    order = {s: i for i, s in enumerate((*STATUSES, "missing"))}
    impls = sorted(counts["impl"].unique())
    families = analysis.family_order(df)
    share = pd.DataFrame(np.nan, index=impls, columns=families)
    text = pd.DataFrame("", index=impls, columns=families)
    for (impl, fam), g in counts.groupby(["impl", "family"]):
        ran = int(g.loc[g["status"] != "unsupported", "count"].sum())
        ok = int(g.loc[g["status"] == "ok", "count"].sum())
        share.loc[impl, fam] = ok / ran if ran else np.nan
        g = g.sort_values("status", key=lambda s: s.map(lambda v: order.get(v, 99)))
        text.loc[impl, fam] = "\n".join(f"{n} {s}" for s, n in zip(g["status"], g["count"]))
    fig, ax = plt.subplots(
        figsize=(max(5.0, 1.7 * len(families) + 2.5), max(2.6, 0.75 * len(impls) + 1.6))
    )
    ax.set_facecolor("#d9d9d9")  # NaN cells (nothing ran) show the axes background
    sns.heatmap(
        share,
        annot=False,
        cmap="RdYlGn",
        vmin=0,
        vmax=1,
        linewidths=0.5,
        linecolor="white",
        cbar_kws={"label": "share ok (of rows that ran)"},
        ax=ax,
    )
    # seaborn skips annotations on NaN cells; write every cell's counts ourselves
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
    ax.tick_params(axis="x", labelrotation=30)
    for label in ax.get_xticklabels():
        label.set_horizontalalignment("right")
    ax.tick_params(axis="y", labelrotation=0)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


def plot_ratio_vs_seq(
    table: pd.DataFrame,
    *,
    fail_above_pct: float | None = None,
    title: str = "B / A time ratio",
    device_name: str | None = None,
    colors: dict | None = None,
):
    """compare.compare_runs output: time_B / time_A vs N per impl; above 1 is slower in B."""
    both = table[table["ratio"].notna()].copy()

    def lines(ax, g):
        ax.axhline(1.0, color="black", lw=1.2, ls="--", label="no change")
        if fail_above_pct is not None:
            gate = 1 + fail_above_pct / 100
            ax.axhline(gate, color="red", lw=1.0, ls=":", label=f"gate: +{fail_above_pct:g}%")
            over = g[(g["ratio"] > gate).fillna(False).astype(bool)]
            if len(over):
                ax.scatter(
                    over["seq_q"].to_numpy(dtype=float),
                    over["ratio"].to_numpy(dtype=float),
                    s=120,
                    facecolors="none",
                    edgecolors="red",
                    linewidths=1.5,
                    zorder=5,
                    label="slower than the gate",
                )

    both = both.assign(status="ok", agrees=True)
    fig = _line_figure(
        both,
        "ratio",
        what=f"{title} (above 1: slower in B)",
        ylabel="time_B / time_A (log)",
        device_name=device_name,
        draw_extra=lines,
        colors=colors,
    )
    for ax in fig.axes:
        if ax.get_yscale() == "log":
            _ratio_axis(ax)
    return fig


def plot_roofline(
    df: pd.DataFrame, ceilings: dict, *, device_name: str | None = None, colors: dict | None = None
):
    """Achieved TFLOP/s vs arithmetic intensity (FLOPs per byte of the least traffic), with
    the run's measured ceilings: the matmul rate of each dtype and the copy bandwidth."""
    df = analysis.with_series(df)
    ok = analysis.ok_rows(df)
    ok = ok.assign(intensity=analysis.arithmetic_intensity(ok)).dropna(
        subset=["intensity", "tflops"]
    )
    title = _title("Roofline: achieved TFLOP/s vs arithmetic intensity", df, device_name)
    if ok.empty or not ceilings:
        return _empty(title, "no ok op-level rows or no measured ceilings")
    fig, axes = _grid(1, title)
    ax = axes[0]
    style = impl_style(df["impl"].dropna().unique(), colors)
    for impl, g in ok.groupby("impl", sort=True):
        colour, marker = style[impl]
        for mode, gm in g.groupby("mode", sort=False):  # forward filled, backward hollow
            hollow = mode != "fwd"
            ax.scatter(
                gm["intensity"].astype(float),
                gm["tflops"].astype(float),
                facecolors="none" if hollow else colour,
                edgecolors=colour,
                marker=marker,
                label=f"{impl} {mode}",
                s=28,
                alpha=0.85,
            )
    x = np.geomspace(float(ok["intensity"].min()) / 2, float(ok["intensity"].max()) * 2, 200)
    bandwidth_tb_s = ceilings.get("copy_gb_s", 0) / 1e3
    copy = f" · copy {ceilings['copy_gb_s']:.3g} GB/s" if bandwidth_tb_s else ""
    for i, (dtype, peak) in enumerate(sorted(ceilings.get("matmul_tflops", {}).items())):
        if dtype not in set(ok["dtype"]):
            continue
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
    return fig
