"""What each figure of a report draws, derived once in the analysis (plot/plots.py only
draws it): the line figures' panels and lines (figure_lines.py) with what each panel draws
besides them (growth guides, agreement bounds, ringed points, bandwidth roofs), the support
matrix's grid, the roofline's points and roofs, and the machine's speed over the run."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from attnbench.measure.published import published
from attnbench.report.analyse import derived, scaling
from attnbench.report.analyse.figure_lines import LineFigure, line_figure, slope_suffix, title
from attnbench.store.schema import STATUSES


@dataclass(frozen=True)
class Guides:
    """A memory panel's guide lines growing like N and like N², from the panel's smallest N
    (through the median peak there) to its largest."""

    n0: float
    n1: float
    y0: float


@dataclass(frozen=True)
class Bounds:
    """An error panel's agreement bounds (err_bound) at its x (the length its series varies):
    one line where every impl was held to the same bound (to 1%), else one per impl."""

    shared: tuple[np.ndarray, np.ndarray] | None  # (x, bound)
    per_impl: tuple[tuple[str, np.ndarray, np.ndarray], ...] = ()  # (impl, x, bound)


@dataclass(frozen=True)
class Ringed:
    """Points a panel rings: speedups resting on a caveat, ratios over the gate."""

    x: np.ndarray
    y: np.ndarray
    label: str


@dataclass(frozen=True)
class Roofs:
    """A decode bandwidth panel's ceilings, GB/s (None: not known)."""

    published_gb_s: float | None  # the device's HBM, published (measure/published.py)
    copy_gb_s: float | None  # the run's measured copy speed


def memory_lines(df, fits=None, device_name=None) -> LineFigure:
    """Peak memory above the inputs vs N, the fitted slope in the legend, growth guides."""
    fits = scaling.scaling_exponents(df) if fits is None else fits
    what = "Peak memory vs sequence length (above what was allocated before the call)"
    suffix = slope_suffix(fits, "peak_mem_mib")
    return line_figure(df, "peak_mem_mib", what, device_name, suffix=suffix, extra=_guides)


def _guides(g: pd.DataFrame) -> Guides | None:
    ok = derived.ok_rows(g).dropna(subset=["peak_mem_mib"])
    ok = ok[ok["peak_mem_mib"] > 0]
    if ok["seq_n"].nunique() < 2:
        return None
    n0 = ok["seq_n"].min()
    y0 = float(ok.loc[ok["seq_n"] == n0, "peak_mem_mib"].median())
    return Guides(float(n0), float(ok["seq_n"].max()), y0)


def time_lines(df, fits=None, device_name=None) -> LineFigure:
    """Median time per call vs N, the p20–p80 band, the fitted slope in the legend."""
    fits = scaling.scaling_exponents(df) if fits is None else fits
    what = (
        "Time per call vs sequence length (median, band: p20–p80; ≥ marks an overhead-limited fit)"
    )
    band = ("time_ms_p20", "time_ms_p80")
    return line_figure(
        df, "time_ms", what, device_name, band=band, suffix=slope_suffix(fits, "time_ms")
    )


def tflops_lines(df, device_name=None) -> LineFigure:
    what = "Throughput vs sequence length (matmul FLOPs of unmasked pairs / median time)"
    return line_figure(df, "tflops", what, device_name)


def decode_rows(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["phase"].eq("decode").fillna(False).astype(bool)]


def bandwidth_lines(df, env: dict, device_name=None) -> LineFigure | None:
    """Achieved GB/s of the decode rows vs the cache length, under the device's HBM roofs;
    None where no decode row has a GB/s."""
    decode = decode_rows(df)
    if "gbps" not in decode or not decode["gbps"].notna().any():
        return None
    peak = published(env.get("gpu_name"))
    roofs = Roofs(
        peak.memory_gb_s if peak is not None else None,
        (env.get("ceilings") or {}).get("copy_gb_s") or None,
    )
    what = "Decode bandwidth vs cache length (bytes moved / median time)"
    return line_figure(decode, "gbps", what, device_name, extra=lambda g: roofs)


def error_lines(df, device_name=None) -> LineFigure:
    what = (
        "Relative error vs float64 reference "
        "(||x - ref|| / ||ref||, worst tensor) and the agreement bound"
    )
    return line_figure(df, "rel_err", what, device_name, extra=_bounds)


def _bounds(g: pd.DataFrame) -> Bounds | None:
    # at the panel's x, the length its series varies (seq_n: the cache length in decode)
    ok = derived.ok_rows(g).dropna(subset=["err_bound"])
    if ok.empty:
        return None
    spread = ok.groupby("seq_n")["err_bound"].agg(["min", "max"])
    if (spread["max"] <= spread["min"] * 1.01).all():  # one bound for every impl
        x, bound = spread.index.to_numpy(dtype=float), spread["max"].to_numpy(dtype=float)
        return Bounds((x, bound))
    per_impl = []
    for impl, gi in ok.groupby("impl", sort=True):
        gi = gi.sort_values("seq_n")
        x, bound = gi["seq_n"].to_numpy(dtype=float), gi["err_bound"].to_numpy(dtype=float)
        per_impl.append((str(impl), x, bound))
    return Bounds(None, tuple(per_impl))


def speedup_lines(speedups: pd.DataFrame, baseline: str, device_name=None) -> LineFigure:
    """verdicts.speedups' rows but the baseline's vs N, the band where paired by round;
    each panel rings the points resting on a caveat (contended, noisy, a wide interval)."""
    sp = speedups[speedups["impl"] != baseline]
    paired = bool(sp["paired"].eq(True).any())
    what = f"Speedup vs {baseline} ({baseline} time / impl time; above 1 is faster" + (
        "; band: 95% interval, paired by round)" if paired else ")"
    )
    band = ("speedup_lo", "speedup_hi") if paired else None
    return line_figure(sp, "speedup", what, device_name, band=band, extra=_caveat_points)


def _caveat_points(g: pd.DataFrame) -> Ringed | None:
    marked = derived.ok_rows(g)
    marked = marked[marked["caveat"].fillna("").astype(bool) & marked["speedup"].notna()]
    if marked.empty:
        return None
    caveats = {p for note in marked["caveat"].dropna() for p in str(note).split(", ") if p}
    return Ringed(
        marked["seq_n"].to_numpy(dtype=float),
        marked["speedup"].to_numpy(dtype=float),
        "rests on: " + ", ".join(sorted(caveats)),
    )


def ratio_lines(
    table: pd.DataFrame, fail_above_pct: float | None, what: str, device_name=None
) -> LineFigure:
    """compare.compare_runs' time_B / time_A vs N per impl, where both runs have the case;
    the band where an interval was tested; each panel rings the ratios over the gate."""
    both = table[table["ratio"].notna()].assign(status="ok", agrees=True)
    tested = "ratio_lo" in both and both["ratio_lo"].notna().any()
    what += " (above 1: slower in B" + (
        "; band: 95% interval, anchor-normalised where both runs have it)" if tested else ")"
    )
    band = ("ratio_lo", "ratio_hi") if tested else None

    def over_gate(g: pd.DataFrame) -> Ringed | None:
        if fail_above_pct is None:
            return None
        over = g[(g["ratio"] > 1 + fail_above_pct / 100).fillna(False).astype(bool)]
        if over.empty:
            return None
        # at the panel's x: the length its series varies (the cache length in decode)
        x, y = over["seq_n"].to_numpy(dtype=float), over["ratio"].to_numpy(dtype=float)
        return Ringed(x, y, "slower than the gate")

    return line_figure(both, "ratio", what, device_name, band=band, extra=over_gate)


@dataclass(frozen=True)
class SupportGrid:
    """impl x case family: the share of ok rows among those that ran (NaN: all unsupported)
    and each cell's rows per status, one "<n> <status>" a line."""

    title: str
    share: pd.DataFrame  # impls (index) x families (columns); empty: no rows
    text: pd.DataFrame


def support_grid(df: pd.DataFrame, device_name=None) -> SupportGrid:
    device = device_name or ", ".join(sorted(map(str, df["device"].dropna().unique())))
    heading = (
        f"Support matrix: rows per status\n{device} · colour: share ok among rows that "
        f"ran; grey: all unsupported"
    )
    counts = derived.support_counts(df)
    if counts.empty:
        return SupportGrid(heading, pd.DataFrame(), pd.DataFrame())
    order = {s: i for i, s in enumerate((*STATUSES, "missing"))}
    impls = sorted(counts["impl"].unique())
    families = derived.family_order(df)
    cells: dict[tuple, list] = {}  # (impl, family) -> its (status, rows), statuses by name
    for impl, fam, status, n in counts.itertuples(index=False):
        cells.setdefault((impl, fam), []).append((status, n))
    share = np.full((len(impls), len(families)), np.nan)
    text = np.full((len(impls), len(families)), "", dtype=object)
    row, col = {i: k for k, i in enumerate(impls)}, {f: k for k, f in enumerate(families)}
    for (impl, fam), statuses in cells.items():
        ran = sum(int(n) for s, n in statuses if s != "unsupported")
        ok = sum(int(n) for s, n in statuses if s == "ok")
        share[row[impl], col[fam]] = ok / ran if ran else np.nan
        statuses = sorted(statuses, key=lambda t: order.get(t[0], 99))
        text[row[impl], col[fam]] = "\n".join(f"{n} {s}" for s, n in statuses)
    share = pd.DataFrame(share, index=impls, columns=families)
    text = pd.DataFrame(text, index=impls, columns=families)
    return SupportGrid(heading, share, text)


@dataclass(frozen=True)
class Roofline:
    """Achieved TFLOP/s vs arithmetic intensity of the ok op-level rows, under the run's
    measured ceilings: a matmul roof per dtype the rows have, bent by the copy bandwidth."""

    title: str
    impls: tuple[str, ...]  # every impl of the rows (their colours)
    points: tuple[tuple[str, str, np.ndarray, np.ndarray], ...]  # (impl, mode, FLOP/B, TFLOP/s)
    x_range: tuple[float, float]  # the roofs' span: half the least intensity to twice the most
    roofs: tuple[tuple[int, str, float], ...]  # (rank among the ceilings, dtype, TFLOP/s)
    copy_gb_s: float  # 0: not measured
    empty: str | None  # why there is nothing to draw


def roofline(df: pd.DataFrame, ceilings: dict, device_name=None) -> Roofline:
    df = derived.with_series(df)
    ok = derived.ok_rows(df)
    ok = ok.assign(intensity=derived.arithmetic_intensity(ok)).dropna(
        subset=["intensity", "tflops"]
    )
    heading = title("Roofline: achieved TFLOP/s vs arithmetic intensity", df, device_name)
    impls = tuple(df["impl"].dropna().unique())
    if ok.empty or not ceilings:
        why = "no ok op-level rows or no measured ceilings"
        return Roofline(heading, impls, (), (0.0, 0.0), (), 0.0, why)
    points = tuple(
        (str(impl), str(mode), gm["intensity"].to_numpy(float), gm["tflops"].to_numpy(float))
        for impl, g in ok.groupby("impl", sort=True)
        for mode, gm in g.groupby("mode", sort=False)  # in the rows' order
    )
    dtypes = set(ok["dtype"])
    roofs = tuple(
        (i, dtype, float(peak))
        for i, (dtype, peak) in enumerate(sorted(ceilings.get("matmul_tflops", {}).items()))
        if dtype in dtypes
    )
    x_range = (float(ok["intensity"].min()) / 2, float(ok["intensity"].max()) * 2)
    return Roofline(heading, impls, points, x_range, roofs, ceilings.get("copy_gb_s", 0), None)


SPEED_WINDOW = 9  # the running median of the speed-over-time figure, in anchor times


@dataclass(frozen=True)
class SpeedSeries:
    """One resource's speed over the run (compute: matmul, memory: copy)."""

    resource: str
    t_s: np.ndarray  # seconds since the run's start, ascending
    speed: np.ndarray  # relative to the run's first case
    running: np.ndarray  # its running median over SPEED_WINDOW anchor times
    low: float
    high: float


def speed_series(series: pd.DataFrame) -> tuple[SpeedSeries, ...]:
    """rounds.AnchorRounds.series per resource, in name order."""
    out = []
    for resource, g in series.groupby("resource", sort=True):
        g = g.sort_values("t_s")
        speed = g["speed"].to_numpy(dtype=float)
        running = pd.Series(speed).rolling(SPEED_WINDOW, center=True, min_periods=1).median()
        out.append(
            SpeedSeries(
                str(resource),
                g["t_s"].to_numpy(dtype=float),
                speed,
                running.to_numpy(),
                float(np.min(speed)),
                float(np.max(speed)),
            )
        )
    return tuple(out)


def one_n(frame: pd.DataFrame) -> int | None:
    """The one N of a device's ok rows (None where they have two or more, or none): a figure
    against N would then be one column of points, whose markers hide the impls' colours; the
    tables hold those numbers."""
    ns = derived.ok_rows(frame)["seq_n"].unique()
    return int(ns[0]) if len(ns) == 1 else None


def _with_speedups(frame: pd.DataFrame, speedups: pd.DataFrame | None) -> pd.DataFrame:
    """The speedups, or where the baseline has no ok row, the rows with none (a figure that
    says there is nothing to plot)."""
    return frame.assign(speedup=np.nan, paired=False) if speedups is None else speedups


@dataclass(frozen=True)
class DeviceFigures:
    """What each figure of one device draws (plot/figures.py: FIGURES)."""

    one_n: int | None  # the one N of the ok rows: the figures against N are left out
    time: LineFigure
    memory: LineFigure
    tflops: LineFigure
    speedup: LineFigure | None  # None without a baseline
    bandwidth: LineFigure | None  # None without decode rows with a GB/s
    error: LineFigure
    support: SupportGrid
    roofline: Roofline


def device_figures(
    frame: pd.DataFrame,
    env: dict,
    fits: pd.DataFrame,
    speedups: pd.DataFrame | None,
    baseline: str | None,
    name: str,
) -> DeviceFigures:
    """Every figure's data for one device's rows (with_series and family already added)."""
    return DeviceFigures(
        one_n=one_n(frame),
        time=time_lines(frame, fits, name),
        memory=memory_lines(frame, fits, name),
        tflops=tflops_lines(frame, name),
        speedup=None
        if not baseline
        else speedup_lines(_with_speedups(frame, speedups), baseline, name),
        bandwidth=bandwidth_lines(frame, env, name),
        error=error_lines(frame, name),
        support=support_grid(frame, name),
        roofline=roofline(frame, env.get("ceilings") or {}, name),
    )
