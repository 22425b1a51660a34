"""Scaling exponents, speedups and winners from a results frame: pandas in, pandas out.

Only rows with ``status == "ok"`` ever become numbers; failed rows keep their blank (NA)
metrics and are only counted, so a failure can never pass for a measurement.

Scaling fit rule
----------------
A *series* is one impl with everything in the case key fixed except the sequence length.
N is ``seq_q``. ``seq_kv`` either follows ``seq_q`` (``Skv=Sq``, or ``Skv=r*Sq`` for a
constant ratio r) or is held fixed (``Skv=<value>``); that relation is part of the series
key (column ``seq_kv_rule``), so a self-attention series and a fixed-Skv series are never
mixed in one fit.

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

from attnbench.case import MODES, Case, CaseError
from attnbench.models import ATTN_IMPLEMENTATIONS
from attnbench.store.schema import CASE_KEY

SEQ_COLUMNS = ("seq_q", "seq_kv")
CASE_COLUMNS = tuple(c for c in CASE_KEY if c != "impl")  # a case: everything but the impl
SERIES_KEY = (*(c for c in CASE_KEY if c not in SEQ_COLUMNS), "seq_kv_rule")
FIT_METRICS = ("time_ms", "peak_mem_mib")
OVERHEAD_FACTOR = 4.0
MIN_FIT_POINTS = 3


def flag(value) -> bool:
    """A nullable boolean cell as a plain bool: NA counts as False."""
    return value is not pd.NA and value is not None and bool(value)


def is_ok(df: pd.DataFrame) -> pd.Series:
    """Plain bool mask of rows with status ok (NA status is not ok)."""
    return df["status"].eq("ok").fillna(False).astype(bool)


def ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    return df[is_ok(df)]


def noisy(df: pd.DataFrame) -> pd.Series:
    """Ok rows whose timing samples spread too far to trust the median (measure.timing)."""
    from attnbench.measure.timing import NOISY_SPREAD

    spread = (df["time_ms_p80"] - df["time_ms_p20"]) / df["time_ms"]
    return (is_ok(df) & (spread > NOISY_SPREAD).fillna(False)).astype(bool)


def agreeing(df: pd.DataFrame) -> pd.Series:
    """Plain bool mask: ok and agrees is True (unknown agreement does not count)."""
    return is_ok(df) & df["agrees"].eq(True).fillna(False).astype(bool)


def seq_kv_rule(df: pd.DataFrame) -> pd.Series:
    """How seq_kv relates to seq_q within each set of cases that differ only in length.

    Rows with seq_kv == seq_q get ``Skv=Sq``. The others, per group, are labelled by their
    constant ratio (``Skv=2*Sq``) when that yields fewer series than labelling by the fixed
    seq_kv (``Skv=512``), and by the fixed seq_kv otherwise."""
    rule = pd.Series("Skv=Sq", index=df.index, dtype="string")
    cross = df[(df["seq_kv"] != df["seq_q"]).fillna(True).astype(bool)]
    if cross.empty:
        return rule
    group_cols = [c for c in SERIES_KEY if c not in ("impl", "seq_kv_rule")]
    for _, g in cross.groupby(group_cols, dropna=False, sort=False):
        ratio = g["seq_kv"].astype("Float64") / g["seq_q"].astype("Float64")
        if ratio.nunique() < g["seq_kv"].nunique():
            rule.loc[g.index] = [f"Skv={r:g}*Sq" for r in ratio]
        else:
            rule.loc[g.index] = [f"Skv={v}" for v in g["seq_kv"]]
    return rule


def with_series(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    out["seq_kv_rule"] = seq_kv_rule(out)
    return out


def case_family(df: pd.DataFrame) -> pd.Series:
    """A readable family label per row: mode, dtype, causal/full, head dim, and gqa/cross
    when they apply (batch, heads and lengths vary inside a family)."""
    if df.empty:
        return pd.Series([], index=df.index, dtype="string")
    multi_device = df["device"].nunique() > 1

    def label(r) -> str:
        causal = "full"
        if flag(r["causal"]):
            causal = "causal bottom-right" if r["causal_align"] == "bottom_right" else "causal"
        parts = [str(r["mode"]), str(r["dtype"]), causal, f"D{r['head_dim']}"]
        if r["mask"] not in ("none", None) and not pd.isna(r["mask"]):
            parts.append("window" + str(r["window"]) if r["mask"] == "window" else r["mask"])
        who = [str(r[c]) for c in ("model", "phase") if not pd.isna(r[c]) and r[c]]
        parts[:0] = who
        if r["kv_heads"] < r["heads"]:
            parts.append("gqa")
        if r["seq_kv"] != r["seq_q"]:
            parts.append("cross")
        if multi_device:
            parts.insert(0, str(r["device"]))
        return " ".join(parts)

    return pd.Series([label(r) for _, r in df.iterrows()], index=df.index, dtype="string")


def mode_rank(mode) -> int:
    """Position of a mode in MODES (fwd, bwd, fwd_bwd); unknown modes last."""
    return MODES.index(mode) if mode in MODES else len(MODES)


def family_order(df: pd.DataFrame) -> list[str]:
    """The case families of df, fwd before bwd before fwd_bwd, then by name."""
    if df.empty:
        return []
    fams = pd.DataFrame({"family": case_family(df), "rank": df["mode"].map(mode_rank)})
    fams = fams.drop_duplicates("family").sort_values(["rank", "family"])
    return list(fams["family"])


def fit_loglog(
    n, y, *, overhead_factor: float = OVERHEAD_FACTOR, min_points: int = MIN_FIT_POINTS
) -> dict:
    """Least-squares slope of log(y) on log(n) past the overhead cut (module docstring).

    Returns slope, slope_se, n_points (points used), seq_min/seq_max (N range used),
    overhead_limited and reason (NA when there is nothing to say)."""
    pts = pd.DataFrame({"n": pd.array(n, dtype="Float64"), "y": pd.array(y, dtype="Float64")})
    pts = pts.dropna()
    nonpos = int((pts["y"] <= 0).sum())
    pts = pts[pts["y"] > 0].sort_values("n")
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
    lengths = pts["n"].drop_duplicates()
    if len(lengths) < min_points:
        out["reason"] = "; ".join(
            [f"{len(lengths)} lengths with a value, a fit needs {min_points}", *notes]
        )
        return out
    floor = float(pts["y"].min())
    above = pts[pts["y"] >= overhead_factor * floor]
    n0 = float(above["n"].min()) if len(above) else math.inf
    kept = pts[pts["n"] >= n0]
    limited = kept["n"].nunique() < min_points
    if limited:
        kept = pts[pts["n"] >= float(lengths.iloc[-min_points])]
        cut = (
            f"only N>={int(n0)} reaches {overhead_factor:g}x the minimum"
            if len(above)
            else f"never reaches {overhead_factor:g}x the minimum"
        )
        notes.insert(0, f"overhead-limited: {cut}, {min_points} largest N fitted (lower bound)")
    x = np.log(kept["n"].to_numpy(dtype=float))
    ly = np.log(kept["y"].to_numpy(dtype=float))
    xc = x - x.mean()
    sxx = float((xc**2).sum())
    slope = float((xc * (ly - ly.mean())).sum() / sxx)
    resid = ly - ly.mean() - slope * xc
    dof = len(x) - 2
    out.update(
        slope=slope,
        n_points=len(kept),
        seq_min=int(kept["n"].min()),
        seq_max=int(kept["n"].max()),
        overhead_limited=limited,
        slope_se=float(math.sqrt((resid**2).sum() / dof / sxx)),
    )
    if notes:
        out["reason"] = "; ".join(notes)
    return out


def scaling_exponents(
    df: pd.DataFrame,
    metrics=FIT_METRICS,
    *,
    overhead_factor: float = OVERHEAD_FACTOR,
    min_points: int = MIN_FIT_POINTS,
) -> pd.DataFrame:
    """One row per (series, metric): SERIES_KEY, metric, slope, slope_se, n_points,
    seq_min, seq_max (N range fitted), overhead_limited, n_ok, n_failed, failed (status
    counts of the failed rows, e.g. "1 oom"), reason (why there is no fit, or its caveat).

    Every series with any row appears; one whose rows all failed has slope NA and says so."""
    columns = [
        *SERIES_KEY,
        "metric",
        "slope",
        "slope_se",
        "n_points",
        "seq_min",
        "seq_max",
        "overhead_limited",
        "n_ok",
        "n_failed",
        "failed",
        "reason",
    ]
    if df.empty:
        return pd.DataFrame(columns=columns)
    df = with_series(df)
    rows = []
    for key, g in df.groupby(list(SERIES_KEY), dropna=False, sort=True):
        ok = ok_rows(g)
        failed = g[~is_ok(g)]
        counts = failed["status"].fillna("missing").value_counts()
        fail_note = ", ".join(f"{n} {s}" for s, n in counts.items()) if len(failed) else pd.NA
        for metric in metrics:
            fit = fit_loglog(
                ok["seq_q"], ok[metric], overhead_factor=overhead_factor, min_points=min_points
            )
            rows.append(
                {
                    **dict(zip(SERIES_KEY, key)),
                    "metric": metric,
                    "slope": fit["slope"],
                    "slope_se": fit["slope_se"],
                    "n_points": fit["n_points"],
                    "seq_min": fit["seq_min"],
                    "seq_max": fit["seq_max"],
                    "overhead_limited": fit["overhead_limited"],
                    "n_ok": len(ok),
                    "n_failed": len(failed),
                    "failed": fail_note,
                    "reason": fit["reason"],
                }
            )
    out = pd.DataFrame(rows, columns=columns)
    for c in ("slope", "slope_se"):
        out[c] = out[c].astype("Float64")
    for c in ("n_points", "seq_min", "seq_max", "n_ok", "n_failed"):
        out[c] = out[c].astype("Int64")
    out["overhead_limited"] = out["overhead_limited"].astype("boolean")
    out["failed"] = out["failed"].astype("string")
    out["reason"] = out["reason"].astype("string")
    return out


def speedups(df: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Every row of df with baseline_time_ms and speedup = baseline time / impl time.

    speedup is NA unless both the row and the baseline's row for the same case are ok with
    a positive time; the baseline's own ok rows get exactly 1."""
    base = ok_rows(df[df["impl"] == baseline])
    base = base[list(CASE_COLUMNS) + ["time_ms"]].rename(columns={"time_ms": "baseline_time_ms"})
    base = base.drop_duplicates(list(CASE_COLUMNS))
    out = df.merge(base, on=list(CASE_COLUMNS), how="left")
    usable = (
        is_ok(out)
        & (out["time_ms"] > 0).fillna(False)
        & (out["baseline_time_ms"] > 0).fillna(False)
    )
    out["speedup"] = pd.array([pd.NA] * len(out), dtype="Float64")
    out.loc[usable, "speedup"] = out.loc[usable, "baseline_time_ms"] / out.loc[usable, "time_ms"]
    return out


def fastest_agreeing(df: pd.DataFrame) -> pd.DataFrame:
    """One row per case: the fastest impl among ok rows that agree with the reference, its
    time, the runner-up and how much slower it is (runner_up_time_ms / time_ms), and ``tie``:
    the win is within the noise (the two rows' p20-p80 ranges overlap, compare's rule; equal
    medians for rows without them).

    Cases where no impl agrees are kept with impl NA and a reason."""
    columns = [
        *CASE_COLUMNS,
        "family",
        "impl",
        "time_ms",
        "runner_up",
        "runner_up_time_ms",
        "margin",
        "tie",
        "n_agreeing",
        "n_rows",
        "reason",
    ]
    if df.empty:
        return pd.DataFrame(columns=columns)
    fam = case_family(df)
    good = agreeing(df) & (df["time_ms"] > 0).fillna(False).astype(bool)
    rows = []
    for key, g in df.assign(family=fam, _good=good).groupby(
        list(CASE_COLUMNS), dropna=False, sort=True
    ):
        cand = g[g["_good"]].sort_values(["time_ms", "impl"])
        row = {
            **dict(zip(CASE_COLUMNS, key)),
            "family": g["family"].iloc[0],
            "n_agreeing": len(cand),
            "n_rows": len(g),
            "impl": pd.NA,
            "time_ms": math.nan,
            "runner_up": pd.NA,
            "runner_up_time_ms": math.nan,
            "margin": math.nan,
            "tie": False,
            "reason": pd.NA,
        }
        if cand.empty:
            row["reason"] = "no impl is ok and agrees"
        else:
            row["impl"], row["time_ms"] = cand["impl"].iloc[0], float(cand["time_ms"].iloc[0])
            if len(cand) > 1:
                row["runner_up"] = cand["impl"].iloc[1]
                row["runner_up_time_ms"] = float(cand["time_ms"].iloc[1])
                row["margin"] = row["runner_up_time_ms"] / row["time_ms"]
                row["tie"] = _within_noise(cand.iloc[0], cand.iloc[1])
        rows.append(row)
    out = pd.DataFrame(rows, columns=columns)
    for c in ("time_ms", "runner_up_time_ms", "margin"):
        out[c] = out[c].astype("Float64")
    return out


def _within_noise(winner, runner_up) -> bool:
    lo, hi = runner_up.get("time_ms_p20"), winner.get("time_ms_p80")
    if pd.isna(lo) or pd.isna(hi):
        return bool(runner_up["time_ms"] <= winner["time_ms"])
    return bool(lo <= hi)


def seq_spans(won, lengths) -> str:
    """The lengths won as spans of consecutive lengths of the family: '128–512, 2048'."""
    order = sorted({int(n) for n in lengths})
    won = {int(n) for n in won}
    spans, start = [], None
    for i, n in enumerate(order):
        if n in won and start is None:
            start = n
        if n in won and (i + 1 == len(order) or order[i + 1] not in won):
            spans.append(str(n) if n == start else f"{start}–{n}")
            start = None
    return ", ".join(spans)


def wins_by_family(winners: pd.DataFrame) -> pd.DataFrame:
    """From fastest_agreeing: per family and winning impl, the cases won, the family's case
    count, the seq_q range of the wins, the lengths won as spans of the family's lengths
    (``spans``) and how many of the wins are ties (within the noise of the runner-up)."""
    columns = ["family", "impl", "wins", "cases", "seq_min", "seq_max", "spans", "ties"]
    if winners.empty:
        return pd.DataFrame(columns=columns)
    cases = winners.groupby("family").size().rename("cases")
    won = winners.dropna(subset=["impl"]).astype({"tie": bool})
    agg = (
        won.groupby(["family", "impl"])
        .agg(
            wins=("seq_q", "size"),
            seq_min=("seq_q", "min"),
            seq_max=("seq_q", "max"),
            ties=("tie", "sum"),
        )
        .reset_index()
    )
    lengths = winners.groupby("family")["seq_q"].agg(list)
    agg["spans"] = [
        seq_spans(won.loc[(won["family"] == f) & (won["impl"] == i), "seq_q"], lengths[f])
        for f, i in zip(agg["family"], agg["impl"])
    ]
    agg = agg.merge(cases.reset_index(), on="family")
    agg = agg.sort_values(["family", "wins", "impl"], ascending=[True, False, True])
    return agg[columns].reset_index(drop=True)


def support_counts(df: pd.DataFrame) -> pd.DataFrame:
    """Rows per (impl, family, status); a missing status counts as ``missing``."""
    if df.empty:
        return pd.DataFrame(columns=["impl", "family", "status", "count"])
    out = df.assign(family=case_family(df), status=df["status"].fillna("missing"))
    return out.groupby(["impl", "family", "status"]).size().rename("count").reset_index()


def disagreements(df: pd.DataFrame) -> pd.DataFrame:
    """Ok rows whose agreement is False or unknown, with their error, bound and reason."""
    ok = ok_rows(df)
    bad = ok[~ok["agrees"].eq(True).fillna(False).astype(bool)]
    return bad.sort_values(["impl", *CASE_COLUMNS]).reset_index(drop=True)


def failures(df: pd.DataFrame) -> pd.DataFrame:
    """Every non-ok row (status missing included)."""
    return df[~is_ok(df)].sort_values(["impl", *CASE_COLUMNS]).reset_index(drop=True)


def min_bytes(df: pd.DataFrame) -> pd.Series:
    """The fewest bytes each row's timed work can move (Case.bytes_moved, the denominator of
    ``gbps``); NA for a row that is not a valid case."""

    def one(r):
        try:
            return Case.from_row(r).bytes_moved()
        except (CaseError, TypeError, ValueError, KeyError):
            return pd.NA

    return pd.Series([one(r) for _, r in df.iterrows()], index=df.index, dtype="Float64")


def arithmetic_intensity(df: pd.DataFrame) -> pd.Series:
    """FLOPs per byte of the least traffic (``min_bytes``): x axis of the roofline."""
    return (df["flops"] / min_bytes(df)).astype("Float64")


def kernel_table(kernels: pd.DataFrame, top: int = 8) -> pd.DataFrame:
    """Per impl, its kernels (GPU) or ops (CPU) over every profiled case: calls, total time
    and share of the impl's profiled time; the ``top`` largest of each impl."""
    if kernels.empty:
        return kernels
    agg = kernels.groupby(["impl", "kernel"], as_index=False).agg(
        calls=("calls", "sum"), total_us=("total_us", "sum")
    )
    agg["share"] = agg["total_us"] / agg.groupby("impl")["total_us"].transform("sum")
    agg = agg.sort_values(["impl", "total_us"], ascending=[True, False])
    return agg.groupby("impl", as_index=False).head(top).reset_index(drop=True)


def recommendations(df: pd.DataFrame) -> pd.DataFrame:
    """Per (model, phase) of the rows from model presets: the impl that is fastest (and
    agrees with the reference) in the most cases, its wins, its median margin over the
    runner-up and median peak memory in the cases it won, and every other impl that was
    not ok or disagreed somewhere, with why. Ties in wins go to the lower median time.

    ``attn_implementation``: among the rows of transformers' attention functions (the hf_*
    impls, models.ATTN_IMPLEMENTATIONS), the transformers setting whose function wins the
    most cases by the same rule, and ``attn_wins`` its wins among them (NA without such
    rows)."""
    columns = [
        "model",
        "phase",
        "cases",
        "impl",
        "wins",
        "margin",
        "time_ms",
        "peak_mem_mib",
        "runner_up",
        "attn_implementation",
        "attn_wins",
        "not_run",
    ]
    rows_of_models = df[df["model"].fillna("").astype(str) != ""]
    if rows_of_models.empty:
        return pd.DataFrame(columns=columns)
    winners = fastest_agreeing(rows_of_models)
    hf_rows = rows_of_models[rows_of_models["impl"].isin(ATTN_IMPLEMENTATIONS)]
    hf_winners = fastest_agreeing(hf_rows)
    out = []
    for (model, phase), g in rows_of_models.groupby(["model", "phase"], dropna=False, sort=False):
        row = {"model": model, "phase": phase if isinstance(phase, str) else ""}
        row["cases"] = int(g[list(CASE_COLUMNS)].drop_duplicates().shape[0])
        hf_best, hf_counts = _most_wins(_of(hf_winners, model, phase))
        if hf_best is not None:
            row.update(
                attn_implementation=ATTN_IMPLEMENTATIONS[hf_best],
                attn_wins=int(hf_counts.loc[hf_best, "wins"]),
            )
        w = _of(winners, model, phase)
        best, counts = _most_wins(w)
        if best is not None:
            won = w[w["impl"] == best]
            mem = g[(g["impl"] == best) & agreeing(g)]["peak_mem_mib"].dropna()
            row.update(
                impl=best,
                wins=int(counts.loc[best, "wins"]),
                margin=float(won["margin"].median()) if won["margin"].notna().any() else None,
                time_ms=float(won["time_ms"].median()),
                peak_mem_mib=float(mem.median()) if len(mem) else None,
                runner_up=won["runner_up"].dropna().mode().iloc[0]
                if won["runner_up"].notna().any()
                else None,
            )
        row["not_run"] = _not_run(g)
        out.append(row)
    return pd.DataFrame(out, columns=columns)


def _of(winners: pd.DataFrame, model, phase) -> pd.DataFrame:
    """The won cases (impl not NA) of one model and phase."""
    if winners.empty:
        return winners
    w = winners[(winners["model"] == model) & (winners["phase"].fillna("") == (phase or ""))]
    return w[w["impl"].notna()]


def _most_wins(w: pd.DataFrame) -> tuple[str | None, pd.DataFrame | None]:
    """The impl winning the most cases of ``w`` (ties: the lower median time), and the wins
    and median time of each impl."""
    if w.empty:
        return None, None
    counts = w.groupby("impl").agg(wins=("impl", "size"), time=("time_ms", "median"))
    return counts.sort_values(["wins", "time"], ascending=[False, True]).index[0], counts


def _not_run(g: pd.DataFrame) -> str:
    """Impls with a row that is not ok or disagrees, each with its first reason."""
    bad = g[~agreeing(g)]
    parts = []
    for impl, rows in bad.groupby("impl", sort=True):
        first = rows.iloc[0]
        status = first["status"] if first["status"] != "ok" else "disagrees"
        reason = str(first["reason"]).split(";")[0] if not pd.isna(first["reason"]) else ""
        n = f" in {len(rows)}/{len(g[g['impl'] == impl])} cases"
        parts.append(f"{impl}: {status}{n}" + (f" ({reason})" if reason else ""))
    return "; ".join(parts)
