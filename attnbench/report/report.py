"""report.md (plus its figures) for one run, from its results.csv and env.json alone."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from attnbench.case import Case, CaseError
from attnbench.impls.xformers_kernels import PYTORCH_PREFIX
from attnbench.measure.profiling import CROSS_CHECK_EVERY, MISMATCH_PCT
from attnbench.measure.timing import NOISY_SPREAD, PAGE_FAULTS_FLAG
from attnbench.report import analysis, plots
from attnbench.report.markdown import MISSING, table
from attnbench.report.patterns import sections as pattern_sections
from attnbench.store.atomic import atomic_dir
from attnbench.store.env import code_version
from attnbench.store.results import load_run
from attnbench.store.rundir import RunDir
from attnbench.store.schema import STATUSES

FIGURES = (
    (
        "time_vs_seq",
        "Time per call",
        "Median time per call vs N on log-log axes; the band is "
        "the p20–p80 range of the samples. The legend gives the fitted exponent (≥: "
        "overhead-limited, a lower bound).",
    ),
    (
        "memory_vs_seq",
        "Peak memory",
        "Peak memory above what was allocated before the call. "
        "An impl that materialises the score matrix grows ~N^2, a tiled one ~N.",
    ),
    (
        "tflops_vs_seq",
        "Throughput",
        "Matmul FLOPs of the unmasked (query, key) pairs divided by the median time.",
    ),
    (
        "speedup_vs_seq",
        "Speedup vs baseline",
        "Baseline time / impl time, only where both are ok; above 1 is faster than the baseline.",
    ),
    (
        "error_vs_seq",
        "Numerical error",
        "Worst relative error against the float64 reference; "
        "the dashed line is the agreement bound each row was held to. Circled points disagree.",
    ),
    ("support_matrix", "Support matrix", "Rows per status for each impl and case family."),
    (
        "roofline",
        "Roofline",
        "Achieved TFLOP/s against arithmetic intensity (FLOPs per byte "
        "of the least traffic: q, k, v read and out written once, plus dout and the gradients "
        "with backward), under the ceilings measured at the start of this run.",
    ),
)
FAILURE_ORDER = {s: i for i, s in enumerate(("crash", "error", "timeout", "oom", "unsupported"))}


def device_name(env: dict, df: pd.DataFrame) -> str:
    device = env.get("device") or ", ".join(sorted(map(str, df["device"].dropna().unique())))
    if env.get("gpu_name") and str(device).startswith("cuda"):
        return f"{env['gpu_name']} ({device})"
    if env.get("cpu_name"):
        threads = f", {env['cpu_threads']} threads" if env.get("cpu_threads") else ""
        return f"{env['cpu_name']} ({device}{threads})"
    return str(device) or "unknown device"


def case_label(row) -> str:
    try:
        return Case.from_row(row).label()
    except (CaseError, TypeError, ValueError, KeyError):
        return " ".join(f"{k}={row[k]}" for k in analysis.CASE_COLUMNS)


def _header(run_id: str, df: pd.DataFrame, env: dict) -> list[str]:
    def v(key):
        value = env.get(key)
        return MISSING if value in (None, "") else str(value)

    lines = [f"# attnbench report: run `{run_id}`", ""]
    if not env:
        lines += [
            "> **env.json is missing**: device, versions and command are unknown; "
            "the numbers below cannot be tied to a machine.",
            "",
        ]
    git = code_version(env) or MISSING
    versions = " · ".join(
        f"{k} {v(k)}" for k in ("python", "torch", "cuda", "cudnn", "triton", "xformers")
    )
    rows = [
        ("device", device_name(env, df)),
        ("date (UTC)", v("time_utc")),
        ("command", f"`{v('command')}`"),
        ("git", git),
        ("versions", versions),
        ("platform", v("platform")),
        ("seed", v("seed")),
    ]
    if env.get("gpu_name"):
        rows.insert(
            1,
            (
                "GPU",
                f"{v('gpu_sm_count')} SMs, {v('gpu_mem_gib')} GiB, L2 "
                f"{v('gpu_l2_mib')} MiB, sm_{v('gpu_capability')}, driver "
                f"{v('driver')}",
            ),
        )
    ceilings = env.get("ceilings") or {}
    if ceilings:
        rates = ", ".join(f"{d} {t:.4g}" for d, t in sorted(ceilings["matmul_tflops"].items()))
        rows.append(
            (
                "ceilings (measured)",
                f"matmul TFLOP/s: {rates} ({ceilings['matmul_n']}³); "
                f"copy {ceilings['copy_gb_s']:.4g} GB/s"
                + (
                    " (every try waited for the CPU: possibly low, so no row has a bound "
                    "and pct_peak may be high)"
                    if ceilings.get("contended")
                    else ""
                ),
            )
        )
    if env.get("load_avg_1m") is not None:
        rows.insert(
            2, ("load at start", f"{v('load_avg_1m')} (1-min average, {v('cpu_count')} cores)")
        )
    other_ids = sorted(set(df["run_id"].dropna()) - {run_id}) if "run_id" in df else []
    if other_ids:
        rows.append(("note", f"results.csv also holds rows of run ids {', '.join(other_ids)}"))
    lines.append(table(pd.DataFrame(rows, columns=["field", "value"]), {"field": "", "value": ""}))
    if busy_machine(env):
        lines += [
            f"> **The machine was busy when the sweep started** (load {v('load_avg_1m')} "
            f"on {v('cpu_count')} cores): other processes competed for the CPU, so "
            f"times are inflated and noisy. Rerun on an idle machine before trusting "
            f"them.",
            "",
        ]
    return lines


def busy_machine(env: dict) -> bool:
    """A CPU run whose 1-minute load average at start exceeded half the cores."""
    load, cores = env.get("load_avg_1m"), env.get("cpu_count")
    cpu = not str(env.get("device", "cpu")).startswith("cuda")
    return bool(cpu and load is not None and cores and load > 0.5 * cores)


def _counts_line(df: pd.DataFrame) -> str:
    counts = df["status"].fillna("missing").value_counts()
    order = {s: i for i, s in enumerate((*STATUSES, "missing"))}
    parts = [f"{counts[s]} {s}" for s in sorted(counts.index, key=lambda s: order.get(s, 99))]
    ok = analysis.ok_rows(df)
    n_bad = int((~ok["agrees"].eq(True).fillna(False)).sum())
    verb = "does" if n_bad == 1 else "do"
    agree = (
        f"all {len(ok)} ok rows agree with the float64 reference"
        if n_bad == 0
        else f"**{n_bad} of {len(ok)} ok rows {verb} not agree with the float64 reference**"
    )
    return f"{len(df)} rows: {', '.join(parts) or 'none'}; {agree}."


def _borrowed_lines(df: pd.DataFrame) -> list[str]:
    """Impls whose ok rows ran PyTorch's own kernels (backend pytorch:*, e.g. xformers
    without its C++/CUDA extension): said once, up front, so that no table below reads as an
    independent comparison."""
    ok = analysis.ok_rows(df)
    borrowed = ok[_borrowed(ok)]
    if borrowed.empty:
        return []
    parts = [
        f"`{impl}` in {len(g)} of {int((ok['impl'] == impl).sum())} ok rows "
        f"({', '.join(sorted(set(g['backend'])))})"
        for impl, g in borrowed.groupby("impl", sort=True)
    ]
    return [
        f"> **Not an independent baseline**: {'; '.join(parts)} ran PyTorch's own kernels, "
        f"not kernels of its own (the rows' backend and reason; env.json "
        f"`xformers_kernels` says which operators were available and why). Those rows "
        f"measure PyTorch's SDPA kernels again, under another name.",
        "",
    ]


def _borrowed(df: pd.DataFrame) -> pd.Series:
    return df["backend"].fillna("").astype(str).str.startswith(PYTORCH_PREFIX)


def _recommendations_section(df: pd.DataFrame) -> list[str]:
    """Which impl for which model and phase (rows from --model only)."""
    rec = analysis.recommendations(df)
    if rec.empty:
        return []
    lines = [
        "## Recommendations",
        "",
        "Per model preset and phase: the impl that is fastest, among those agreeing with the "
        "float64 reference, in the most of its cases; its margin over the runner-up (median "
        "of runner-up time / its time over the cases it won) and its median peak memory; "
        "then every impl that failed or disagreed somewhere, with its first reason. "
        "Measured on this run's device only.",
        "",
    ]
    labels = {
        "model": "model",
        "phase": "phase",
        "impl": "use",
        "wins": "fastest in",
        "margin": "margin",
        "runner_up": "runner-up",
        "time_ms": "median ms",
        "peak_mem_mib": "peak MiB",
        "attn_implementation": "attn_implementation",
        "not_run": "could not run / disagreed",
    }
    if rec["attn_implementation"].notna().any():
        lines += [
            "attn_implementation: for transformers users, the `attn_implementation` to set "
            "for that model and phase on this machine: the one whose attention function "
            "(the hf_* rows, called as a model calls it) is fastest, agreeing, in the most "
            "cases, and in how many.",
            "",
        ]
    else:
        del labels["attn_implementation"]
    rec = rec.assign(
        wins=["" if pd.isna(w) else f"{int(w)}/{c}" for w, c in zip(rec["wins"], rec["cases"])],
        impl=["no impl agrees" if pd.isna(i) else f"**{i}**" for i in rec["impl"]],
        attn_implementation=[
            "" if pd.isna(a) else f"`{a}` ({int(n)}/{c})"
            for a, n, c in zip(rec["attn_implementation"], rec["attn_wins"], rec["cases"])
        ],
    )
    return lines + [
        table(
            rec,
            labels,
            formats={"margin": lambda m: f"{m:.2f}x", "time_ms": ".3g", "peak_mem_mib": ".4g"},
        ),
        "",
    ]


def _winners_section(df: pd.DataFrame) -> list[str]:
    winners = analysis.fastest_agreeing(df)
    wins = analysis.wins_by_family(winners)
    lines = [
        "### Who wins where",
        "",
        "Fastest impl per case among the ok rows that agree with the reference, counted "
        "per case family (N: the lengths it won, a–b where it won every length between; "
        "ties: wins within the noise of the runner-up, whose p20–p80 range overlaps the "
        "winner's; margin: median of runner-up time / winner time).",
        "",
    ]
    if winners.empty:
        return lines + ["No cases.", ""]
    rows = []
    order = {f: i for i, f in enumerate(analysis.family_order(df))}
    borrowed = set(df.loc[_borrowed(df), "impl"])  # say it where they win: PyTorch's kernels
    for fam, g in sorted(winners.groupby("family"), key=lambda t: order.get(t[0], 0)):
        w = wins[wins["family"] == fam]
        text = [
            ("**{}**" if i == 0 else "{}").format(
                r.impl + (" (PyTorch's kernels)" if r.impl in borrowed else "")
            )
            + f" {r.wins}/{r.cases} (N {r.spans}"
            + (f"; {r.ties} tie{'s' if r.ties > 1 else ''}" if r.ties else "")
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


def _speedup_section(df: pd.DataFrame, baseline: str | None) -> list[str]:
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
    if not analysis.ok_rows(df[df["impl"] == baseline]).shape[0]:
        impls = ", ".join(sorted(df["impl"].dropna().unique()))
        return lines + [
            f"The baseline `{baseline}` has no ok rows in this run, so no speedups "
            f"are computed; choose another with `--baseline` (impls: {impls}).",
            "",
        ]
    sp = analysis.speedups(df, baseline)
    sp = sp[(sp["impl"] != baseline) & sp["speedup"].notna()]
    lines += [
        f"{baseline} time / impl time over the cases where both are ok (above 1: faster "
        f"than {baseline}).",
        "",
    ]
    if sp.empty:
        return lines + ["No case has both the baseline and another impl ok.", ""]
    sp = sp.assign(family=analysis.case_family(sp))
    agg = (
        sp.groupby(["impl", "family"], sort=True)["speedup"]
        .agg(["size", "median", "min", "max"])
        .reset_index()
    )
    order = {f: i for i, f in enumerate(analysis.family_order(df))}
    agg = agg.sort_values(
        ["impl", "family"], key=lambda c: c.map(order) if c.name == "family" else c
    )
    x = lambda v: f"{v:.2f}x"  # noqa: E731
    lines.append(
        table(
            agg,
            {
                "impl": "impl",
                "family": "case family",
                "size": "cases",
                "median": "median",
                "min": "min",
                "max": "max",
            },
            formats={"median": x, "min": x, "max": x},
        )
    )
    return lines


def _series_label(r) -> str:
    mask = "causal" if analysis.flag(r["causal"]) else "full"
    kv = f"/{r['kv_heads']}" if r["kv_heads"] != r["heads"] else ""
    return (
        f"{r['mode']} {mask} {r['dtype']} B{r['batch']} H{r['heads']}{kv} "
        f"D{r['head_dim']} {r['seq_kv_rule']}"
    )


def _slope_text(r) -> str:
    if pd.isna(r["slope"]):
        return MISSING
    bound = "≥" if analysis.flag(r["overhead_limited"]) else ""
    return (
        f"{bound}{r['slope']:.2f} ± {r['slope_se']:.2f} "
        f"({r['n_points']} pts, N {r['seq_min']}–{r['seq_max']})"
    )


def _exponents_section(fits: pd.DataFrame) -> list[str]:
    lines = [
        "### Scaling exponents",
        "",
        "Least-squares slope of log(metric) vs log(N), N = seq_q, over the points past "
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
    rows = []
    groups = fits.groupby(list(analysis.SERIES_KEY), dropna=False, sort=True)
    groups = sorted(
        groups, key=lambda t: (t[1]["impl"].iloc[0], analysis.mode_rank(t[1]["mode"].iloc[0]))
    )
    for _key, g in groups:
        first = g.iloc[0]
        by = {r["metric"]: r for _, r in g.iterrows()}
        notes = []
        for m in analysis.FIT_METRICS:
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
        if not pd.isna(first["failed"]):
            notes.append(f"failed rows: {first['failed']}")
        rows.append(
            {
                "impl": first["impl"],
                "series": _series_label(first),
                "time": _slope_text(by["time_ms"]) if "time_ms" in by else MISSING,
                "mem": (_slope_text(by["peak_mem_mib"]) if "peak_mem_mib" in by else MISSING),
                "notes": "; ".join(notes),
            }
        )
    rows = pd.DataFrame(rows)
    columns = {
        "impl": "impl",
        "series": "series (N varies)",
        "time": "time exponent",
        "mem": "memory exponent",
        "notes": "notes",
    }
    if not rows["notes"].astype(bool).any():
        del columns["notes"]
    lines.append(table(rows, columns))
    return lines


def _disagreement_section(df: pd.DataFrame) -> list[str]:
    bad = analysis.disagreements(df)
    lines = ["### Numerical agreement", ""]
    if bad.empty:
        n = len(analysis.ok_rows(df))
        return lines + [f"All {n} ok rows agree with the float64 reference within their bound.", ""]
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
    return lines


def _failures_section(df: pd.DataFrame, not_run: dict | None = None) -> list[str]:
    bad = analysis.failures(df)
    lines = ["## Non-ok rows", ""]
    if not_run:  # impls the sweep left out, and why (env.json not_run)
        lines += [
            "Not run, so without rows: "
            + "; ".join(f"`{name}` ({why})" for name, why in not_run.items())
            + ".",
            "",
        ]
    if bad.empty:
        return lines + ["Every row is ok.", ""]
    bad = bad.assign(
        case=[case_label(r) for _, r in bad.iterrows()],
        _o=bad["status"].map(lambda s: FAILURE_ORDER.get(s, -1)),
    )
    bad = bad.sort_values(["_o", "impl"], kind="stable")
    lines += [f"{len(bad)} rows. Their metrics are blank and never enter a table, fit or plot.", ""]
    cols = {"impl": "impl", "case": "case", "status": "status", "reason": "reason"}
    gaps = bad["status"].eq("unsupported").fillna(False).astype(bool)
    lines += [f"### Failures ({int((~gaps).sum())})", ""]
    lines += [table(bad[~gaps], cols) if (~gaps).any() else "None.\n"]
    lines += [f"### Unsupported: capability gaps, not run ({int(gaps.sum())})", ""]
    if gaps.any():
        grouped = (
            bad[gaps]
            .groupby(["impl", "reason"], sort=True, dropna=False)
            .size()
            .reset_index(name="rows")
        )
        lines += [table(grouped, {"impl": "impl", "reason": "reason", "rows": "rows"})]
    else:
        lines += ["None.\n"]
    return lines


def _checks_section(df: pd.DataFrame) -> list[str]:
    """Ok rows whose measurement is in doubt: a throttling GPU, a median that the profiler's
    kernel time does not explain, a noisy row, a pct_peak over the ceiling, CPU page faults
    inside the timing, or a CPU row whose threads waited for a CPU (contended)."""
    ok = analysis.ok_rows(df)
    for name in ("cpu_share", "contended"):  # runs made before these columns existed
        if name not in ok:
            ok = ok.assign(**{name: pd.NA})
    lines = ["## Measurement checks", ""]
    throttled = ok[ok["throttle"].notna() & (ok["throttle"] != "none")]
    mismatch = ok[ok["reason"].fillna("").str.contains("profiler kernel time")]
    noisy = ok[analysis.noisy(ok)]
    over_peak = ok[ok["pct_peak"].gt(100).fillna(False).astype(bool)]
    faulting = ok[ok["page_faults"].ge(PAGE_FAULTS_FLAG).fillna(False).astype(bool)]
    contended = ok[ok["contended"].eq(True).fillna(False).astype(bool)]
    lines += [
        f"{len(noisy)} of {len(ok)} ok rows are noisy (p20–p80 spread over "
        f"{100 * NOISY_SPREAD:.0f}% of the median; grey in the time plot): their medians can "
        f"move between identical runs.",
        "",
    ]
    if len(over_peak):
        lines += [
            f"{len(over_peak)} row(s) exceed the measured matmul ceiling (pct_peak > 100%): "
            f"the ceiling was measured low, so pct_peak and the roofline are not trustworthy "
            f"in this run.",
            "",
        ]
    if len(faulting):
        lines += [
            f"{len(faulting)} CPU row(s) page-faulted inside the timing ({PAGE_FAULTS_FLAG:g} "
            f"or more minor faults per timed call; most {ok['page_faults'].max():.0f}): their "
            f"times include paging memory in and may move between identical runs "
            f"(docs/method.md, CPU timing and the allocator).",
            "",
        ]
    elif ok["page_faults"].notna().any():
        lines += [
            f"No CPU row page-faulted inside the timing (at most "
            f"{ok['page_faults'].max():.0f} minor faults per timed call; "
            f"{PAGE_FAULTS_FLAG:g} or more would be flagged).",
            "",
        ]
    if ok["cpu_share"].notna().any():
        lines += [
            f"{len(contended)} CPU row(s) were contended: their threads waited for a CPU "
            f"while being timed (another process was using it), so their times are inflated "
            f"and may move between identical runs (docs/method.md, contention); lowest "
            f"cpu_share {ok['cpu_share'].min():.2f}.",
            "",
        ]
    lines += _cross_check_lines(ok)
    if ok["sm_clock_mhz"].notna().any():
        lines += [
            f"SM clock while timing: {ok['sm_clock_mhz'].min():.0f}–"
            f"{ok['sm_clock_mhz'].max():.0f} MHz (row medians); "
            f"{len(throttled)} row(s) saw the GPU slow its clocks.",
            "",
        ]
    flagged = pd.concat([throttled, mismatch, noisy, over_peak, faulting, contended])
    flagged = flagged.drop_duplicates(subset=list(analysis.CASE_KEY))
    if flagged.empty:
        return lines + ["No row was flagged.", ""]
    flagged = flagged.assign(case=[case_label(r) for _, r in flagged.iterrows()])
    return lines + [
        table(
            flagged,
            {
                "impl": "impl",
                "case": "case",
                "throttle": "throttle",
                "time_ms": "time_ms",
                "profiler_ms": "profiler_ms",
                "page_faults": "faults/call",
                "cpu_share": "cpu_share",
                "reason": "reason",
            },
            formats={
                "time_ms": ".4g",
                "profiler_ms": ".4g",
                "page_faults": ".0f",
                "cpu_share": ".2f",
            },
        )
    ]


def _cross_check_lines(ok: pd.DataFrame) -> list[str]:
    """Which ok rows the profiler cross-checked (``profiler_ms``), and the largest gap."""
    checked = ok[ok["profiler_ms"].notna()]
    cuda = ok[ok["device"].astype(str).str.startswith("cuda")]
    if checked.empty:
        return [
            "No profiler cross-check (it runs on CUDA rows only: the first and every "
            f"{CROSS_CHECK_EVERY}th row of each impl, every row with --profile).",
            "",
        ]
    diff = ((checked["time_ms"] - checked["profiler_ms"]).abs() / checked["time_ms"]).max()
    lines = [
        f"The profiler cross-checked {len(checked)} of {len(cuda)} ok CUDA rows (the first "
        f"and every {CROSS_CHECK_EVERY}th row of each impl; every row with --profile). "
        f"Largest difference between the harness's median and the profiler's kernel time: "
        f"{100 * float(diff):.1f}% (rows beyond {MISMATCH_PCT:g}% are listed below).",
        "",
    ]
    if len(checked) < len(cuda):
        per_impl = (
            checked.assign(case=[case_label(r) for _, r in checked.iterrows()])
            .groupby("impl", sort=True)["case"]
            .agg(lambda cases: "; ".join(cases))
            .reset_index()
        )
        lines += [table(per_impl, {"impl": "impl", "case": "cross-checked rows"})]
    return lines


def _kernels_section(kernels: pd.DataFrame | None) -> list[str]:
    if kernels is None or kernels.empty:
        return []
    lines = [
        "## What ran (--profile)",
        "",
        "Per impl, the kernels (GPU) or ops (CPU, self time) the profiler saw over its "
        "profiled cases, largest first. Chrome traces, one per (case, impl): the run's "
        "`traces/` folder beside results.csv (open in chrome://tracing or Perfetto).",
        "",
    ]
    top = analysis.kernel_table(kernels)
    return lines + [
        table(
            top,
            {
                "impl": "impl",
                "kernel": "kernel",
                "calls": "calls",
                "total_us": "total µs",
                "share": "share",
            },
            formats={"total_us": ".1f", "share": ".1%"},
        )
    ]


def render(
    df: pd.DataFrame,
    env: dict,
    run_id: str,
    out_dir: Path,
    baseline: str | None = None,
    kernels: pd.DataFrame | None = None,
    svg: bool = False,
) -> str:
    """Write the figures into out_dir and return the markdown text. ``baseline``: the impl
    speedups are relative to (default: the one the run recorded)."""
    baseline = baseline or env.get("baseline")
    lines = _header(run_id, df, env)
    lines += ["## Summary", "", _counts_line(df), ""]
    lines += _borrowed_lines(df)
    lines += _recommendations_section(df)
    names = _device_names(df)
    if len(names) < 2:
        lines += _device_part(df, env, out_dir, baseline, svg, device_name(env, df), "", "##")
    else:  # several kinds of device (a Ray run): every analysis and figure per device
        lines += _across_devices_section(df, names)
        for name in names:
            ceilings = (env.get("devices") or {}).get(name, {}).get("ceilings")
            lines += [f"## Device: {name}", ""]
            lines += _device_part(
                df[df["device_name"] == name],
                {**env, "ceilings": ceilings or env.get("ceilings")},
                out_dir,
                baseline,
                svg,
                name,
                "__" + re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_"),
                "###",
            )
    lines += _checks_section(df)
    lines += _kernels_section(kernels)
    lines += _failures_section(df, env.get("not_run"))
    return "\n".join(lines).rstrip() + "\n"


def _device_names(df: pd.DataFrame) -> list[str]:
    if "device_name" not in df:
        return []
    return sorted(map(str, df["device_name"].dropna().unique()))


def _across_devices_section(df: pd.DataFrame, names: list[str]) -> list[str]:
    """Median time of each (case, impl) on each device, side by side."""
    ok = df[df["status"] == "ok"].copy()
    if ok.empty:
        return []
    ok["case"] = ok.apply(case_label, axis=1)
    wide = ok.pivot_table(
        index=["case", "impl"], columns="device_name", values="time_ms", aggfunc="median"
    )
    wide = wide.reindex(columns=names).reset_index()
    return [
        "## Across devices",
        "",
        "Median time per call (ms) of each case and impl on each kind of device that ran it "
        "(blank: not run there, or not ok).",
        "",
        table(wide, {c: c for c in wide.columns}, formats={n: ".4g" for n in names}),
        "",
    ]


def _device_part(
    df: pd.DataFrame,
    env: dict,
    out_dir: Path,
    baseline: str | None,
    svg: bool,
    name: str,
    suffix: str,
    level: str,
) -> list[str]:
    """Winners, speedups, scaling exponents, disagreements and figures of one device's rows
    (figure files named <figure><suffix>.png)."""
    colors = plots.run_colors(env, df["impl"].dropna().unique())
    if busy_machine(env):
        name += f" · BUSY machine: load {env['load_avg_1m']} on {env['cpu_count']} cores"
    fits = analysis.scaling_exponents(df)
    lines = _winners_section(df)
    lines += _speedup_section(df, baseline)
    lines += _exponents_section(fits)
    lines += pattern_sections(df, level)
    lines += _disagreement_section(df)
    figures = {
        "time_vs_seq": lambda: plots.plot_time_vs_seq(df, fits, device_name=name, colors=colors),
        "memory_vs_seq": lambda: plots.plot_memory_vs_seq(
            df, fits, device_name=name, colors=colors
        ),
        "tflops_vs_seq": lambda: plots.plot_tflops_vs_seq(df, device_name=name, colors=colors),
        "speedup_vs_seq": lambda: plots.plot_speedup_vs_seq(
            df, baseline, device_name=name, colors=colors
        ),
        "error_vs_seq": lambda: plots.plot_error_vs_seq(df, device_name=name, colors=colors),
        "support_matrix": lambda: plots.plot_support_matrix(df, device_name=name),
        "roofline": lambda: plots.plot_roofline(
            df, env.get("ceilings") or {}, device_name=name, colors=colors
        ),
    }
    lines += [f"{level} Plots", ""]
    for stem, heading, caption in FIGURES:
        if stem == "speedup_vs_seq" and not baseline:
            continue
        plots.save_figure(figures[stem](), out_dir / f"{stem}{suffix}", svg=svg)
        lines += [f"{level}# {heading}", "", caption, "", f"![{heading}]({stem}{suffix}.png)", ""]
    return lines


def write_report(run_dir, reports_dir, baseline: str | None = None, svg: bool = False) -> Path:
    """Write <reports_dir>/<run-id>/report.md and its figures; return the report's path.

    Everything is written into a temporary folder beside the target and renamed into place,
    so a reader never sees half a report."""
    run_dir = Path(run_dir)
    df, env = load_run(run_dir)
    run = RunDir(run_dir)
    kernels = pd.read_csv(run.kernels) if run.kernels.exists() else None
    with atomic_dir(run.report_dir(reports_dir)) as tmp:
        text = render(df, env, run.run_id, tmp, baseline, kernels, svg)
        (tmp / RunDir.REPORT).write_text(text, encoding="utf-8")
    return run.report(reports_dir)
