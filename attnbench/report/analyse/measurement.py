"""The measurement checks over a run's ok rows: which rows' numbers are in doubt and why (a
throttling GPU, a median the profiler's kernel time does not explain, noisy samples, a
pct_peak over the ceiling, CPU page faults inside the timing, a CPU the threads waited for),
with the facts each check's line states (the clock range, the cross-checked rows, executors
slower than their peers, the fastest rows against the published peaks)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from attnbench.measure.flags import PAGE_FAULTS_FLAG
from attnbench.measure.published import Peak, published
from attnbench.report.analyse import derived

SLOW_PEER = 0.9  # an executor whose speed anchor runs below this share of its peers' is flagged
# a GPU row whose median SM clock is under this share of the run's highest row median is
# listed; one that only saw the power cap at full clock is counted, not listed (on an H100
# every sustained row meets the 700 W cap: docs/method.md)
CLOCK_DROP = 0.95
POWER_CAP = "sw_power_cap"
EXECUTOR_COLUMNS = ("host", "node", "actor", "gpu_index", "gpu_uuid")  # where a row ran


@dataclass(frozen=True)
class MeasurementChecks:
    """What the report's measurement checks state, over every ok row of a run."""

    ok: int  # ok rows
    flag_counts: dict  # check name -> ok rows it flagged, in the order the table names them
    flagged: pd.DataFrame  # each flagged ok row once: case, flagged (its checks), gap_pct
    over_ceiling: tuple  # (roof, rows, highest pct_peak) per roof ('memory', 'compute')
    peak: Peak | None  # the GPU's published peaks (measure/published.py), or None
    top_tflops: dict  # dtype -> the fastest ok row's TFLOP/s
    top_gbps: float  # the fastest ok row's GB/s (NA: none)
    most_faults: float | None  # most page faults per timed call; None: no row counted them
    cpu_share_measured: bool  # whether any row measured its CPU share
    lowest_contended_share: float | None  # the lowest cpu_share of the contended rows
    cross_checked: int  # ok rows the profiler cross-checked (profiler_ms)
    cuda_rows: int  # ok CUDA rows
    largest_gap: float | None  # the largest |time / profiler - 1| of those
    checked_cases: pd.DataFrame  # impl, cases it cross-checked; empty where it checked all
    slow_peers: pd.DataFrame  # slow_peers: executors slower than their peers
    clock_mhz: tuple | None  # (lowest, highest) row-median SM clock; None: not read
    clock_reasons: tuple  # (NVML clock-event reason, rows that met it), by name


def _reasons(ok: pd.DataFrame) -> pd.Series:
    """Each row's clock-event reasons (NVML) as a set; empty for none or blank."""
    text = ok["throttle"].astype("string").fillna("none")
    return text.map(lambda t: set() if t == "none" else set(t.split(",")))


def _slowed_clocks(ok: pd.DataFrame) -> pd.Series:
    """GPU rows whose clocks were held back while they were timed: any reason but the power
    cap (thermal, a hardware slowdown or power brake), or a median SM clock more than
    1 - CLOCK_DROP under the run's highest."""
    reasons = _reasons(ok)
    other = reasons.map(lambda r: bool(r - {POWER_CAP}))
    low = ok["sm_clock_mhz"].lt(CLOCK_DROP * ok["sm_clock_mhz"].max()).fillna(False)
    return (other | (low & reasons.map(bool))).astype(bool)


def _flags(ok: pd.DataFrame) -> dict[str, pd.Series]:
    """Each check's name and the ok rows it flags (a bool mask), in the table's order."""
    return {
        "clocks held back": _slowed_clocks(ok),
        "timer vs profiler": (
            ok["reason"].fillna("").str.contains("profiler kernel time").astype(bool)
        ),
        "noisy": derived.noisy(ok),
        "over the ceiling": ok["pct_peak"].gt(100).fillna(False).astype(bool),
        "page faults": ok["page_faults"].ge(PAGE_FAULTS_FLAG).fillna(False).astype(bool),
        "contended": ok["contended"].eq(True).fillna(False).astype(bool),
    }


def _flagged_rows(ok: pd.DataFrame, masks: dict[str, pd.Series]) -> pd.DataFrame:
    """Every ok row some check flagged, once: its case, the checks that flagged it
    (``flagged``) and its time over the profiler's kernel time, in % (``gap_pct``)."""
    said = {i: [name for name, m in masks.items() if m[i]] for i in ok.index}
    flagged = ok.loc[[i for i, names in said.items() if names]]
    return flagged.assign(
        case=derived.per_case(flagged, derived.case_label),
        flagged=[", ".join(said[i]) for i in flagged.index],
        gap_pct=(flagged["time_ms"] / flagged["profiler_ms"] - 1) * 100,
    )


def _over_ceiling(over: pd.DataFrame, ceilings: dict) -> tuple:
    """Rows over 100% of a measured ceiling, by the roof they are nearer (the larger share of
    the copy or the matmul rate): (roof, rows, highest pct_peak) per roof that has rows."""
    copy = ceilings.get("copy_gb_s")
    memory = over["gbps"] / copy if copy else pd.Series(0.0, index=over.index)
    compute = over["tflops"] / over["dtype"].map(ceilings.get("matmul_tflops", {}))
    by_memory = (memory.fillna(0) > compute.fillna(0)).astype(bool)
    return tuple(
        (roof, len(rows), float(rows["pct_peak"].max()))
        for roof, rows in (("memory", over[by_memory]), ("compute", over[~by_memory]))
        if len(rows)
    )


def slow_peers(ok: pd.DataFrame) -> pd.DataFrame:
    """Executors slower than their peers of the same device name: each one's median
    speed_compute (the speed anchor, the same matmul in every case, relative to the run's
    first case) below SLOW_PEER times the median of its device name's executors. Columns:
    device_name, executor, speed, peers (that median)."""
    columns = ["device_name", "executor", "speed", "peers"]
    where = [c for c in EXECUTOR_COLUMNS if c in ok]
    if not where or ok["speed_compute"].isna().all():
        return pd.DataFrame(columns=columns)
    who = ok[where].astype("string").fillna("").agg(" ".join, axis=1).str.strip()
    per = ok.assign(who=who).groupby(["device_name", "who"])["speed_compute"].median()
    rows = [
        (name, executor, speed, speeds.median())
        for name, speeds in per.dropna().groupby(level=0)
        for (_, executor), speed in speeds.items()
        if len(speeds) > 1 and speed < SLOW_PEER * speeds.median()
    ]
    return pd.DataFrame(rows, columns=columns)


def _cross_checked_cases(checked: pd.DataFrame) -> pd.DataFrame:
    """Per impl (by name), the cases the profiler cross-checked (``cases``, a tuple)."""
    cases = checked.assign(case=derived.per_case(checked, derived.case_label))
    per_impl = cases.groupby("impl", sort=True)["case"].agg(tuple)
    return per_impl.rename("cases").reset_index()


def _clock(ok: pd.DataFrame) -> tuple[tuple | None, tuple]:
    """The row-median SM clock range and each clock-event reason's row count (by name)."""
    if not ok["sm_clock_mhz"].notna().any():
        return None, ()
    reasons = _reasons(ok)
    seen = sorted(set().union(*reasons)) if len(reasons) else []
    counts = tuple((r, int(reasons.map(lambda s, r=r: r in s).sum())) for r in seen)
    return (float(ok["sm_clock_mhz"].min()), float(ok["sm_clock_mhz"].max())), counts


def _cross_check(ok: pd.DataFrame) -> dict:
    """The profiler's cross-check: rows checked, CUDA rows, the largest gap, and the cases
    checked per impl (only where some CUDA rows were not)."""
    checked = ok[ok["profiler_ms"].notna()]
    cuda = int(ok["device"].astype(str).str.startswith("cuda").sum())
    gap = (checked["time_ms"] / checked["profiler_ms"] - 1).abs().max()
    partly = not checked.empty and len(checked) < cuda
    return {
        "cross_checked": len(checked),
        "cuda_rows": cuda,
        "largest_gap": None if checked.empty else float(gap),
        "checked_cases": _cross_checked_cases(checked) if partly else pd.DataFrame(),
    }


def measurement_checks(ok: pd.DataFrame, env: dict) -> MeasurementChecks:
    """The checks over a run's ok rows (``ok``, with the run's env.json)."""
    for name in ("cpu_share", "contended"):  # runs made before these columns existed
        if name not in ok:
            ok = ok.assign(**{name: pd.NA})
    masks = _flags(ok)
    contended = ok[masks["contended"]]
    faults = ok["page_faults"].max() if ok["page_faults"].notna().any() else None
    clock_mhz, clock_reasons = _clock(ok)
    return MeasurementChecks(
        ok=len(ok),
        flag_counts={name: int(m.sum()) for name, m in masks.items()},
        flagged=_flagged_rows(ok, masks),
        over_ceiling=_over_ceiling(ok[masks["over the ceiling"]], env.get("ceilings") or {}),
        peak=published(env.get("gpu_name")),
        top_tflops=ok.groupby("dtype")["tflops"].max().dropna().to_dict(),
        top_gbps=ok["gbps"].max(),
        most_faults=faults,
        cpu_share_measured=bool(ok["cpu_share"].notna().any()),
        lowest_contended_share=(
            float(contended["cpu_share"].min()) if contended["cpu_share"].notna().any() else None
        ),
        **_cross_check(ok),
        slow_peers=slow_peers(ok),
        clock_mhz=clock_mhz,
        clock_reasons=clock_reasons,
    )
