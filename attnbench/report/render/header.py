"""The report's opening: the run's header (device, command, versions, ceilings) and the
summary's first lines (row counts, impls that ran PyTorch's own kernels)."""

from __future__ import annotations

import pandas as pd

from attnbench.measure.backends import PYTORCH_PREFIX
from attnbench.report.analyse import derived
from attnbench.report.render.markdown import MISSING, table
from attnbench.spec import PRESETS
from attnbench.store.env import code_version
from attnbench.store.schema import STATUSES


def device_title(env: dict, df: pd.DataFrame) -> str:
    device = env.get("device") or ", ".join(sorted(map(str, df["device"].dropna().unique())))
    if env.get("gpu_name") and str(device).startswith("cuda"):
        return f"{env['gpu_name']} ({device})"
    if env.get("cpu_name"):
        threads = f", {env['cpu_threads']} threads" if env.get("cpu_threads") else ""
        return f"{env['cpu_name']} ({device}{threads})"
    return str(device) or "unknown device"


case_label = derived.case_label  # declared once, in analyse/derived.py


def header_lines(run) -> list[str]:
    """The run's header (a RunAnalysis): device, date, command, versions, ceilings."""
    run_id, df, env = run.run_id, run.frame, run.env

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
        ("device", device_title(env, df)),
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
    other_ids = sorted(set(df["run_id"].dropna()) - {run_id}) if "run_id" in df else []
    if other_ids:
        rows.append(("note", f"results.csv also holds rows of run ids {', '.join(other_ids)}"))
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


def busy_machine(env: dict) -> bool:
    """A CPU run whose 1-minute load average at start exceeded half the cores."""
    load, cores = env.get("load_avg_1m"), env.get("cpu_count")
    cpu = not str(env.get("device", "cpu")).startswith("cuda")
    return bool(cpu and load is not None and cores and load > 0.5 * cores)


def counts_line(run) -> str:
    """Rows per status, and how many ok rows disagree (a RunAnalysis)."""
    df = run.frame
    counts = df["status"].fillna("missing").value_counts()
    order = {s: i for i, s in enumerate((*STATUSES, "missing"))}
    parts = [f"{counts[s]} {s}" for s in sorted(counts.index, key=lambda s: order.get(s, 99))]
    ok = derived.ok_rows(df)
    n_bad = int((~ok["agrees"].eq(True).fillna(False)).sum())
    verb = "does" if n_bad == 1 else "do"
    agree = (
        f"all {len(ok)} ok rows agree with the float64 reference"
        if n_bad == 0
        else f"**{n_bad} of {len(ok)} ok rows {verb} not agree with the float64 reference**"
    )
    return f"{len(df)} rows: {', '.join(parts) or 'none'}; {agree}."


def borrowed_lines(run) -> list[str]:
    """Impls whose ok rows ran PyTorch's own kernels (backend pytorch:*, e.g. xformers
    without its C++/CUDA extension): said once, up front, so that no table below reads as an
    independent comparison."""
    ok = derived.ok_rows(run.frame)
    borrowed = ok[borrowed_kernels(ok)]
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


def borrowed_kernels(df: pd.DataFrame) -> pd.Series:
    return df["backend"].fillna("").astype(str).str.startswith(PYTORCH_PREFIX)
