"""The report's analysis sections of one device's rows, rendered from its analysis
(analysis.DeviceAnalysis): who wins where, speedups, scaling exponents, the score matrices
a peak holds and numerical agreement. They derive nothing: every table is the analysis's."""

from __future__ import annotations

import pandas as pd

from attnbench.measure import precision
from attnbench.report.analyse import derived, scaling
from attnbench.report.decide.verdicts import AXIS_NAME
from attnbench.report.render.markdown import MISSING, fold_long, folded, table


def winners_section(a) -> list[str]:
    """Who wins where, from a DeviceAnalysis (analysis.py)."""
    lines = [
        "### Who wins where",
        "",
        "Fastest impl per case among the ok rows that agree with the reference, counted "
        "per case family (N: the lengths it won, a–b where it won every length between; Skv: "
        "the cache lengths, in a decode family, at each number of new tokens Sq; "
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
    if not a.who_wins:
        return lines + ["No cases.", ""]
    rows = []
    for fam in a.who_wins:
        text = [
            ("**{}**" if i == 0 else "{}").format(
                r.impl + (" (PyTorch's kernels)" if r.borrowed else "")
            )
            + (f" (same kernel as {r.same_kernel})" if r.same_kernel else "")
            + f" {r.wins}/{r.cases} ({r.axis} {r.spans}"
            + (f"; {r.ties} tie{'s' if r.ties > 1 else ''}" if r.ties else "")
            + (f"; {r.marked} marked: {r.marks}" if r.marked else "")
            + ")"
            for i, r in enumerate(fam.wins.itertuples())
        ]
        if fam.no_agreeing:
            text.append(f"no agreeing impl: {fam.no_agreeing}/{fam.cases}")
        rows.append({"family": fam.family, "wins": "; ".join(text), "margin": fam.margin})
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
    baseline, sp = a.baseline, a.speedup_table
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
        return lines + [
            f"The baseline `{baseline}` has no ok rows in this run, so no speedups "
            f"are computed; choose another with `--baseline` (impls: {', '.join(sp.impls)}).",
            "",
        ]
    lines += [
        f"{baseline} time / impl time over the cases where both are ok (above 1: faster "
        f"than {baseline}). "
        + (
            "Paired per round (the two impls timed in the same interleaved rounds), with "
            "each case's 95% interval in brackets; tie: the interval contains 1. "
            if sp.paired
            else "The ratio of the two medians (this run has no rounds, so no intervals). "
        )
        + "Marked: cases that rest on contended rows, "
        + (
            f"an interval wider than {derived.WIDE_INTERVAL:g}x (hi / lo)."
            if sp.paired
            else "or noisy rows (p20–p80 spread: the measurement checks)."
        ),
        "",
    ]
    if sp.summary.empty:
        return lines + ["No case has both the baseline and another impl ok.", ""]
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
    if not sp.paired:
        del columns["ties"]
    lines.append(table(sp.summary, columns, formats={"median": x, "min": x, "max": x}))
    if sp.paired:
        lines += folded("Each case (what varies: speedup [95% interval])", _each_lines(sp))
    return lines


def _each_lines(sp) -> list[str]:
    """Per (impl, family) of a SpeedupTable, its cases one per line."""
    lines = []
    for (impl, family), cases in zip(zip(sp.summary["impl"], sp.summary["family"]), sp.cases):
        texts = [_speedup_text(r, r["label"]) for _, r in cases.iterrows()]
        lines += [f"- **{impl}**, {family}:", *(f"  - {t}" for t in texts)]
    return lines


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
    bound = scaling.bound_mark(r)
    return (
        f"{bound}{scaling.slope_text(r['slope'])} ± {r['slope_se']:.2f} "
        f"({r['n_points']} pts, {AXIS_NAME.get(r['axis'], 'N')} {r['seq_min']}–{r['seq_max']})"
    )


def _notes(s) -> str:
    """A fitted series' notes (exponents.SeriesFits): its fits' reasons, contention, failures."""
    notes = []
    for m in scaling.FIT_METRICS:
        if m not in s.fits or pd.isna(s.fits[m]["reason"]):
            continue
        # the overhead-limited caveat is the ≥ sign, explained above the table
        parts = [
            part
            for part in str(s.fits[m]["reason"]).split("; ")
            if not part.startswith("overhead-limited")
        ]
        if parts:
            notes.append(f"{m}: {'; '.join(parts)}")
    if s.n_contended:
        notes.append(f"fitted on {s.n_contended} contended row(s): the exponent may be off")
    if s.failed is not None:
        notes.append(f"failed rows: {s.failed}")
    return "; ".join(notes)


def _unfitted_line(unfit: tuple) -> list[str]:
    """The series with no fit of any metric (exponents.Unfitted per reason), in one line: how
    many, why, which impls."""
    if not unfit:
        return []
    parts = []
    for u in unfit:
        more = f", {u.failed} failed rows (see non-ok rows)" if u.failed else ""
        relations = ", ".join(u.relations)
        parts.append(f"{u.reason} ({u.series} series of {', '.join(u.impls)}; {relations}{more})")
    return [f"No fit for {sum(u.series for u in unfit)} series: {'; '.join(parts)}.", ""]


def exponents_section(e) -> list[str]:
    """Scaling exponents (a DeviceAnalysis's exponents.Exponents); series without any fit
    collapse into one line."""
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
    if not e.any_ok:
        return lines + ["No series with ok rows.", ""]
    if e.fixed_tokens:
        lines += [
            "At a fixed token count (B·N=…, as the race sweeps), the batch shrinks as N "
            "grows: full attention's time ∝ B·N² = tokens·N, so a time exponent of 1 there "
            "*is* the quadratic cost per sequence (a linear-cost kernel would show 0), and "
            "memory that grows with B·N (inputs, output, a tiled kernel's state) is flat "
            "(exponent 0); a kernel that held the N×N scores would show 1.",
            "",
        ]
    rows = [
        {
            "impl": s.impl,
            "series": s.series,
            "time": _slope_text(s.fits["time_ms"]) if "time_ms" in s.fits else MISSING,
            "mem": _slope_text(s.fits["peak_mem_mib"]) if "peak_mem_mib" in s.fits else MISSING,
            "notes": _notes(s),
        }
        for s in e.fitted
    ]
    if rows:
        table_text = _exponents_table(pd.DataFrame(rows))
        lines += fold_long("Exponents per series", [table_text], len(rows))
    return lines + _unfitted_line(e.unfitted)


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
    if a.score_peaks.empty:
        return []
    parts = [
        f"{r.impl} ({r.series}, N {r.seq_n}): {r.ratio:.1f}x" for r in a.score_peaks.itertuples()
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
    bad = a.agreement.disagreeing
    lines = ["### Numerical agreement", ""]
    if bad.empty:
        n = a.agreement.n_ok
        lines += [f"All {n} ok rows agree with the float64 reference within their bound.", ""]
        return lines + _precision_lines(a.agreement.precision_low)
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
    return lines + [""] + _precision_lines(a.agreement.precision_low)


def _precision_lines(low: pd.DataFrame) -> list[str]:
    """Half-precision rows whose error is over its calibrated multiple of what a kernel that
    accumulates in float32 gets on the same inputs (``precision_low``): a flag apart from
    agreement, in measure/precision.py's words."""
    if low.empty:
        return []
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
