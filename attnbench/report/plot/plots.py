"""Figures from a results frame: one function per figure, each returning a matplotlib Figure
(the shared conventions, layout and line drawing: layout.py)."""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.ticker import FuncFormatter

from attnbench.measure.published import published
from attnbench.report.analyse import derived
from attnbench.report.decide import verdicts
from attnbench.report.plot import layout
from attnbench.report.plot.layout import impl_style, plt, run_colors, save_figure  # noqa: F401
from attnbench.store.schema import STATUSES


def _slope_suffix(fits: pd.DataFrame | None, metric: str):
    """Legend suffix with the fitted slope of this impl's series (``slope 1.98 ± 0.02``,
    ``slope ≥1.60 ± 0.10`` when overhead-limited)."""
    if fits is None or fits.empty:
        return None
    f = fits[fits["metric"] == metric]
    key = [c for c in derived.SERIES_KEY if c != "impl"]
    by_series = {
        (impl, *map(_cell, rest)): m
        for (impl, *rest), m in zip(f[["impl", *key]].itertuples(index=False), f.to_dict("records"))
    }

    def suffix(impl, gi) -> str:
        first = gi.iloc[0]  # a panel holds one series per impl; seq_kv_rule already set
        m = by_series.get((impl, *(_cell(first[c]) for c in key)))
        if m is None or pd.isna(m["slope"]):
            return "  (no fit)"
        bound = derived.bound_mark(m)
        n_busy = m.get("n_contended")
        busy = f", {n_busy} contended pts" if not pd.isna(n_busy) and n_busy else ""
        return f"  slope {bound}{derived.slope_text(m['slope'])} ± {m['slope_se']:.2f}{busy}"

    return suffix


def _cell(value):
    """A series key cell as a dict key: every blank alike."""
    return None if pd.isna(value) else value


# the support matrix's family names: wrapped at this many characters (a 1.7 in column at
# 8 pt), each line this many inches tall
FAMILY_CHARS, FAMILY_LINE_IN = 24, 0.14


# ---------------------------------------------------------------- the figures


def plot_time_vs_seq(
    df: pd.DataFrame,
    fits: pd.DataFrame | None = None,
    *,
    device_name: str | None = None,
    colors: dict | None = None,
):
    """Median time per call vs N, log-log, p20–p80 band, fitted slope in the legend."""
    fits = derived.scaling_exponents(df) if fits is None else fits
    return layout.line_figure(
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
    fits = derived.scaling_exponents(df) if fits is None else fits
    return layout.line_figure(
        df,
        "peak_mem_mib",
        what="Peak memory vs sequence length (above what was allocated before the call)",
        ylabel="peak memory (MiB, log)",
        device_name=device_name,
        colors=colors,
        label_suffix=_slope_suffix(fits, "peak_mem_mib"),
        draw_extra=_growth_guides,
    )


def _growth_guides(ax, g: pd.DataFrame) -> None:
    """Grey guide lines growing like N and like N² from the panel's smallest N (through the
    median peak there), so that a reader sees which impls hold an N² buffer."""
    ok = derived.ok_rows(g).dropna(subset=["peak_mem_mib"])
    ok = ok[ok["peak_mem_mib"] > 0]
    if ok["seq_n"].nunique() < 2:
        return
    n0, n1 = float(ok["seq_n"].min()), float(ok["seq_n"].max())
    y0 = float(ok.loc[ok["seq_n"] == ok["seq_n"].min(), "peak_mem_mib"].median())
    n = np.geomspace(n0, n1, 16)
    for power, style, label in ((1, ":", "O(N) guide"), (2, "-.", "O(N²) guide")):
        ax.plot(n, y0 * (n / n0) ** power, color="grey", ls=style, lw=1.0, label=label)


def plot_bandwidth_vs_seq(
    df: pd.DataFrame, env: dict, *, device_name: str | None = None, colors: dict | None = None
):
    """Achieved GB/s of decode rows vs the cache length, under the device's HBM: its
    published peak (measure/published.py) and the run's measured copy speed."""
    peak = published(env.get("gpu_name"))
    copy = (env.get("ceilings") or {}).get("copy_gb_s")

    def roofs(ax, g):
        if peak is not None:
            ax.axhline(peak.memory_gb_s, color="black", ls="--", lw=1.0, label="HBM, published")
        if copy:
            ax.axhline(copy, color="grey", ls=":", lw=1.0, label="copy, measured")
        roof = max([copy or 0.0, peak.memory_gb_s if peak is not None else 0.0])
        ax.set_ylim(0, max(ax.get_ylim()[1], 1.05 * roof))  # the roofs in view on every panel

    return layout.line_figure(
        df,
        "gbps",
        what="Decode bandwidth vs cache length (bytes moved / median time)",
        ylabel="GB/s",
        logy=False,
        y_from_zero=True,
        device_name=device_name,
        colors=colors,
        draw_extra=roofs,
    )


def plot_tflops_vs_seq(
    df: pd.DataFrame, *, device_name: str | None = None, colors: dict | None = None
):
    """Achieved TFLOP/s (unmasked matmul FLOPs / median time) vs N."""
    return layout.line_figure(
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
    df: pd.DataFrame,
    baseline: str,
    *,
    device_name: str | None = None,
    colors: dict | None = None,
    speedups: pd.DataFrame | None = None,
):
    """baseline time / impl time vs N; above 1 is faster than the baseline. ``speedups``:
    verdicts.speedups(df, baseline) when already computed."""
    sp = verdicts.speedups(df, baseline) if speedups is None else speedups
    sp = sp[sp["impl"] != baseline].copy()
    paired = bool(sp["paired"].eq(True).any())

    def reference(ax, g):
        ax.axhline(1.0, color="black", lw=1.2, ls="--", label=f"{baseline} (baseline)")
        marked = derived.ok_rows(g)
        marked = marked[marked["caveat"].fillna("").astype(bool) & marked["speedup"].notna()]
        if len(marked):
            ax.scatter(
                marked["seq_n"].to_numpy(dtype=float),
                marked["speedup"].to_numpy(dtype=float),
                s=110,
                facecolors="none",
                edgecolors="0.35",
                linewidths=1.3,
                zorder=5,
                label="rests on: " + ", ".join(sorted(_caveats(marked["caveat"]))),
            )

    fig = layout.line_figure(
        sp,
        "speedup",
        what=f"Speedup vs {baseline} ({baseline} time / impl time; above 1 is faster"
        + ("; band: 95% interval, paired by round)" if paired else ")"),
        ylabel=f"speedup vs {baseline} (log)",
        device_name=device_name,
        band=("speedup_lo", "speedup_hi") if paired else None,
        draw_extra=reference,
        colors=colors,
    )
    for ax in fig.axes:
        if ax.get_yscale() == "log":
            layout.ratio_axis(ax, "x")
    return fig


def _caveats(notes) -> set[str]:
    """The distinct caveats in a column of derived.caveat texts."""
    return {p for note in notes.dropna() for p in str(note).split(", ") if p}


def plot_error_vs_seq(
    df: pd.DataFrame, *, device_name: str | None = None, colors: dict | None = None
):
    """rel_err vs N against the agreement bound (err_bound) each row was held to."""
    style = impl_style(df["impl"].dropna().unique(), colors)

    def bounds(ax, g):
        # at the panel's x, the length its series varies (seq_n: the cache length in decode)
        ok = derived.with_series(derived.ok_rows(g)).dropna(subset=["err_bound"])
        if ok.empty:
            _readable_log_y(ax)
            return
        spread = ok.groupby("seq_n")["err_bound"].agg(["min", "max"])
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
                gi = gi.sort_values("seq_n")
                ax.plot(
                    gi["seq_n"].to_numpy(dtype=float),
                    gi["err_bound"].to_numpy(dtype=float),
                    color=style[impl][0],
                    ls="--",
                    lw=1.1,
                )
            ax.plot(
                [], [], color="grey", ls="--", lw=1.1, label="dashed: each impl's agreement bound"
            )
        _readable_log_y(ax)

    return layout.line_figure(
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
    counts = derived.support_counts(df)
    if counts.empty:
        return layout.empty_figure(title, "no rows")
    order = {s: i for i, s in enumerate((*STATUSES, "missing"))}
    impls = sorted(counts["impl"].unique())
    families = derived.family_order(df)
    share = pd.DataFrame(np.nan, index=impls, columns=families)
    text = pd.DataFrame("", index=impls, columns=families)
    for (impl, fam), g in counts.groupby(["impl", "family"]):
        ran = int(g.loc[g["status"] != "unsupported", "count"].sum())
        ok = int(g.loc[g["status"] == "ok", "count"].sum())
        share.loc[impl, fam] = ok / ran if ran else np.nan
        g = g.sort_values("status", key=lambda s: s.map(lambda v: order.get(v, 99)))
        text.loc[impl, fam] = "\n".join(f"{n} {s}" for s, n in zip(g["status"], g["count"]))
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
    ax.set_xticklabels(names, rotation=0, fontsize=8)
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
    tested = "ratio_lo" in both and both["ratio_lo"].notna().any()
    fig = layout.line_figure(
        both,
        "ratio",
        what=f"{title} (above 1: slower in B"
        + ("; band: 95% interval, anchor-normalised where both runs have it)" if tested else ")"),
        ylabel="time_B / time_A (log)",
        device_name=device_name,
        band=("ratio_lo", "ratio_hi") if tested else None,
        draw_extra=lines,
        colors=colors,
    )
    for ax in fig.axes:
        if ax.get_yscale() == "log":
            layout.ratio_axis(ax)
    return fig


def plot_roofline(
    df: pd.DataFrame, ceilings: dict, *, device_name: str | None = None, colors: dict | None = None
):
    """Achieved TFLOP/s vs arithmetic intensity (FLOPs per byte of the least traffic), with
    the run's measured ceilings: the matmul rate of each dtype and the copy bandwidth."""
    df = derived.with_series(df)
    ok = derived.ok_rows(df)
    ok = ok.assign(intensity=derived.arithmetic_intensity(ok)).dropna(
        subset=["intensity", "tflops"]
    )
    title = layout.title("Roofline: achieved TFLOP/s vs arithmetic intensity", df, device_name)
    if ok.empty or not ceilings:
        return layout.empty_figure(title, "no ok op-level rows or no measured ceilings")
    fig, axes = layout.grid(1, title)
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


SPEED_WINDOW = 9  # the running median of the speed-over-time figure, in anchor times


def plot_speed_over_time(series: pd.DataFrame, *, device_name: str | None = None):
    """The machine's speed over the run (rounds.AnchorRounds.series): each anchor time as a speed
    relative to the run's first case, compute (matmul) and memory (copy), against the
    seconds since the run's start, with a running median."""
    title = "Machine speed over the run (speed anchor, relative to the first case)"
    title += f"\n{device_name}" if device_name else ""
    if series.empty:
        return layout.empty_figure(title, "no anchor times")
    fig, axes = layout.grid(1, title)
    ax = axes[0]
    colours = {"compute": "tab:blue", "memory": "tab:orange"}
    what = {"compute": "compute (matmul)", "memory": "memory (copy)"}
    for resource, g in series.groupby("resource", sort=True):
        g = g.sort_values("t_s")
        colour = colours.get(resource, "tab:grey")
        t, speed = g["t_s"].to_numpy(dtype=float), g["speed"].to_numpy(dtype=float)
        ax.scatter(t, speed, s=8, color=colour, alpha=0.35, lw=0)
        running = pd.Series(speed).rolling(SPEED_WINDOW, center=True, min_periods=1).median()
        low, high = float(np.min(speed)), float(np.max(speed))
        label = f"{what.get(resource, resource)}: {low:.2f}–{high:.2f}"
        ax.plot(t, running.to_numpy(), color=colour, lw=1.8, label=label)
    ax.axhline(1.0, color="black", lw=1.0, ls="--", label="speed at the first case")
    ax.set_xlabel("time since the run started (s)")
    # log: speeds span 0.5x to hundreds of x when the first case ran on a cold machine, and a
    # linear axis flattens every dip below the largest value into one line
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.set_ylabel("speed (first case = 1, log)")
    ax.grid(True, alpha=0.4)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return fig
