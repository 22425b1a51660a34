"""The scaling fit over each series (derived.py says what a series is and its N).

For each series and metric (``time_ms``, ``peak_mem_mib``) we fit
``log(metric) = slope * log(N) + c`` by least squares over the points *not dominated by
fixed overhead*: with ``floor`` the smallest value of the metric in the series, keep every
point with ``N >= N0`` where N0 is the smallest N whose value is at least
``OVERHEAD_FACTOR`` (4) times ``floor``. Past N0 a constant overhead is at most a quarter
of the value, so it bends the log-log line only a little, while the flat small-N region
(launch latency, allocator granularity, fixed workspaces) that would drag the slope towards
0 is dropped. The rule needs no tuning per device and keeps every large-N point, which is
where the exponent is decided. Its cost: on a pure power law it drops the first point (N^2
on a doubling grid) or the first two (N^1).

When fewer than ``MIN_FIT_POINTS`` (3) distinct lengths survive the cut but the series has
at least 3, the 3 largest lengths are fitted instead and ``overhead_limited`` is True: with
``metric = a + c*N^p`` the log-log curve is concave, so that slope is a *lower bound* on p.
A series with fewer than 3 distinct lengths gets no fit: ``slope`` is NA and ``reason`` says
why. Non-positive values cannot be logged and are left out (counted in the reason). The
standard error is the OLS one, ``sqrt(SSR / (k - 2) / Sxx)`` in log space, and reflects
scatter only, not the overhead bias.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from attnbench.report.analyse.derived import (
    SERIES_KEY,
    contended,
    flag,
    groups,
    is_ok,
    length_axis,
    with_series,
)

FIT_METRICS = ("time_ms", "peak_mem_mib")
OVERHEAD_FACTOR = 4.0
MIN_FIT_POINTS = 3


def fit_loglog(
    n, y, *, overhead_factor: float = OVERHEAD_FACTOR, min_points: int = MIN_FIT_POINTS
) -> dict:
    """Least-squares slope of log(y) on log(n) past the overhead cut (module docstring).

    Returns slope, slope_se, n_points (points used), seq_min/seq_max (N range used),
    overhead_limited and reason (NA when there is nothing to say)."""
    n = pd.array(n, dtype="Float64").to_numpy(dtype=float, na_value=np.nan)
    y = pd.array(y, dtype="Float64").to_numpy(dtype=float, na_value=np.nan)
    valid = ~(np.isnan(n) | np.isnan(y))
    n, y = n[valid], y[valid]
    nonpos = int((y <= 0).sum())
    order = np.argsort(n[y > 0], kind="stable")
    n, y = n[y > 0][order], y[y > 0][order]
    out = {
        "slope": math.nan,
        "slope_se": math.nan,
        "n_points": 0,
        "seq_min": pd.NA,
        "seq_max": pd.NA,
        "overhead_limited": pd.NA,
        "reason": pd.NA,
    }
    notes = [f"{nonpos} non-positive values left out"] if nonpos else []
    lengths = np.unique(n)
    if len(lengths) < min_points:
        out["reason"] = "; ".join(
            [f"{len(lengths)} lengths with a value, a fit needs {min_points}", *notes]
        )
        return out
    above = n[y >= overhead_factor * y.min()]
    n0 = float(above.min()) if len(above) else math.inf
    keep = n >= n0
    limited = len(np.unique(n[keep])) < min_points
    if limited:
        keep = n >= float(lengths[-min_points])
        cut = (
            f"only N>={int(n0)} reaches {overhead_factor:g}x the minimum"
            if len(above)
            else f"never reaches {overhead_factor:g}x the minimum"
        )
        notes.insert(0, f"overhead-limited: {cut}, {min_points} largest N fitted (lower bound)")
    kept = {"n": n[keep], "y": y[keep]}
    x, ly = np.log(kept["n"]), np.log(kept["y"])
    xc = x - x.mean()
    sxx = float((xc**2).sum())
    slope = float((xc * (ly - ly.mean())).sum() / sxx)
    resid = ly - ly.mean() - slope * xc
    dof = len(x) - 2
    out.update(
        slope=slope,
        n_points=len(x),
        seq_min=int(kept["n"].min()),
        seq_max=int(kept["n"].max()),
        overhead_limited=limited,
        slope_se=float(math.sqrt((resid**2).sum() / dof / sxx)),
    )
    if notes:
        out["reason"] = "; ".join(notes)
    return out


def bound_mark(fit) -> str:
    """'≥' for an overhead-limited fit whose slope is positive past twice its standard error
    (a lower bound: a constant overhead flattens a positive slope); '' otherwise, since a
    negative or noise-only slope bounds nothing."""
    if not flag(fit["overhead_limited"]) or pd.isna(fit["slope"]):
        return ""
    se = 0.0 if pd.isna(fit["slope_se"]) else float(fit["slope_se"])
    return "≥" if float(fit["slope"]) - 2 * se > 0 else ""


def slope_text(slope: float) -> str:
    """A fitted slope to two decimals; a flat one reads 0.00 whichever side of 0 it fell."""
    return f"{slope:.2f}".replace("-0.00", "0.00")


def scaling_exponents(
    df: pd.DataFrame,
    metrics=FIT_METRICS,
    *,
    overhead_factor: float = OVERHEAD_FACTOR,
    min_points: int = MIN_FIT_POINTS,
) -> pd.DataFrame:
    """One row per (series, metric): SERIES_KEY, axis (the length N the series varies:
    seq_q, or seq_kv for a fixed-query series such as decode), metric, slope, slope_se,
    n_points, seq_min, seq_max (N range fitted), overhead_limited, n_ok, n_contended (fitted
    points that were contended), n_failed, failed (status
    counts of the failed rows, e.g. "1 oom"), reason (why there is no fit, or its caveat).

    Every series with any row appears; one whose rows all failed has slope NA and says so."""
    columns = [
        *SERIES_KEY,
        "axis",
        "metric",
        "slope",
        "slope_se",
        "n_points",
        "seq_min",
        "seq_max",
        "overhead_limited",
        "n_ok",
        "n_contended",
        "n_failed",
        "failed",
        "reason",
    ]
    if df.empty:
        return pd.DataFrame(columns=columns)
    df = with_series(df)
    rows = []
    ok = is_ok(df).to_numpy(dtype=bool)
    seq_n = df["seq_n"].to_numpy(dtype=float, na_value=np.nan)
    busy = contended(df).to_numpy(dtype=bool)
    values = {m: df[m].to_numpy(dtype=float, na_value=np.nan) for m in metrics}
    for key, pos in groups(df, SERIES_KEY):
        mine, failed = pos[ok[pos]], pos[~ok[pos]]
        counts = df["status"].iloc[failed].fillna("missing").value_counts()
        fail_note = ", ".join(f"{n} {s}" for s, n in counts.items()) if len(failed) else pd.NA
        for metric in metrics:
            fit = fit_loglog(
                seq_n[mine],
                values[metric][mine],
                overhead_factor=overhead_factor,
                min_points=min_points,
            )
            rows.append(
                {
                    **dict(zip(SERIES_KEY, key)),
                    "axis": length_axis(key[-1]),
                    "metric": metric,
                    "slope": fit["slope"],
                    "slope_se": fit["slope_se"],
                    "n_points": fit["n_points"],
                    "seq_min": fit["seq_min"],
                    "seq_max": fit["seq_max"],
                    "overhead_limited": fit["overhead_limited"],
                    "n_ok": len(mine),
                    "n_contended": _contended_in(seq_n[mine], busy[mine], fit),
                    "n_failed": len(failed),
                    "failed": fail_note,
                    "reason": fit["reason"],
                }
            )
    out = pd.DataFrame(rows, columns=columns)
    for c in ("slope", "slope_se"):
        out[c] = out[c].astype("Float64")
    for c in ("n_points", "seq_min", "seq_max", "n_ok", "n_contended", "n_failed"):
        out[c] = out[c].astype("Int64")
    out["overhead_limited"] = out["overhead_limited"].astype("boolean")
    out["failed"] = out["failed"].astype("string")
    out["reason"] = out["reason"].astype("string")
    return out


def _contended_in(seq_n: np.ndarray, busy: np.ndarray, fit: dict) -> int:
    """How many of the points a fit used (N in its fitted range: ``seq_n`` of a series' ok
    rows, ``busy`` whether each was contended) were contended."""
    if pd.isna(fit["seq_min"]):
        return 0
    used = (seq_n >= fit["seq_min"]) & (seq_n <= fit["seq_max"])
    return int((used & busy).sum())
