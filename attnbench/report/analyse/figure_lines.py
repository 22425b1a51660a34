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
from attnbench.report.analyse import derived

FACET_COLUMNS = ("mode", "causal")
# every series key column besides the impl and the facets: its title prefix (dims.py)
CONFIG_LABELS = {d.name: d.title_prefix for d in DIMS} | {"seq_kv_rule": "", "batch_rule": ""}
CONFIG_COLUMNS = tuple(c for c in derived.SERIES_KEY if c not in ("impl", *FACET_COLUMNS))


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
    impls: tuple[str, ...]  # every impl of the rows (their colours: layout.impl_style)
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


def _fail_note(ok: pd.Series, status: pd.Series) -> str:
    failed = status[~ok]
    if failed.empty:
        return ""
    counts = failed.fillna("missing").value_counts()
    return " (" + ", ".join(f"{n} {s}" for s, n in counts.items()) + ")"


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Two lines with the same values to 0.1% (relative only: errors near 1e-7 are not the
    same because both are small)."""
    return bool(np.allclose(a, b, rtol=1e-3, atol=0.0))


def _line(gi: pd.DataFrame, y: str, label: str, band, drawn: dict) -> Line | None:
    """One impl's ok points with a value on a panel (None: it has none); ``drawn``: the
    lines before it on the panel, impl -> values, to which it adds its own."""
    pts = gi[gi["_ok"] & gi[y].notna()].sort_values("seq_n")
    if pts.empty:
        return None
    impl = str(gi["impl"].iloc[0])
    v = pts[y].to_numpy(dtype=float)
    twin = next((o for o, w in drawn.items() if len(w) == len(v) and _same(w, v)), None)
    drawn[impl] = v
    noisy = derived.noisy(pts) if y == "time_ms" else pd.Series(False, index=pts.index)
    return Line(
        impl=impl,
        label=label + (f" (same as {twin})" if twin else ""),
        x=pts["seq_n"].to_numpy(dtype=float),
        y=v,
        band=tuple(pts[c].to_numpy(dtype=float, na_value=np.nan) for c in band) if band else None,
        noisy=noisy.to_numpy(dtype=bool),
        flagged=~pts["agrees"].eq(True).fillna(False).to_numpy(dtype=bool),
        unchecked=bool(pts["agrees"].isna().any()),
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
    """Each panel's lines of ``y`` vs the series' length over ok rows. ``suffix(impl, rows)``:
    a legend suffix per impl; ``extra(rows)``: what a panel draws besides its lines."""
    df = derived.with_series(df)
    df = df.assign(_ok=derived.is_ok(df))  # once: panels and impls filter by it
    shown = df["_ok"] & df[y].notna()
    out = []
    for ptitle, g in panels(df):
        if not (g["_ok"] & g[y].notna()).any():
            continue
        drawn: dict[str, np.ndarray] = {}
        lines = []
        for impl, gi in g.groupby("impl", sort=True):
            label = (
                impl + (suffix(impl, gi) if suffix else "") + _fail_note(gi["_ok"], gi["status"])
            )
            lines.append(_line(gi, y, label, band, drawn))
        axis = derived.length_axis(g["seq_kv_rule"].iloc[0])
        seqs = tuple(sorted({int(s) for s in g["seq_n"]}))
        kept = tuple(line for line in lines if line is not None)
        out.append(Panel(ptitle, axis, seqs, kept, extra(g) if extra else None))
    return LineFigure(
        title=title(what, df, device_name),
        y=y,
        impls=tuple(df["impl"].dropna().unique()),
        panels=tuple(out),
        absent=tuple(sorted(set(df["impl"].dropna()) - set(df.loc[shown, "impl"]))),
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
