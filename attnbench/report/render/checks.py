"""The report's closing sections over every row of a run: measurement checks, what ran
(--profile), the non-ok rows, and the same cases across kinds of device."""

from __future__ import annotations

import pandas as pd

from attnbench.measure.profiling import CROSS_CHECK_EVERY, MISMATCH_PCT
from attnbench.measure.published import published
from attnbench.measure.roofline import over_ceiling_note
from attnbench.measure.timing import NOISY_SPREAD, PAGE_FAULTS_FLAG
from attnbench.report.analyse import derived
from attnbench.report.analyse.reasons import short_reason
from attnbench.report.render.header import case_label
from attnbench.report.render.markdown import fold_long, table

FAILURE_ORDER = {
    s: i for i, s in enumerate(("crash", "lost", "error", "timeout", "oom", "unsupported"))
}
SLOW_PEER = 0.9  # an executor whose speed anchor runs below this share of its peers' is flagged
# a GPU row whose median SM clock is under this share of the run's highest row median is
# listed; one that only saw the power cap at full clock is counted, not listed (on an H100
# every sustained row meets the 700 W cap: docs/method.md)
CLOCK_DROP = 0.95
POWER_CAP = "sw_power_cap"


def failures_section(run) -> list[str]:
    """Every non-ok row of a RunAnalysis, one line per impl and cause, and the impls the
    sweep left out (env.json's not_run)."""
    bad, not_run = derived.failures(run.frame), run.env.get("not_run")
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
    lines += [
        f"{len(bad)} rows. Their metrics are blank and never enter a table, fit or plot. One "
        "line per impl and cause (sizes and paths left out: each row's `reason` has the "
        "full text, and errors.log in the run folder the whole error).",
        "",
    ]
    gaps = bad["status"].eq("unsupported").fillna(False).astype(bool)
    lines += [f"### Failures ({int((~gaps).sum())})", ""]
    lines += [_by_cause(bad[~gaps]) if (~gaps).any() else "None.\n"]
    lines += [f"### Unsupported: capability gaps, not run ({int(gaps.sum())})", ""]
    return lines + [_by_cause(bad[gaps]) if gaps.any() else "None.\n"]


SHOWN_CASES = 4  # a cause lists this many of its cases, then how many more


def _by_cause(bad: pd.DataFrame) -> str:
    """A table of one line per (impl, status, cause) with its row count and cases."""
    bad = bad.assign(
        cause=bad["reason"].map(short_reason),
        case=derived.case_labels(bad),
        _o=bad["status"].map(lambda s: FAILURE_ORDER.get(s, -1)),
    )
    rows = []
    for (_, impl, status, cause), g in bad.groupby(
        ["_o", "impl", "status", "cause"], sort=True, dropna=False
    ):
        cases = list(g["case"])
        more = len(cases) - SHOWN_CASES
        shown = "; ".join(cases[:SHOWN_CASES]) + (f"; and {more} more" if more > 0 else "")
        rows.append(
            {"impl": impl, "status": status, "cause": cause, "rows": len(g), "cases": shown}
        )
    cols = {"impl": "impl", "status": "status", "cause": "cause", "rows": "rows", "cases": "cases"}
    return table(pd.DataFrame(rows), cols)


def checks_section(run) -> list[str]:
    """Ok rows whose measurement is in doubt: a throttling GPU, a median that the profiler's
    kernel time does not explain, a noisy row, a pct_peak over the ceiling, CPU page faults
    inside the timing, or a CPU row whose threads waited for a CPU (contended)."""
    ok, env = derived.ok_rows(run.frame), run.env
    for name in ("cpu_share", "contended"):  # runs made before these columns existed
        if name not in ok:
            ok = ok.assign(**{name: pd.NA})
    lines = ["## Measurement checks", ""]
    throttled = _slowed_clocks(ok)
    mismatch = ok[ok["reason"].fillna("").str.contains("profiler kernel time")]
    noisy = ok[derived.noisy(ok)]
    over_peak = ok[ok["pct_peak"].gt(100).fillna(False).astype(bool)]
    faulting = ok[ok["page_faults"].ge(PAGE_FAULTS_FLAG).fillna(False).astype(bool)]
    contended = ok[ok["contended"].eq(True).fillna(False).astype(bool)]
    lines += [
        f"{len(noisy)} of {len(ok)} ok rows are noisy (p20–p80 spread over "
        f"{100 * NOISY_SPREAD:.0f}% of the median; grey in the time plot): their medians can "
        f"move between identical runs.",
        "",
    ]
    lines += _ceiling_lines(ok, over_peak, env)
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
        lowest = (  # of the rows this line counts, not of a row the flag let pass
            f"; their lowest cpu_share {contended['cpu_share'].min():.2f}"
            if contended["cpu_share"].notna().any()
            else ""
        )
        lines += [
            f"{len(contended)} CPU row(s) were contended: their threads waited for a CPU "
            f"while being timed (another process was using it), so their times are inflated "
            f"and may move between identical runs (docs/method.md, contention){lowest}.",
            "",
        ]
    lines += _cross_check_lines(ok)
    lines += slow_peer_lines(ok)
    lines += _clock_lines(ok, throttled)
    checks = {
        "clocks held back": throttled,
        "timer vs profiler": mismatch,
        "noisy": noisy,
        "over the ceiling": over_peak,
        "page faults": faulting,
        "contended": contended,
    }
    return lines + _flagged_table(ok, checks)


def _ceiling_lines(ok: pd.DataFrame, over: pd.DataFrame, env: dict) -> list[str]:
    """Rows above a measured ceiling, by which roof (measure/roofline.over_ceiling_note), and
    the run's ceilings and its fastest rows against the device's published peaks, which do
    not move from run to run as measured ceilings do."""
    ceilings = env.get("ceilings") or {}
    copy = ceilings.get("copy_gb_s")
    lines = []
    if len(over):
        memory = over["gbps"] / copy if copy else pd.Series(0.0, index=over.index)
        compute = over["tflops"] / over["dtype"].map(ceilings.get("matmul_tflops", {}))
        by_memory = (memory.fillna(0) > compute.fillna(0)).astype(bool)
        for roof, rows in (("memory", over[by_memory]), ("compute", over[~by_memory])):
            if len(rows):
                note = over_ceiling_note(float(rows["pct_peak"].max()), roof)
                lines += [f"{len(rows)} row(s) read over 100%; the highest: {note}.", ""]
    peak = published(env.get("gpu_name"))
    if peak is None or not ceilings:
        return lines
    parts = []
    for dtype, rate in sorted(ceilings.get("matmul_tflops", {}).items()):
        top = ok.loc[ok["dtype"] == dtype, "tflops"].max()
        if dtype in peak.matmul_tflops and not pd.isna(top):
            spec = peak.matmul_tflops[dtype]
            parts.append(
                f"{dtype}: measured matmul {rate:.4g} TFLOP/s = {100 * rate / spec:.0f}% of the "
                f"published {spec:g}; the fastest row {top:.4g} TFLOP/s = {100 * top / spec:.0f}%"
                f" of published ({100 * top / rate:.0f}% of measured)"
            )
    if copy:
        top = ok["gbps"].max()
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


def _reasons(ok: pd.DataFrame) -> pd.Series:
    """Each row's clock-event reasons (NVML) as a set; empty for none or blank."""
    text = ok["throttle"].astype("string").fillna("none")
    return text.map(lambda t: set() if t == "none" else set(t.split(",")))


def _slowed_clocks(ok: pd.DataFrame) -> pd.DataFrame:
    """GPU rows whose clocks were held back while they were timed: any reason but the power
    cap (thermal, a hardware slowdown or power brake), or a median SM clock more than
    1 - CLOCK_DROP under the run's highest."""
    reasons = _reasons(ok)
    other = reasons.map(lambda r: bool(r - {POWER_CAP}))
    low = ok["sm_clock_mhz"].lt(CLOCK_DROP * ok["sm_clock_mhz"].max()).fillna(False)
    return ok[(other | (low & reasons.map(bool))).astype(bool)]


def _clock_lines(ok: pd.DataFrame, slowed: pd.DataFrame) -> list[str]:
    """The SM clock range, how many rows met each clock-event reason, and the rows listed."""
    if not ok["sm_clock_mhz"].notna().any():
        return []
    reasons = _reasons(ok)
    seen = sorted(set().union(*reasons)) if len(reasons) else []
    counts = ", ".join(f"{r} in {int(reasons.map(lambda s, r=r: r in s).sum())}" for r in seen)
    cap = (
        " The power cap means the GPU held its power limit: those times are sustained ones, "
        "as a training or serving loop gets, and a single burst runs faster (docs/method.md, "
        "What the first GPU lease showed)."
        if POWER_CAP in seen
        else ""
    )
    return [
        f"SM clock while timing: {ok['sm_clock_mhz'].min():.0f}–"
        f"{ok['sm_clock_mhz'].max():.0f} MHz (row medians). Clock-event reasons while timing "
        f"(NVML), of {len(ok)} ok rows: {counts or 'none'}.{cap} {len(slowed)} row(s) ran "
        f"with their clocks held back (below {CLOCK_DROP:.0%} of the run's highest median, "
        f"or a thermal or hardware reason): flagged `clocks held back` below.",
        "",
    ]


def slow_peer_lines(ok: pd.DataFrame) -> list[str]:
    """Executors slower than their peers of the same device name: each one's median
    speed_compute (the speed anchor, the same matmul in every case, relative to the run's
    first case) below SLOW_PEER times the median of its device name's executors."""
    where = [c for c in ("host", "node", "actor", "gpu_index", "gpu_uuid") if c in ok]
    if not where or ok["speed_compute"].isna().all():
        return []
    who = ok[where].astype("string").fillna("").agg(" ".join, axis=1).str.strip()
    per = ok.assign(who=who).groupby(["device_name", "who"])["speed_compute"].median()
    lines = []
    for name, speeds in per.dropna().groupby(level=0):
        peers = speeds.median()
        for (_, executor), speed in speeds.items():
            if len(speeds) > 1 and speed < SLOW_PEER * peers:
                lines.append(
                    f"{name} at {executor} is slower than its peers: its speed anchor ran at "
                    f"{speed:.2f} of the run's first case, its device's executors' median "
                    f"{peers:.2f}; its rows' times are slower for it, not for the impls."
                )
    return [*lines, ""] if lines else []


def _flagged_table(ok: pd.DataFrame, checks: dict[str, pd.DataFrame]) -> list[str]:
    """Every ok row some check flagged, once, with the checks that flagged it."""
    said = {i: [name for name, rows in checks.items() if i in rows.index] for i in ok.index}
    flagged = ok.loc[[i for i, names in said.items() if names]]
    if flagged.empty:
        return ["No row was flagged.", ""]
    flagged = flagged.assign(
        case=[case_label(r) for _, r in flagged.iterrows()],
        flagged=[", ".join(said[i]) for i in flagged.index],
        gap_pct=(flagged["time_ms"] / flagged["profiler_ms"] - 1) * 100,
    )
    counts = ", ".join(f"{name} {len(rows)}" for name, rows in checks.items() if len(rows))
    return [
        f"{len(flagged)} ok row(s) flagged by the checks above ({counts}), each once, with "
        "what flagged it:",
        "",
        *fold_long(
            "The flagged rows",
            [_flagged_rows(flagged)],
            len(flagged),
        ),
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
    diff = (checked["time_ms"] / checked["profiler_ms"] - 1).abs().max()
    lines = [
        f"The profiler cross-checked {len(checked)} of {len(cuda)} ok CUDA rows (the first "
        f"and every {CROSS_CHECK_EVERY}th row of each impl; every row with --profile). "
        f"Largest difference between the harness's median and the profiler's kernel time "
        f"(time / profiler - 1): {100 * float(diff):.1f}% (rows beyond {MISMATCH_PCT:g}% are "
        f"listed below).",
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


def kernels_section(kernels: pd.DataFrame | None) -> list[str]:
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
    top = derived.kernel_table(kernels)
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
    names = [a.name for a in run.devices]
    ok = derived.ok_rows(run.frame).copy()
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
