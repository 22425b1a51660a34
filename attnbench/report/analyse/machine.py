"""The machine a run's rows were measured on, as a report names it: the device's title, and
whether the machine was busy when the sweep started (its times are then inflated)."""

from __future__ import annotations

import pandas as pd

BUSY_LOAD_SHARE = 0.5  # a 1-minute load average over this share of the cores: a busy machine


def device_title(env: dict, df: pd.DataFrame) -> str:
    """'NVIDIA H100 80GB HBM3 (cuda)', 'Intel Xeon (cpu, 2 threads)', or the rows' devices."""
    device = env.get("device") or ", ".join(sorted(map(str, df["device"].dropna().unique())))
    if env.get("gpu_name") and str(device).startswith("cuda"):
        return f"{env['gpu_name']} ({device})"
    if env.get("cpu_name"):
        threads = f", {env['cpu_threads']} threads" if env.get("cpu_threads") else ""
        return f"{env['cpu_name']} ({device}{threads})"
    return str(device) or "unknown device"


def busy_machine(env: dict) -> bool:
    """A CPU run whose 1-minute load average at start exceeded half the cores."""
    load, cores = env.get("load_avg_1m"), env.get("cpu_count")
    cpu = not str(env.get("device", "cpu")).startswith("cuda")
    return bool(cpu and load is not None and cores and load > BUSY_LOAD_SHARE * cores)
