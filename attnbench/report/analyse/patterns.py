"""The analysis of packed documents and sparse patterns (masks document,
block_sparse, strided): wasted work per impl, and which impls exploit sparsity.

Wasted work: ``flops`` counts the kept (query, key) pairs only; ``work_flops`` the pairs the
impl's computation covers, as the impl declares it (registry ``work``). Their ratio is the
useful share; 1 - that share went to padding or masked entries.

Sparsity: per series (one impl, N varies), the time is fitted against N with
scaling.fit_loglog (its overhead cut picks the points), and over exactly those points the
kept pairs (``flops``, proportional to them within a series) against N (exponent ``a``) and
the time against the kept pairs (exponent ``b``). An impl that skips the masked work has
time proportional to the kept pairs, b = 1; one that computes every pair and masks has time
like N^2 = pairs^(2/a), b = 2/a. The verdict says which one b is within TOL of; neither
(e.g. time growing like N^1.5 while the pairs grow like N^1.03: b = 1.47) is "cannot tell",
and so is a series whose two predictions lie within 2 TOL of each other (pairs growing
nearly like N^2), since fitted exponents scatter by a tenth or two on a CPU.
"""

from __future__ import annotations

import pandas as pd

from attnbench.case import Case
from attnbench.report.analyse import derived, scaling

FLAT = 2.0  # a series whose time grows less than this over its lengths: overhead only
TOL = 0.2  # how far the time-vs-pairs exponent may lie from a prediction (1, or 2/a)


def _pattern_rows(df: pd.DataFrame) -> pd.DataFrame:
    if "pattern" not in df or df.empty:
        return df.iloc[0:0]
    return derived.ok_rows(df[df["pattern"].notna()])  # the kinds with a spec


def wasted_work(df: pd.DataFrame) -> pd.DataFrame:
    """Ok rows of pattern masks: case, impl, flops, work_flops, useful_pct (100 flops /
    work_flops; NA where the impl declares no work), time_ms, agrees."""
    rows = _pattern_rows(df)
    if "work_flops" not in rows:  # results written before the column existed
        rows = rows.assign(work_flops=pd.Series(pd.NA, index=rows.index, dtype="Float64"))
    out = pd.DataFrame(
        {
            "case": derived.per_case(rows, lambda r: Case.from_row(r).label()),
            "impl": rows["impl"],
            "flops": rows["flops"],
            "work_flops": rows["work_flops"],
            "useful_pct": 100 * rows["flops"] / rows["work_flops"],
            "time_ms": rows["time_ms"],
            "agrees": rows["agrees"],
        }
    )
    return out.sort_values(["case", "time_ms"], kind="stable")


def sparsity_fits(df: pd.DataFrame) -> pd.DataFrame:
    """One row per pattern series: SERIES_KEY, pairs_exp (kept pairs vs N), time_vs_n,
    time_vs_pairs (slopes over the same points, NA without a fit), n_points, verdict."""
    rows = derived.with_series(_pattern_rows(df))
    out = []
    for key, g in rows.groupby(list(derived.SERIES_KEY), dropna=False, sort=True):
        by_n = scaling.fit_loglog(g["seq_q"], g["time_ms"])
        if by_n["n_points"]:  # the points the time's fit kept, for all three fits
            g = g[g["seq_q"].between(by_n["seq_min"], by_n["seq_max"]) & (g["time_ms"] > 0)]
        pairs = scaling.fit_loglog(g["seq_q"], g["flops"], overhead_factor=0.0)
        by_pairs = scaling.fit_loglog(g["flops"], g["time_ms"], overhead_factor=0.0)
        out.append(
            {
                **dict(zip(derived.SERIES_KEY, key)),
                "pairs_exp": pairs["slope"],
                "time_vs_n": by_n["slope"],
                "time_vs_pairs": by_pairs["slope"],
                "n_points": by_n["n_points"],
                "verdict": verdict(pairs["slope"], by_pairs["slope"], by_n, g["time_ms"]),
            }
        )
    return pd.DataFrame(out)


def verdict(pairs_exp: float, pairs_time_exp: float, by_n: dict, times: pd.Series) -> str:
    """Whether the time follows the kept pairs, from the pairs' exponent in N, the time's
    exponent in the pairs (both over the points of the time's fit in N), that fit
    (scaling.fit_loglog's result) and the times themselves."""
    reason = by_n["reason"]
    if pd.isna(by_n["slope"]) or pd.isna(pairs_exp) or pd.isna(pairs_time_exp):
        return f"no fit: {reason}" if not pd.isna(reason) else "no fit"
    if times.max() < FLAT * times.min():
        return f"cannot tell: the time grows less than {FLAT:g}x, fixed overhead dominates it"
    dense = 2.0 / pairs_exp if pairs_exp > 0 else float("inf")  # b of an impl that masks
    if dense - 1.0 <= 2 * TOL:
        return (
            f"cannot tell: kept pairs grow like N^{pairs_exp:.2f}, too close to N^2 "
            f"(time following them: pairs^1; computing every pair: pairs^{dense:.2f})"
        )
    if abs(pairs_time_exp - 1.0) <= TOL:
        return "exploits sparsity (time follows the kept pairs)"
    if abs(pairs_time_exp - dense) <= TOL:
        return f"masks only (time grows like N^2 = pairs^{dense:.2f})"
    return (
        f"cannot tell: time grows like pairs^{pairs_time_exp:.2f}, neither like the kept "
        f"pairs (pairs^1) nor like N^2 (pairs^{dense:.2f})"
    )
