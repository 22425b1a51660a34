"""The report's analysis sections of one device's rows, rendered from its analysis
(analysis.DeviceAnalysis): recommendations, who wins where, speedups, scaling exponents and
numerical agreement."""

from __future__ import annotations

import pandas as pd

from attnbench.measure import precision
from attnbench.report.analyse import derived
from attnbench.report.analyse.derived import DTYPE_BYTES
from attnbench.report.decide.verdicts import AXIS_NAME
from attnbench.report.render.header import borrowed_kernels, case_label
from attnbench.report.render.markdown import MISSING, fold_long, folded, table


def winners_section(a) -> list[str]:
    """Who wins where, from a DeviceAnalysis (analysis.py)."""
    winners, wins = a.winners, a.wins
    lines = [
        "### Who wins where",
        "",
        "Fastest impl per case among the ok rows that agree with the reference, counted "
        "per case family (N: the lengths it won, a–b where it won every length between; Skv: "
        "the cache lengths, in a decode family; "
        "margin: median of runner-up time / winner time, the runner-up being the fastest "
        "*other kernel*: impls that ran the winner's kernel (the backend column: `sdpa` "
        "dispatching to cuDNN) are one contestant, named as the same kernel; ties: wins "
        "within the noise of the runner-up, "
        + (
            "whose time over the winner's, paired per round, has a 95% interval containing 1; "
            if a.rounds is not None
            else "whose p20–p80 range overlaps the winner's (this run has no rounds); "
        )
        + "marked: wins that are not ties but rest on contended rows, a paired interval "
        f"wider than {derived.WIDE_INTERVAL:g}x (hi / lo) or noisy rows).",
        "",
    ]
    if winners.empty:
        return lines + ["No cases.", ""]
    rows = []
    order = {f: i for i, f in enumerate(a.families)}
    borrowed = set(a.frame.loc[borrowed_kernels(a.frame), "impl"])  # said where they win
    for fam, g in sorted(winners.groupby("family"), key=lambda t: order.get(t[0], 0)):
        w = wins[wins["family"] == fam]
        text = [
            ("**{}**" if i == 0 else "{}").format(
                r.impl + (" (PyTorch's kernels)" if r.impl in borrowed else "")
            )
            + (f" (same kernel as {r.same_kernel})" if r.same_kernel else "")
            + f" {r.wins}/{r.cases} ({r.axis} {r.spans}"
            + (f"; {r.ties} tie{'s' if r.ties > 1 else ''}" if r.ties else "")
            + (f"; {r.marked} marked: {r.marks}" if r.marked else "")
            + ")"
            for i, r in enumerate(w.itertuples())
        ]
        none = int(g["impl"].isna().sum())
        if none:
            text.append(f"no agreeing impl: {none}/{len(g)}")
        top = w["impl"].iloc[0] if len(w) else None
        margin = g.loc[g["impl"] == top, "margin"].dropna()
        rows.append(
            {
                "family": fam,
                "wins": "; ".join(text),
                "margin": float(margin.median()) if len(margin) else None,
            }
        )
    lines.append(
        table(
            pd.DataFrame(rows),
            {
                "family": "case family",
                "wins": "fastest agreeing impl (cases won)",
                "margin": "margin of the top winner",
            },
            formats={"margin": lambda m: f"{m:.2f}x"},
        )
    )
    return lines


def speedup_section(a) -> list[str]:
    """Speedups against the baseline, from a DeviceAnalysis (analysis.py)."""
    df, baseline = a.frame, a.baseline
    if not baseline:
        return [
            "### Speedup",
            "",
            "No impl of this run is registered as the baseline "
            "(`register(..., baseline=True)`), so no speedups are computed; pick one with "
            "`attnbench report --baseline IMPL`.",
            "",
        ]
    lines = [f"### Speedup vs {baseline}", ""]
    if a.speedups is None:
        impls = ", ".join(sorted(df["impl"].dropna().unique()))
        return lines + [
            f"The baseline `{baseline}` has no ok rows in this run, so no speedups "
            f"are computed; choose another with `--baseline` (impls: {impls}).",
            "",
        ]
    sp = a.speedups
    sp = sp[(sp["impl"] != baseline) & sp["speedup"].notna()]
    paired = bool(sp["paired"].eq(True).any())
    lines += [
        f"{baseline} time / impl time over the cases where both are ok (above 1: faster "
        f"than {baseline}). "
        + (
            "Paired per round (the two impls timed in the same interleaved rounds), with "
            "each case's 95% interval in brackets; tie: the interval contains 1. "
            if paired
            else "The ratio of the two medians (this run has no rounds, so no intervals). "
        )
        + "Marked: cases that rest on contended rows, "
        + (
            f"an interval wider than {derived.WIDE_INTERVAL:g}x (hi / lo)."
            if paired
            else "or noisy rows (p20–p80 spread: the measurement checks)."
        ),
        "",
    ]
    if sp.empty:
        return lines + ["No case has both the baseline and another impl ok.", ""]
    agg = (
        sp.groupby(["impl", "family"], sort=True)["speedup"]
        .agg(["size", "median", "min", "max"])
        .reset_index()
    )
    cases = {k: g for k, g in sp.groupby(["impl", "family"], sort=True)}
    agg["ties"] = [int(_ties(cases[k]).sum()) for k in zip(agg["impl"], agg["family"])]
    agg["marked"] = [
        int(cases[k]["caveat"].fillna("").astype(bool).sum())
        for k in zip(agg["impl"], agg["family"])
    ]
    order = {f: i for i, f in enumerate(a.families)}
    agg = agg.sort_values(
        ["impl", "family"], key=lambda c: c.map(order) if c.name == "family" else c
    )
    x = lambda v: f"{v:.2f}x"  # noqa: E731
    columns = {
        "impl": "impl",
        "family": "case family",
        "size": "cases",
        "median": "median",
        "min": "min",
        "max": "max",
        "ties": "ties",
        "marked": "marked",
    }
    if not paired:
        del columns["ties"]
    lines.append(table(agg, columns, formats={"median": x, "min": x, "max": x}))
    if paired:
        each = [(k, _each(cases[k])) for k in zip(agg["impl"], agg["family"])]
        lines += folded("Each case (what varies: speedup [95% interval])", _each_lines(each))
    return lines


def _each_lines(each: list) -> list[str]:
    """Per (impl, family), its cases one per line."""
    lines = []
    for (impl, family), texts in each:
        lines += [f"- **{impl}**, {family}:", *(f"  - {t}" for t in texts)]
    return lines


def _ties(sp: pd.DataFrame) -> pd.Series:
    """Speedups whose paired interval contains 1."""
    return (sp["speedup_lo"].le(1) & sp["speedup_hi"].ge(1)).fillna(False).astype(bool)


def _each(sp: pd.DataFrame) -> list[str]:
    """One (impl, family)'s cases in order of N, each labelled by what varies among them."""
    sp = sp.sort_values("seq_n")
    labels = derived.case_labels(sp)
    return [_speedup_text(r, labels[i]) for i, r in sp.iterrows()]


def _speedup_text(r, label: str) -> str:
    """One case's speedup: 'B=1 Sq=4: 1.32x [1.25, 1.40]', and 'tie' or its caveat after."""
    text = f"{label or r['seq_n']}: {r['speedup']:.2f}x"
    if not pd.isna(r["speedup_lo"]):
        text += f" [{r['speedup_lo']:.2f}, {r['speedup_hi']:.2f}]"
        if r["speedup_lo"] <= 1 <= r["speedup_hi"]:
            text += " tie"
    return text + (f" ({r['caveat']})" if not pd.isna(r["caveat"]) and r["caveat"] else "")


def _slope_text(r) -> str:
    if pd.isna(r["slope"]):
        return MISSING
    bound = derived.bound_mark(r)
    return (
        f"{bound}{derived.slope_text(r['slope'])} ± {r['slope_se']:.2f} "
        f"({r['n_points']} pts, {AXIS_NAME.get(r['axis'], 'N')} {r['seq_min']}–{r['seq_max']})"
    )


def _notes(by: dict, first) -> str:
    notes = []
    for m in derived.FIT_METRICS:
        if m not in by or pd.isna(by[m]["reason"]):
            continue
        # the overhead-limited caveat is the ≥ sign, explained above the table
        parts = [
            part
            for part in str(by[m]["reason"]).split("; ")
            if not part.startswith("overhead-limited")
        ]
        if parts:
            notes.append(f"{m}: {'; '.join(parts)}")
    busy = max(0 if pd.isna(n := by[m].get("n_contended", 0)) else int(n) for m in by)
    if busy:
        notes.append(f"fitted on {busy} contended row(s): the exponent may be off")
    if not pd.isna(first["failed"]):
        notes.append(f"failed rows: {first['failed']}")
    return "; ".join(notes)


def _unfitted_line(unfit: list) -> list[str]:
    """The series with no fit of any metric, in one line: how many, why, which impls."""
    if not unfit:
        return []
    why: dict[str, list] = {}
    for g in unfit:
        reason = g["reason"].dropna()
        why.setdefault(str(reason.iloc[0]) if len(reason) else "no fit", []).append(g)
    parts = []
    for reason, groups in why.items():
        impls = sorted({str(g["impl"].iloc[0]) for g in groups})
        failed = sum(int(g["n_failed"].iloc[0]) for g in groups)
        more = f", {failed} failed rows (see non-ok rows)" if failed else ""
        relations = ", ".join(sorted({str(g["seq_kv_rule"].iloc[0]) for g in groups}))
        parts.append(f"{reason} ({len(groups)} series of {', '.join(impls)}; {relations}{more})")
    return [f"No fit for {len(unfit)} series: {'; '.join(parts)}.", ""]


def exponents_section(fits: pd.DataFrame) -> list[str]:
    """Scaling exponents from derived.scaling_exponents with a ``series`` label column (a
    DeviceAnalysis's fits); series without any fit collapse into one line."""
    lines = [
        "### Scaling exponents",
        "",
        "Least-squares slope of log(metric) vs log(N), N = seq_q (in a decode series, where "
        "the queries are fixed, N = seq_kv, the cache length: Skv below), over the points past "
        "the fixed-overhead cut (first N where the metric reaches 4x its minimum; "
        'rule and rationale: docs/reports.md, "Fit rule"). ≥ marks an overhead-limited fit '
        "(fewer than 3 lengths past the cut, the 3 largest fitted): a lower bound "
        "when the only departure from a power law is a constant overhead. "
        "No fit on fewer than 3 lengths. Series without any ok row are left out (see "
        "non-ok rows).",
        "",
    ]
    fits = fits[fits["n_ok"] > 0]
    if fits.empty:
        return lines + ["No series with ok rows.", ""]
    if fits["batch_rule"].astype(str).str.startswith("B·N=").any():
        lines += [
            "At a fixed token count (B·N=…, as the race sweeps), the batch shrinks as N "
            "grows: full attention's time ∝ B·N² = tokens·N, so a time exponent of 1 there "
            "*is* the quadratic cost per sequence (a linear-cost kernel would show 0), and "
            "memory that grows with B·N (inputs, output, a tiled kernel's state) is flat "
            "(exponent 0); a kernel that held the N×N scores would show 1.",
            "",
        ]
    rows, unfit = [], []
    groups = fits.groupby(list(derived.SERIES_KEY), dropna=False, sort=True)
    groups = sorted(
        groups, key=lambda t: (t[1]["impl"].iloc[0], derived.mode_rank(t[1]["mode"].iloc[0]))
    )
    for _key, g in groups:
        if g["slope"].isna().all():
            unfit.append(g)
            continue
        first = g.iloc[0]
        by = {r["metric"]: r for _, r in g.iterrows()}
        rows.append(
            {
                "impl": first["impl"],
                "series": first["series"],
                "time": _slope_text(by["time_ms"]) if "time_ms" in by else MISSING,
                "mem": (_slope_text(by["peak_mem_mib"]) if "peak_mem_mib" in by else MISSING),
                "notes": _notes(by, first),
            }
        )
    if rows:
        table_text = _exponents_table(pd.DataFrame(rows))
        lines += fold_long("Exponents per series", [table_text], len(rows))
    return lines + _unfitted_line(unfit)


def _exponents_table(rows: pd.DataFrame) -> str:
    columns = {
        "impl": "impl",
        "series": "series (N varies)",
        "time": "time exponent",
        "mem": "memory exponent",
        "notes": "notes",
    }
    if not rows["notes"].astype(bool).any():
        del columns["notes"]
    return table(rows, columns)


def score_memory_lines(a) -> list[str]:
    """The series whose peak memory at their largest N holds a score matrix or more (B·Hq·Sq
    ·Skv elements of the case's dtype), in score matrices: a peak of several (scores and
    probabilities both kept, or float32 scores for half inputs) is said, not left to the
    reader to work out."""
    ok = derived.ok_rows(a.frame).dropna(subset=["peak_mem_mib"])
    if ok.empty or (ok["level"] != "op").all():
        return []
    # a series whose queries grow with N: a decode series (N the cache, Sq fixed) holds an
    # O(N) score row, and what else its peak holds (a GQA-expanded K/V copy) is not scores
    ok = ok[(ok["level"] == "op") & (ok["seq_q"] == ok["seq_n"])]
    if ok.empty:
        return []
    top = ok.loc[ok.groupby(list(derived.SERIES_KEY), dropna=False)["seq_n"].idxmax()]
    elements = top["batch"] * top["heads"] * top["seq_q"] * top["seq_kv"]
    ratio = top["peak_mem_mib"] * 2**20 / (elements * top["dtype"].map(DTYPE_BYTES).fillna(4))
    top = top.assign(ratio=ratio, series=derived.series_labels(top))[ratio >= 1]
    if top.empty:
        return []
    parts = [
        f"{r.impl} ({r.series}, N {r.seq_n}): {r.ratio:.1f}x"
        for r in top.sort_values(["impl", "series"]).itertuples()
    ]
    return [
        "Peak memory of the series that hold an N² buffer, in score matrices of the case's "
        "dtype at their largest N (2 or more: more than one N² buffer, such as probabilities "
        "kept beside the scores, or float32 scores for half inputs, as PyTorch's math backend "
        "computes them): " + "; ".join(parts) + ".",
        "",
    ]


def disagreement_section(a) -> list[str]:
    """Ok rows that disagree or were not checked, and those whose precision is below an
    fp32-accumulating kernel's, from a DeviceAnalysis (analysis.py)."""
    df, bad = a.frame, a.disagreements
    lines = ["### Numerical agreement", ""]
    if bad.empty:
        n = len(derived.ok_rows(df))
        lines += [f"All {n} ok rows agree with the float64 reference within their bound.", ""]
        return lines + _precision_lines(df)
    bad = bad.assign(
        case=[case_label(r) for _, r in bad.iterrows()],
        verdict=bad["agrees"].map({False: "disagrees"}).fillna("not checked"),
    )
    lines += [
        f"{len(bad)} ok row(s) disagree or were not checked: their times are real but "
        f"they are never counted as winners.",
        "",
    ]
    lines.append(
        table(
            bad,
            {
                "impl": "impl",
                "case": "case",
                "verdict": "verdict",
                "rel_err": "rel_err",
                "err_bound": "bound",
                "max_abs_err": "max_abs_err",
                "max_abs_bound": "max-abs bound",
                "reason": "reason",
            },
            formats={
                "rel_err": ".2e",
                "err_bound": ".2e",
                "max_abs_err": ".2e",
                "max_abs_bound": ".2e",
            },
        )
    )
    return lines + [""] + _precision_lines(df)


def _precision_lines(df: pd.DataFrame) -> list[str]:
    """Half-precision rows whose error is over its calibrated multiple of what a kernel that
    accumulates in float32 gets on the same inputs (``precision_low``): a flag apart from
    agreement, in measure/precision.py's words."""
    if "precision_low" not in df:  # runs made before the column existed
        return []
    low = derived.ok_rows(df)
    low = low[low["precision_low"].eq(True).fillna(False).astype(bool)]
    if low.empty:
        return []
    low = low.assign(case=[case_label(r) for _, r in low.iterrows()])
    return [
        f"{len(low)} ok row(s) have a precision below an fp32-accumulating kernel's "
        f"({precision.MEANING}).",
        "",
        table(
            low,
            {
                "impl": "impl",
                "case": "case",
                "precision_ratio": "precision ratio",
                "rel_err": "rel_err",
                "agrees": "agrees",
            },
            formats={"precision_ratio": ".2f", "rel_err": ".2e"},
        ),
    ]
