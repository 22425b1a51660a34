"""env.json: where and with what a run ran (device, driver, library versions, git state), and
the speed anchor's reference times (``anchor``); its fields declared once, and its one writer.
What fills it (probing the machine) is run/executing/environment.py."""

from __future__ import annotations

import json
from pathlib import Path

from attnbench.store.atomic import write_json_atomic

GPU_STATE_FIELDS = (  # the GPU's clocks, power and temperature (measure/clocks.gpu_state)
    "gpu_sm_clock_mhz",
    "gpu_sm_clock_max_mhz",
    "gpu_mem_clock_max_mhz",
    "gpu_power_w",
    "gpu_power_limit_w",
    "gpu_temp_c",
)
GPU_WHERE = ("gpu_index", "gpu_uuid")  # which GPU ran a row (results.csv's columns too)


# env.json's fields of the machine and the code, in the file's order, declared once: each with
# where else it is used: "device" (each device's entry in env.json ``devices``), "compare"
# (attnbench compare's table of what differs between two runs)
FIELDS: dict[str, tuple[str, ...]] = {
    "time_utc": (),
    "command": ("compare",),
    "seed": (),
    "device": ("compare",),
    "gpu_name": ("device", "compare"),
    "gpu_sm_count": ("device",),
    "gpu_mem_gib": ("device",),
    "gpu_l2_mib": (),
    "gpu_capability": ("device",),
    "driver": ("device",),
    "cpu_name": ("device", "compare"),
    "cpu_threads": ("device", "compare"),
    "cpu_count": (),
    "load_avg_1m": (),
    "python": ("device",),
    "platform": ("device",),
    "torch": ("device", "compare"),
    "cuda": ("device", "compare"),
    "cudnn": ("device", "compare"),
    **dict.fromkeys(GPU_STATE_FIELDS, ()),
    "triton": ("device", "compare"),
    "xformers": ("device", "compare"),
    "xformers_kernels": ("device",),
    "packages": ("device", "compare"),
    "git_sha": ("device", "compare"),
    "git_dirty": ("compare",),
    "git_dirty_files": (),
    "attnbench": (),
    "checkout": (),
}
DEVICE_FIELDS = tuple(k for k, uses in FIELDS.items() if "device" in uses)
COMPARE_FIELDS = tuple(k for k, uses in FIELDS.items() if "compare" in uses)


def code_version(env: dict) -> str | None:
    """Which attnbench made a run, in words: the commit of a checkout (and whether it had
    uncommitted changes), or the version of an installed package; None when env.json says
    neither (written before it recorded them)."""
    if env.get("git_sha"):
        return env["git_sha"] + (" (uncommitted changes)" if env.get("git_dirty") else "")
    if env.get("attnbench"):
        where = "a checkout without git" if env.get("checkout") else "an installed package"
        return f"attnbench {env['attnbench']} ({where}: no git commit)"
    return None


def read_anchor(env_path: Path) -> dict:
    """env.json's ``anchor`` (the speed anchor's reference: ``start_unix``, the run's start,
    and its median times at the run's first timed case, ``compute_ms`` per dtype and
    ``memory_ms``); {} when env.json or the entry is missing."""
    try:
        return dict(json.loads(Path(env_path).read_text(encoding="utf-8")).get("anchor") or {})
    except (OSError, ValueError):
        return {}


def write_anchor(env_path: Path, entry: dict) -> None:
    """Set env.json's ``anchor`` entry, the rest kept (nothing when there is no env.json)."""
    try:
        env = json.loads(Path(env_path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    write_json_atomic(env_path, {**env, "anchor": entry})


def write_env(env_path: Path, env: dict) -> None:
    """env.json, whole (replaced at once)."""
    write_json_atomic(env_path, env)
