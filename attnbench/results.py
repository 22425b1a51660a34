"""The row schema (defined here once), durable CSV append/read, raw samples and env.json."""
from __future__ import annotations

import csv
import json
import os
import platform
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import pandas as pd

from attnbench.clocks import driver_version

STATUSES = ("ok", "unsupported", "oom", "error", "timeout", "crash")

# name -> (pandas dtype, meaning). The order here is the CSV's column order.
COLUMNS: dict[str, tuple[str, str]] = {
    "run_id": ("string", "the sweep this row belongs to"),
    "impl": ("string", "registered impl name"),
    "mode": ("string", "fwd, bwd (backward alone) or fwd_bwd"),
    "batch": ("Int64", "B"),
    "heads": ("Int64", "Hq, query heads"),
    "kv_heads": ("Int64", "Hkv, key/value heads (< heads: GQA/MQA)"),
    "seq_q": ("Int64", "Sq, query length"),
    "seq_kv": ("Int64", "Skv, key/value length"),
    "head_dim": ("Int64", "D"),
    "dtype": ("string", "float32, bfloat16 or float16"),
    "causal": ("boolean", "top-left aligned causal mask (SDPA's is_causal)"),
    "device": ("string", "cpu or cuda"),
    "status": ("string", "one of " + ", ".join(STATUSES)),
    "reason": ("string", "why the status is not ok, or why agrees is false"),
    "time_ms": ("Float64", "median time of one call, milliseconds"),
    "time_ms_p20": ("Float64", "20th percentile of the samples"),
    "time_ms_p80": ("Float64", "80th percentile of the samples"),
    "samples": ("Int64", "number of timing samples behind the median"),
    "tflops": ("Float64", "case FLOPs (unmasked pairs only) / time_ms, 1e12 FLOP/s"),
    "peak_mem_mib": ("Float64", "peak memory above what was allocated before the call, MiB"),
    "max_abs_err": ("Float64", "worst max |x - ref| over out (and dq, dk, dv with backward)"),
    "rel_err": ("Float64", "||x - ref||_2 / ||ref||_2 of the tensor nearest its bound"),
    "agrees": ("boolean", "error within the agreement bound (README: accuracy rule)"),
    "err_bound": ("Float64", "the bound that rel_err was held to"),
    "flops": ("Float64", "FLOPs of the timed work"),
    "seed": ("Int64", "seed of the inputs"),
    "mask": ("string", "none, padding (per-batch valid key lengths) or window; combines with "
                       "causal"),
    "window": ("Int64", "window width W with mask=window, else blank"),
    "level": ("string", "op (attention alone) or layer (projections + attention + output "
                        "projection)"),
    "backend": ("string", "SDPA backend that ran (flash, efficient, cudnn, math); blank for "
                          "impls that are not SDPA"),
    "compile_ms": ("Float64", "torch.compile impls: first call's wall time minus a steady "
                              "call's, ms; never part of time_ms"),
    "recompiled": ("boolean", "torch.compile recompiled during the timing pass (time_ms "
                              "then includes compilation)"),
    "pct_peak": ("Float64", "tflops as a percentage of the matmul rate measured for this "
                            "dtype at the start of the run (env.json ceilings)"),
    "profiler_ms": ("Float64", "CUDA: the profiler's summed kernel time per call, to "
                               "cross-check time_ms (reason notes a >5% difference)"),
    "sm_clock_mhz": ("Float64", "CUDA: median SM clock while timing (NVML)"),
    "power_w": ("Float64", "CUDA: median board power while timing, W (NVML)"),
    "temp_c": ("Float64", "CUDA: median GPU temperature while timing, C (NVML)"),
    "throttle": ("string", "CUDA: clock-slowdown reasons NVML reported while timing "
                           "(none, or e.g. sw_power_cap,hw_thermal)"),
}
METRICS = ("time_ms", "time_ms_p20", "time_ms_p80", "samples", "tflops", "peak_mem_mib",
           "max_abs_err", "rel_err", "agrees", "err_bound", "backend", "compile_ms",
           "recompiled", "pct_peak", "profiler_ms", "sm_clock_mhz", "power_w", "temp_c",
           "throttle")
CASE_KEY = ("impl", "mode", "batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim",
            "dtype", "causal", "device", "mask", "window", "level")
SAMPLE_COLUMNS = ("run_id", *CASE_KEY, "sample", "time_ms")
# --profile: one line per (row, kernel or op), the device's time summed over PROFILED_CALLS
KERNEL_COLUMNS = ("run_id", *CASE_KEY, "kernel", "calls", "total_us", "share")


def _fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if value != value else repr(value)  # NaN never becomes a number
    return str(value)


class CsvAppender:
    """Appends rows to a CSV, each one flushed and fsynced before ``write`` returns. The file
    (with its header, if new) is opened at the first row, so no row means no file."""

    def __init__(self, path: Path, columns: tuple[str, ...]):
        self.path, self.columns = Path(path), tuple(columns)
        self._file = self._writer = None

    def write(self, rows: list[dict] | dict) -> None:
        rows = [rows] if isinstance(rows, dict) else rows
        if not rows:
            return
        if self._file is None:
            new = not self.path.exists() or self.path.stat().st_size == 0
            self._file = open(self.path, "a", newline="", encoding="utf-8")
            self._writer = csv.DictWriter(self._file, fieldnames=self.columns)
            if new:
                self._writer.writeheader()
        for row in rows:
            self._writer.writerow({c: _fmt(row.get(c)) for c in self.columns})
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def row_key(row: dict) -> tuple[str, ...]:
    """The (case, impl) identity of a row, as text, the same from a dict or a CSV line."""
    return tuple(_fmt(row[c]) for c in CASE_KEY)


def repair_tail(path: Path) -> bool:
    """Cut a torn last line (a write cut off by a kill) so it is never parsed as data."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return False
    data = path.read_bytes()
    if data.endswith(b"\n"):
        return False
    with open(path, "r+b") as f:
        f.truncate(data.rfind(b"\n") + 1)
        f.flush()
        os.fsync(f.fileno())
    return True


def done_keys(run_dir: Path) -> set[tuple[str, ...]]:
    """Keys of the rows already in run_dir/results.csv, after repairing its tail; samples and
    kernels of rows that never reached results.csv are dropped."""
    results = Path(run_dir) / "results.csv"
    repair_tail(results)
    with open(results, newline="", encoding="utf-8") as f:
        keys = {row_key(r) for r in csv.DictReader(f)}
    for name, columns in (("samples.csv", SAMPLE_COLUMNS), ("kernels.csv", KERNEL_COLUMNS)):
        path = Path(run_dir) / name
        if not path.exists():
            continue
        repair_tail(path)
        with open(path, newline="", encoding="utf-8") as f:
            kept = [r for r in csv.DictReader(f) if row_key(r) in keys]
        tmp = path.with_suffix(".csv.tmp")
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(kept)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    return keys


def row_writer(run_dir: Path) -> CsvAppender:
    return CsvAppender(Path(run_dir) / "results.csv", tuple(COLUMNS))


def samples_writer(run_dir: Path) -> CsvAppender:
    return CsvAppender(Path(run_dir) / "samples.csv", SAMPLE_COLUMNS)


def kernels_writer(run_dir: Path) -> CsvAppender:
    return CsvAppender(Path(run_dir) / "kernels.csv", KERNEL_COLUMNS)


def read_results(path: Path) -> pd.DataFrame:
    """results.csv (or its run folder) as a typed frame; blank cells stay missing."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.csv"
    df = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""])
    for name, (dtype, _) in COLUMNS.items():
        if name not in df:
            continue
        if dtype == "boolean":
            df[name] = df[name].map({"True": True, "False": False}).astype("boolean")
        elif dtype in ("Int64", "Float64"):
            df[name] = pd.to_numeric(df[name]).astype(dtype)
        else:
            df[name] = df[name].astype(dtype)
    return df


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent.parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def collect_env(argv: list[str], seed: int, device: str) -> dict:
    import torch

    cuda = torch.cuda.is_available() and device.startswith("cuda")
    props = torch.cuda.get_device_properties(device) if cuda else None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "time_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([Path(sys.executable).name, *argv]),
        "seed": seed,
        "device": device,
        "gpu_name": props.name if props else None,
        "gpu_sm_count": props.multi_processor_count if props else None,
        "gpu_mem_gib": round(props.total_memory / 2**30, 2) if props else None,
        "gpu_l2_mib": round(props.L2_cache_size / 2**20, 1) if props else None,
        "gpu_capability": f"{props.major}.{props.minor}" if props else None,
        "driver": driver_version() if cuda else None,
        "cpu_name": _cpu_name(),
        "cpu_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "triton": _version("triton"),
        "xformers": _version("xformers"),
        "git_sha": _git("rev-parse", "HEAD"),
        "git_dirty": None if status is None else bool(status),
    }


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = Path(path).with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
