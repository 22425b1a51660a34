"""What a "metric vs N" figure draws (plot/layout.line_figure draws it): its title, its
panels (facets of mode x causal and of whatever else varies besides the lengths) and, per
panel, one line per impl: the impl's ok points with a value, against the length its series
varies (derived.with_series: seq_q, or the cache length seq_kv in a decode series).

Rules the figures share, decided here once:
  * only ok rows become points; an impl's failed rows in a panel are counted in its legend
    label ("naive (1 oom)"), so that a line that stops early is explained;
  * a line with the same values as one before it on its panel (to 0.1%) says so
    ("(same as naive)"), since it would hide under the other;
  * the suptitle names the device, the dtype and every value held fixed (but those that
    say nothing: Hkv = H, the default mask and level, a blank).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from attnbench.dims import DIMS, SPEC_COLUMNS
from attnbench.report.analyse import derived, scaling

FACET_COLUMNS = ("mode", "causal")
# every series key column besides the impl and the facets: its title prefix (dims.py)
CONFIG_LABELS = {d.name: d.title_prefix for d in DIMS} | {"seq_kv_rule": "", "batch_rule": ""}
CONFIG_COLUMNS = tuple(c for c in derived.SERIES_KEY if c not in ("impl", *FACET_COLUMNS))
# what a line figure's panels, lines and extras read besides the metric and its band: the
# frame is cut to them before it is grouped (a results row has some 80 columns, and grouping
# copies every one of them per panel and impl)
LINE_COLUMNS = (
    *derived.SERIES_KEY,
    *("status", "agrees", "seq_n", "seq_q", "seq_kv"),
    *("time_ms", "time_ms_p20", "time_ms_p80", "peak_mem_mib"),  # noisy points, memory guides
    *("err_bound", "speedup", "caveat", "ratio"),  # bounds, caveats, the gate
)


@dataclass(frozen=True)
class Line:
    """One impl's line on a panel."""

    impl: str
    label: str  # legend text: impl, its suffix (fitted slope), failed rows, "(same as X)"
    x: np.ndarray  # the length N of each ok point with a value, ascending
    y: np.ndarray  # its value
    band: tuple[np.ndarray, np.ndarray] | None  # (low, high) per point, NaN where missing
    noisy: np.ndarray  # bool per point: a time whose samples spread too far (time_ms only)
    flagged: np.ndarray  # bool per point: disagrees with the reference or was not checked
    unchecked: bool  # some point's agreement is unknown
    same_as: str | None  # the impl drawn before it on the panel with the same values


@dataclass(frozen=True)
class Panel:
    title: str
    axis: str  # the length on the x axis: seq_q, or seq_kv for a decode series
    seqs: tuple[int, ...]  # every length of the panel's rows (the x ticks)
    lines: tuple[Line, ...]  # impls in name order, those with an ok point
    extra: object = None  # what the figure draws besides the lines (figure_data.py)


@dataclass(frozen=True)
class LineFigure:
    title: str
    y: str  # the metric drawn
    impls: tuple[str, ...]  # every impl of the rows (their colours: style.impl_style)
    panels: tuple[Panel, ...]  # those with an ok point; none: nothing to plot
    absent: tuple[str, ...]  # impls without an ok point with a value


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


def _fail_note(status: np.ndarray) -> str:
    """The failed rows of an impl on a panel counted by status (`` (1 oom)``)."""
    if not len(status):
        return ""
    counts = pd.Series(status, dtype=object).fillna("missing").value_counts()
    return " (" + ", ".join(f"{n} {s}" for s, n in counts.items()) + ")"


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Two lines with the same values to 0.1% (relative only: errors near 1e-7 are not the
    same because both are small)."""
    return bool(np.allclose(a, b, rtol=1e-3, atol=0.0))


class _Columns:
    """A line figure's columns as arrays, read once for every panel and impl (positions:
    rows of the frame, which is indexed 0..n-1)."""

    def __init__(self, df: pd.DataFrame, y: str, band):
        self.impl = df["impl"].to_numpy(dtype=object)
        self.status = df["status"].to_numpy(dtype=object, na_value=None)
        self.ok = df["_ok"].to_numpy(dtype=bool)
        self.has = self.ok & df[y].notna().to_numpy(dtype=bool)
        self.x = df["seq_n"].to_numpy(dtype=float)
        self.y = df[y].to_numpy(dtype=float, na_value=np.nan)
        self.band = [df[c].to_numpy(dtype=float, na_value=np.nan) for c in band or ()]
        # noisy points are marked on the time figure only
        noisy = derived.noisy(df) if y == "time_ms" else pd.Series(False, index=df.index)
        self.noisy = noisy.to_numpy(dtype=bool)
        self.flagged = ~df["agrees"].eq(True).fillna(False).to_numpy(dtype=bool)
        self.unknown = df["agrees"].isna().to_numpy(dtype=bool)

    def line(self, rows: np.ndarray, label: str, drawn: dict) -> Line | None:
        """One impl's ok points with a value among ``rows`` (None: it has none); ``drawn``:
        the lines before it on the panel, impl -> values, to which it adds its own."""
        pts = rows[self.has[rows]]
        if not len(pts):
            return None
        pts = pts[np.argsort(self.x[pts], kind="stable")]
        impl = str(self.impl[rows[0]])
        v = self.y[pts]
        twin = next((o for o, w in drawn.items() if len(w) == len(v) and _same(w, v)), None)
        drawn[impl] = v
        return Line(
            impl=impl,
            label=label + (f" (same as {twin})" if twin else ""),
            x=self.x[pts],
            y=v,
            band=tuple(c[pts] for c in self.band) if self.band else None,
            noisy=self.noisy[pts],
            flagged=self.flagged[pts],
            unchecked=bool(self.unknown[pts].any()),
            same_as=twin,
        )


def line_figure(
    df: pd.DataFrame,
    y: str,
    what: str,
    device_name: str | None,
    *,
    band: tuple[str, str] | None = None,
    suffix: Callable | None = None,
    extra: Callable | None = None,
) -> LineFigure:
    """Each panel's lines of ``y`` vs the series' length over ok rows. ``suffix(impl, row)``:
    a legend suffix per impl (from its first row on the panel); ``extra(rows)``: what a
    panel draws besides its lines."""
    df = derived.with_series(df)
    heading = title(what, df, device_name)
    columns = [*dict.fromkeys(c for c in (*LINE_COLUMNS, y, *(band or ())) if c in df)]
    df = df[columns].reset_index(drop=True)
    df = df.assign(_ok=derived.is_ok(df))  # once: panels and impls filter by it
    cols = _Columns(df, y, band)
    out = []
    for ptitle, g in panels(df):
        rows = g.index.to_numpy()
        if not cols.has[rows].any():
            continue
        drawn: dict[str, np.ndarray] = {}
        lines = []
        for impl in sorted({i for i in cols.impl[rows] if not pd.isna(i)}):
            mine = rows[cols.impl[rows] == impl]
            label = impl + (suffix(impl, df.iloc[mine[0]]) if suffix else "")
            label += _fail_note(cols.status[mine[~cols.ok[mine]]])
            lines.append(cols.line(mine, label, drawn))
        axis = derived.length_axis(g["seq_kv_rule"].iloc[0])
        seqs = tuple(sorted({int(s) for s in g["seq_n"]}))
        kept = tuple(line for line in lines if line is not None)
        out.append(Panel(ptitle, axis, seqs, kept, extra(g) if extra else None))
    return LineFigure(
        title=heading,
        y=y,
        impls=tuple(df["impl"].dropna().unique()),
        panels=tuple(out),
        absent=tuple(sorted(set(df["impl"].dropna()) - set(cols.impl[cols.has]))),
    )


def slope_suffix(fits: pd.DataFrame | None, metric: str) -> Callable | None:
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

    def suffix(impl, first) -> str:  # a panel holds one series per impl: its first row's
        m = by_series.get((impl, *(_cell(first[c]) for c in key)))
        if m is None or pd.isna(m["slope"]):
            return "  (no fit)"
        bound = scaling.bound_mark(m)
        n_busy = m.get("n_contended")
        busy = f", {n_busy} contended pts" if not pd.isna(n_busy) and n_busy else ""
        return f"  slope {bound}{scaling.slope_text(m['slope'])} ± {m['slope_se']:.2f}{busy}"

    return suffix


def _cell(value):
    """A series key cell as a dict key: every blank alike."""
    return None if pd.isna(value) else value
