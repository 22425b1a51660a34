"""The report's closing sections over every row of a run: measurement checks, what ran
(--profile), the non-ok rows, and the same cases across kinds of device."""

from __future__ import annotations

import pandas as pd

from attnbench.measure.flags import CROSS_CHECK_EVERY, MISMATCH_PCT, NOISY_SPREAD, PAGE_FAULTS_FLAG
from attnbench.measure.roofline import over_ceiling_note
from attnbench.report.analyse.measurement import CLOCK_DROP, POWER_CAP, MeasurementChecks
from attnbench.report.render.markdown import fold_long, table


def failures_section(run) -> list[str]:
    """Every non-ok row of a RunAnalysis, one line per impl and cause, and the impls the
    sweep left out (env.json's not_run)."""
    bad, not_run = run.failures, run.env.get("not_run")
    lines = ["## Non-ok rows", ""]
    if not_run:  # impls the sweep left out, and why (env.json not_run)
        lines += [
            "Not run, so without rows: "
            + "; ".join(f"`{name}` ({why})" for name, why in not_run.items())
            + ".",
            "",
        ]
    if not bad.rows:
        return lines + ["Every row is ok.", ""]
    lines += [
        f"{bad.rows} rows. Their metrics are blank and never enter a table, fit or plot. One "
        "line per impl and cause (sizes and paths left out: each row's `reason` has the "
        "full text, and errors.log in the run folder the whole error).",
        "",
    ]
    lines += [f"### Failures ({bad.failed_rows})", ""]
    lines += [_by_cause(bad.failed) if bad.failed_rows else "None.\n"]
    lines += [f"### Unsupported: capability gaps, not run ({bad.unsupported_rows})", ""]
    return lines + [_by_cause(bad.unsupported) if bad.unsupported_rows else "None.\n"]


SHOWN_CASES = 4  # a cause lists this many of its cases, then how many more


def _by_cause(causes: pd.DataFrame) -> str:
    """A table of one line per (impl, status, cause) with its row count and cases."""
    shown = [
        "; ".join(cases[:SHOWN_CASES])
        + (f"; and {len(cases) - SHOWN_CASES} more" if len(cases) > SHOWN_CASES else "")
        for cases in causes["cases"]
    ]
    cols = {"impl": "impl", "status": "status", "cause": "cause", "rows": "rows", "cases": "cases"}
    return table(causes.assign(cases=shown), cols)


def checks_section(run) -> list[str]:
    """Ok rows whose measurement is in doubt (a RunAnalysis's MeasurementChecks): a
    throttling GPU, a median that the profiler's kernel time does not explain, a noisy row, a
    pct_peak over the ceiling, CPU page faults inside the timing, or a CPU row whose threads
    waited for a CPU (contended)."""
    c = run.checks
    counts = c.flag_counts
    lines = ["## Measurement checks", ""]
    lines += [
        f"{counts['noisy']} of {c.ok} ok rows are noisy (p20–p80 spread over "
        f"{100 * NOISY_SPREAD:.0f}% of the median; grey in the time plot): their medians can "
        f"move between identical runs.",
        "",
    ]
    lines += _ceiling_lines(c, run.env.get("ceilings") or {})
    if counts["page faults"]:
        lines += [
            f"{counts['page faults']} CPU row(s) page-faulted inside the timing "
            f"({PAGE_FAULTS_FLAG:g} or more minor faults per timed call; most "
            f"{c.most_faults:.0f}): their times include paging memory in and may move between "
            f"identical runs (docs/method.md, CPU timing and the allocator).",
            "",
        ]
    elif c.most_faults is not None:
        lines += [
            f"No CPU row page-faulted inside the timing (at most "
            f"{c.most_faults:.0f} minor faults per timed call; "
            f"{PAGE_FAULTS_FLAG:g} or more would be flagged).",
            "",
        ]
    if c.cpu_share_measured:
        lowest = (  # of the rows this line counts, not of a row the flag let pass
            f"; their lowest cpu_share {c.lowest_contended_share:.2f}"
            if c.lowest_contended_share is not None
            else ""
        )
        lines += [
            f"{counts['contended']} CPU row(s) were contended: their threads waited for a CPU "
            f"while being timed (another process was using it), so their times are inflated "
            f"and may move between identical runs (docs/method.md, contention){lowest}.",
            "",
        ]
    lines += _cross_check_lines(c)
    lines += slow_peer_lines(c.slow_peers)
    lines += _clock_lines(c)
    return lines + _flagged_table(c)


def _ceiling_lines(c: MeasurementChecks, ceilings: dict) -> list[str]:
    """Rows above a measured ceiling, by which roof (measure/roofline.over_ceiling_note), and
    the run's ceilings and its fastest rows against the device's published peaks, which do
    not move from run to run as measured ceilings do."""
    lines = []
    for roof, rows, highest in c.over_ceiling:
        note = over_ceiling_note(highest, roof)
        lines += [f"{rows} row(s) read over 100%; the highest: {note}.", ""]
    peak, copy = c.peak, ceilings.get("copy_gb_s")
    if peak is None or not ceilings:
        return lines
    parts = []
    for dtype, rate in sorted(ceilings.get("matmul_tflops", {}).items()):
        top = c.top_tflops.get(dtype)
        if dtype in peak.matmul_tflops and top is not None:
            spec = peak.matmul_tflops[dtype]
            parts.append(
                f"{dtype}: measured matmul {rate:.4g} TFLOP/s = {100 * rate / spec:.0f}% of the "
                f"published {spec:g}; the fastest row {top:.4g} TFLOP/s = {100 * top / spec:.0f}%"
                f" of published ({100 * top / rate:.0f}% of measured)"
            )
    if copy:
        top = c.top_gbps
        parts.append(
            f"memory: measured copy {copy:.4g} GB/s = {100 * copy / peak.memory_gb_s:.0f}% of "
            f"the published {peak.memory_gb_s:g} GB/s; the fastest row {top:.4g} GB/s = "
            f"{100 * top / peak.memory_gb_s:.0f}% of published"
        )
    return lines + [
        "Against the published peaks (" + peak.source + "), which stay put from run to run "
        "while measured ceilings move a few percent with clocks and power (`pct_peak` is "
        "against this run's measured ones): " + "; ".join(parts) + ".",
        "",
    ]


def _clock_lines(c: MeasurementChecks) -> list[str]:
    """The SM clock range, how many rows met each clock-event reason, and the rows listed."""
    if c.clock_mhz is None:
        return []
    counts = ", ".join(f"{r} in {n}" for r, n in c.clock_reasons)
    cap = (
        " The power cap means the GPU held its power limit: those times are sustained ones, "
        "as a training or serving loop gets, and a single burst runs faster (docs/method.md, "
        "What the first GPU lease showed)."
        if POWER_CAP in dict(c.clock_reasons)
        else ""
    )
    low, high = c.clock_mhz
    return [
        f"SM clock while timing: {low:.0f}–{high:.0f} MHz (row medians). Clock-event reasons "
        f"while timing (NVML), of {c.ok} ok rows: {counts or 'none'}.{cap} "
        f"{c.flag_counts['clocks held back']} row(s) ran with their clocks held back (below "
        f"{CLOCK_DROP:.0%} of the run's highest median, or a thermal or hardware reason): "
        f"flagged `clocks held back` below.",
        "",
    ]


def slow_peer_lines(peers: pd.DataFrame) -> list[str]:
    """Executors slower than their peers of the same device name (measurement.slow_peers)."""
    lines = [
        f"{r.device_name} at {r.executor} is slower than its peers: its speed anchor ran at "
        f"{r.speed:.2f} of the run's first case, its device's executors' median "
        f"{r.peers:.2f}; its rows' times are slower for it, not for the impls."
        for r in peers.itertuples()
    ]
    return [*lines, ""] if lines else []


def _flagged_table(c: MeasurementChecks) -> list[str]:
    """Every ok row some check flagged, once, with the checks that flagged it."""
    if c.flagged.empty:
        return ["No row was flagged.", ""]
    counts = ", ".join(f"{name} {n}" for name, n in c.flag_counts.items() if n)
    return [
        f"{len(c.flagged)} ok row(s) flagged by the checks above ({counts}), each once, with "
        "what flagged it:",
        "",
        *fold_long("The flagged rows", [_flagged_rows(c.flagged)], len(c.flagged)),
    ]


def _flagged_rows(flagged: pd.DataFrame) -> str:
    return table(
        flagged,
        {
            "impl": "impl",
            "case": "case",
            "flagged": "flagged",
            "throttle": "throttle",
            "time_ms": "time_ms",
            "profiler_ms": "profiler_ms",
            "gap_pct": "time / profiler - 1",
            "page_faults": "faults/call",
            "cpu_share": "cpu_share",
        },
        formats={
            "time_ms": ".4g",
            "profiler_ms": ".4g",
            "gap_pct": lambda p: f"{p:+.0f}%",
            "page_faults": ".0f",
            "cpu_share": ".2f",
        },
    )


def _cross_check_lines(c: MeasurementChecks) -> list[str]:
    """Which ok rows the profiler cross-checked (``profiler_ms``), and the largest gap."""
    if not c.cross_checked:
        return [
            "No profiler cross-check (it runs on CUDA rows only: the first and every "
            f"{CROSS_CHECK_EVERY}th row of each impl, every row with --profile).",
            "",
        ]
    lines = [
        f"The profiler cross-checked {c.cross_checked} of {c.cuda_rows} ok CUDA rows (the "
        f"first and every {CROSS_CHECK_EVERY}th row of each impl; every row with --profile). "
        f"Largest difference between the harness's median and the profiler's kernel time "
        f"(time / profiler - 1): {100 * c.largest_gap:.1f}% (rows beyond {MISMATCH_PCT:g}% are "
        f"listed below).",
        "",
    ]
    if len(c.checked_cases):
        per_impl = c.checked_cases.assign(case=["; ".join(k) for k in c.checked_cases["cases"]])
        lines += [table(per_impl, {"impl": "impl", "case": "cross-checked rows"})]
    return lines


def kernels_section(top: pd.DataFrame | None) -> list[str]:
    """Per impl, its top kernels or ops (derived.kernel_table of kernels.csv), if profiled."""
    if top is None or top.empty:
        return []
    lines = [
        "## What ran (--profile)",
        "",
        "Per impl, the kernels (GPU) or ops (CPU, self time) the profiler saw over its "
        "profiled cases, largest first. Chrome traces, one per (case, impl): the run's "
        "`traces/` folder beside results.csv (open in chrome://tracing or Perfetto).",
        "",
    ]
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


def across_devices_section(run) -> list[str]:
    """Median time of each (case, impl) on each device of a RunAnalysis, side by side."""
    wide = run.across_devices
    if wide.empty:
        return []
    names = [c for c in wide.columns if c not in ("case", "impl")]
    return [
        "## Across devices",
        "",
        "Median time per call (ms) of each case and impl on each kind of device that ran it "
        "(blank: not run there, or not ok).",
        "",
        table(wide, {c: c for c in wide.columns}, formats={n: ".4g" for n in names}),
        "",
    ]
