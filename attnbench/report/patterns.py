"""The report's sections for packed documents and sparse patterns (masks document,
block_sparse, strided): wasted work per impl, and which impls exploit sparsity.

Wasted work: ``flops`` counts the kept (query, key) pairs only; ``work_flops`` the pairs the
impl's computation covers, as the impl declares it (registry ``work``). Their ratio is the
useful share; 1 - that share went to padding or masked entries.

Sparsity: per series (one impl, N varies), the time is fitted against N and against the kept
pairs (``flops``, proportional to them within a series) with analysis.fit_loglog, and the
kept pairs against N (their exponent ``a``). An impl whose time exponent in N is nearer ``a``
than 2 follows the kept pairs (it exploits the sparsity); one nearer 2 only masks. When the
pairs grow nearly like N^2 (a >= PAIRS_DENSE, under half a power away) the fitted exponents,
scattered by a tenth or two on a CPU, cannot tell the two apart.
"""

from __future__ import annotations

import pandas as pd

from attnbench.case import Case
from attnbench.patterns import PATTERN_MASKS
from attnbench.report import analysis
from attnbench.report.markdown import MISSING, table

FLAT = 2.0  # a series whose time grows less than this over its lengths: overhead only
PAIRS_DENSE = 1.5  # kept pairs growing at least like N^1.5: N^a and N^2 too close to tell apart


def _pattern_rows(df: pd.DataFrame) -> pd.DataFrame:
    if "pattern" not in df or df.empty:
        return df.iloc[0:0]
    return analysis.ok_rows(df[df["mask"].isin(PATTERN_MASKS)])


def wasted_work(df: pd.DataFrame) -> pd.DataFrame:
    """Ok rows of pattern masks: case, impl, flops, work_flops, useful_pct (100 flops /
    work_flops; NA where the impl declares no work), time_ms, agrees."""
    rows = _pattern_rows(df)
    if "work_flops" not in rows:  # results written before the column existed
        rows = rows.assign(work_flops=pd.Series(pd.NA, index=rows.index, dtype="Float64"))
    out = pd.DataFrame(
        {
            "case": [Case.from_row(r).label() for _, r in rows.iterrows()],
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
    time_vs_pairs (slopes, NA without a fit), n_points, verdict."""
    rows = analysis.with_series(_pattern_rows(df))
    out = []
    for key, g in rows.groupby(list(analysis.SERIES_KEY), dropna=False, sort=True):
        pairs = analysis.fit_loglog(g["seq_q"], g["flops"], overhead_factor=0.0)
        by_n = analysis.fit_loglog(g["seq_q"], g["time_ms"])
        by_pairs = analysis.fit_loglog(g["flops"], g["time_ms"])
        out.append(
            {
                **dict(zip(analysis.SERIES_KEY, key)),
                "pairs_exp": pairs["slope"],
                "time_vs_n": by_n["slope"],
                "time_vs_pairs": by_pairs["slope"],
                "n_points": by_n["n_points"],
                "verdict": verdict(pairs["slope"], by_n, g["time_ms"]),
            }
        )
    return pd.DataFrame(out)


def verdict(pairs_exp: float, by_n: dict, times: pd.Series) -> str:
    """Whether the time follows the kept pairs, from the pairs' exponent, the time's fit in N
    (analysis.fit_loglog's result) and the times themselves."""
    time_exp, reason = by_n["slope"], by_n["reason"]
    if pd.isna(time_exp) or pd.isna(pairs_exp):
        return f"no fit: {reason}" if not pd.isna(reason) else "no fit"
    if times.max() < FLAT * times.min():
        return f"cannot tell: the time grows less than {FLAT:g}x, fixed overhead dominates it"
    if pairs_exp >= PAIRS_DENSE:
        return f"cannot tell: kept pairs grow like N^{pairs_exp:.2f}, as dense ones do"
    if abs(time_exp - pairs_exp) < abs(time_exp - 2.0):
        return "exploits sparsity (time follows the kept pairs)"
    return "masks only (time grows like N^2)"


def sections(df: pd.DataFrame, level: str = "##") -> list[str]:
    """The two sections, or nothing when the run has no ok row of a pattern mask."""
    waste = wasted_work(df)
    if waste.empty:
        return []
    lines = [
        f"{level}# Wasted work (packed documents, sparse patterns)",
        "",
        "Useful GFLOP counts the kept (query, key) pairs only (`flops`); work GFLOP the pairs "
        "each impl's computation covers, masked entries and padding included (`work_flops`, "
        "declared by the impl: the whole score matrix for naive and SDPA with a mask, the "
        "visited tiles for tiled and flex, one matrix per document for sdpa_nested, one "
        "padded matrix per document for sdpa_padded; docs/method.md). useful % = flops / "
        f"work_flops; {MISSING} where an impl declares no work.",
        "",
        table(
            waste.assign(flops=waste["flops"] / 1e9, work_flops=waste["work_flops"] / 1e9),
            {
                "case": "case",
                "impl": "impl",
                "flops": "useful GFLOP",
                "work_flops": "work GFLOP",
                "useful_pct": "useful %",
                "time_ms": "time ms",
                "agrees": "agrees",
            },
            formats={"useful_pct": ".1f"},
        ),
    ]
    fits = sparsity_fits(df)
    lines += [
        f"{level}# Sparsity: time against N and against kept pairs",
        "",
        "Per series (N varies): the exponent of the kept pairs in N, and of the time in N and "
        "in the kept pairs (least squares on log-log, the scaling exponents' overhead cut). "
        "Time following the kept pairs (time exponent in N near the pairs' one, in the pairs "
        "near 1) means the impl skips the masked work; near 2 in N it computes everything "
        "and masks.",
        "",
        table(
            fits.assign(series=[_series(r) for _, r in fits.iterrows()]),
            {
                "impl": "impl",
                "series": "series (N varies)",
                "pairs_exp": "kept pairs ∝ N^",
                "time_vs_n": "time ∝ N^",
                "time_vs_pairs": "time ∝ pairs^",
                "n_points": "points",
                "verdict": "verdict",
            },
            formats={"pairs_exp": ".2f", "time_vs_n": ".2f", "time_vs_pairs": ".2f"},
        ),
    ]
    return lines


def _series(r) -> str:
    causal = "causal" if analysis.flag(r["causal"]) else "full"
    return (
        f"{r['mode']} {causal} {r['mask']} {r['pattern']} {r['dtype']} B{r['batch']} "
        f"H{r['heads']} D{r['head_dim']}"
    )
