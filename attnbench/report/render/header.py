"""The report's opening: the run's header (device, command, versions, ceilings) and the
summary's first lines (row counts, impls that ran PyTorch's own kernels)."""

from __future__ import annotations

import pandas as pd

from attnbench.report.analyse.machine import busy_machine
from attnbench.report.render.markdown import MISSING, table
from attnbench.spec import PRESETS
from attnbench.store.env import code_version


def header_lines(run) -> list[str]:
    """The run's header (a RunAnalysis): device, date, command, versions, ceilings."""
    env, cover = run.env, run.coverage

    def v(key):
        value = env.get(key)
        return MISSING if value in (None, "") else str(value)

    lines = ["## Run", ""]
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
        ("device", cover.device),
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
    left = preset_left_out(env)
    if left:
        rows.append(("impls", left))
    if cover.other_run_ids:
        ids = ", ".join(cover.other_run_ids)
        rows.append(("note", f"results.csv also holds rows of run ids {ids}"))
    fields = pd.DataFrame(rows, columns=["field", "value"])
    lines.append(table(fields, {"field": "", "value": ""}, max_cell=None))  # the command whole
    if busy_machine(env):
        lines += [
            f"> **The machine was busy when the sweep started** (load {v('load_avg_1m')} "
            f"on {v('cpu_count')} cores): other processes competed for the CPU, so "
            f"times are inflated and noisy. Rerun on an idle machine before trusting "
            f"them.",
            "",
        ]
    return lines


def preset_left_out(env: dict) -> str:
    """The preset's impls that the command's --impls left out ('' when none), so that a
    reader knows they were not run by choice, not for a failure."""
    words = str(env.get("command") or "").split()
    flag = lambda name: words[words.index(name) + 1] if name in words[:-1] else None  # noqa: E731
    preset = flag("--preset") or ("race" if words[1:2] == ["race"] else None)
    named = flag("--impls")
    if preset not in PRESETS or named is None:
        return ""
    left = [i for i in PRESETS[preset].get("impls") or () if i not in named.split(",")]
    return f"the {preset} preset's {', '.join(left)} left out by --impls" if left else ""


def counts_line(run) -> str:
    """Rows per status, and how many ok rows disagree (a RunAnalysis)."""
    cover = run.coverage
    parts = [f"{n} {s}" for s, n in cover.statuses]
    verb = "does" if cover.disagreeing == 1 else "do"
    agree = (
        f"all {cover.ok} ok rows agree with the float64 reference"
        if cover.disagreeing == 0
        else f"**{cover.disagreeing} of {cover.ok} ok rows {verb} not agree with the float64 "
        "reference**"
    )
    return f"{cover.rows} rows: {', '.join(parts) or 'none'}; {agree}."


def borrowed_lines(run) -> list[str]:
    """Impls whose ok rows ran PyTorch's own kernels (backend pytorch:*, e.g. xformers
    without its C++/CUDA extension): said once, up front, so that no table below reads as an
    independent comparison."""
    borrowed = run.coverage.borrowed
    if borrowed.empty:
        return []
    parts = [
        f"`{r.impl}` in {r.rows} of {r.of} ok rows ({', '.join(r.backends)})"
        for r in borrowed.itertuples()
    ]
    return [
        f"> **Not an independent baseline**: {'; '.join(parts)} ran PyTorch's own kernels, "
        f"not kernels of its own (the rows' backend and reason; env.json "
        f"`xformers_kernels` says which operators were available and why). Those rows "
        f"measure PyTorch's SDPA kernels again, under another name.",
        "",
    ]
