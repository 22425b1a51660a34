"""What a run runs on, probed: the machine and device (env.json's fields, store/env.py), the
GPU and host that ran a row, the checkout's git state and version."""

from __future__ import annotations

import functools
import os
import platform
import shlex
import socket
import subprocess
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from attnbench import checkout
from attnbench.impls.xformers_kernels import xformers_kernels
from attnbench.measure.clocks import driver_version, gpu_state
from attnbench.store.env import DEVICE_FIELDS, FIELDS, GPU_STATE_FIELDS, GPU_WHERE


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# a run's outputs (the default --results-dir and --reports-dir): regenerating a committed run
# rewrites them, which is not a change to the code that ran
OUTPUT_DIRS = ("results", "reports")
DIRTY_FILES_SHOWN = 20


def _git(*args: str, cwd: Path | None = None) -> str | None:
    """git's answer in ``cwd``, by default attnbench's checkout; None for an installed package
    (its folder's git, if any, would be another project's) or without git."""
    cwd = cwd or checkout.root()
    if cwd is None:
        return None
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, cwd=cwd)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.rstrip() if out.returncode == 0 else None


def git_state(root: Path | None = None) -> dict:
    """The commit that ran and whether the checkout differs from it: tracked files changed,
    added or deleted, and files git does not ignore or track (a drop-in impl, say), outside
    OUTPUT_DIRS; None for each where ``root`` is not a git checkout. ``git_dirty_files``
    names the first DIRTY_FILES_SHOWN."""
    excluded = [f":(exclude){d}" for d in OUTPUT_DIRS]
    status = _git("status", "--porcelain", "--untracked-files=all", "--", ".", *excluded, cwd=root)
    files = None if status is None else [line[3:] for line in status.splitlines() if line]
    sha = _git("rev-parse", "HEAD", cwd=root)
    if sha is None and os.environ.get("ATTNBENCH_GIT_SHA"):
        # a copy without .git (a GPU machine's copy of the working tree): the stamp that
        # scripts/lease_stamp.sh wrote beside it, exported by scripts/gpu_check.sh
        dirty = os.environ.get("ATTNBENCH_GIT_DIRTY")
        return {
            "git_sha": os.environ["ATTNBENCH_GIT_SHA"],
            "git_dirty": None if dirty is None else dirty == "1",
            "git_dirty_files": None,
        }
    return {
        "git_sha": sha,
        "git_dirty": None if files is None else bool(files),
        "git_dirty_files": None if files is None else files[:DIRTY_FILES_SHOWN],
    }


def collect_env(argv: list[str], seed: int, device: str, packages=()) -> dict:
    """env.json's FIELDS for this machine and ``device``. ``packages``: the modules the run's
    impls require (``Impl.requires``), whose versions it records; xformers' operator record
    only where xformers is one of them (importing it takes seconds)."""
    import torch

    cuda = torch.cuda.is_available() and device.startswith("cuda")
    props = torch.cuda.get_device_properties(device) if cuda else None
    values = {
        "time_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(argv),
        "seed": seed,
        "device": device,
        "gpu_name": props.name if props else None,
        "gpu_sm_count": props.multi_processor_count if props else None,
        "gpu_mem_gib": round(props.total_memory / 2**30, 2) if props else None,
        "gpu_l2_mib": round(props.L2_cache_size / 2**20, 1) if props else None,
        "gpu_capability": f"{props.major}.{props.minor}" if props else None,
        "driver": driver_version() if cuda else None,
        "cpu_name": cpu_name(),
        "cpu_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        **(gpu_state(device) if cuda else dict.fromkeys(GPU_STATE_FIELDS)),
        "triton": _version("triton"),
        "xformers": _version("xformers"),
        "xformers_kernels": (
            xformers_kernels() if "xformers" in packages and _version("xformers") else None
        ),
        "packages": {module: _version(module) for module in sorted(packages)},
        **git_state(),
        "attnbench": checkout.version(),
        "checkout": checkout.root() is not None,
    }
    return {k: values[k] for k in FIELDS}


def version_line() -> str:
    """attnbench --version: the version, and the checkout it runs from if any."""
    root = checkout.root()
    return f"attnbench {checkout.version()}" + (f" (checkout {root})" if root else "")


@functools.cache
def device_name(device: str) -> str:
    """What ran a row on ``device``: the GPU's name on CUDA, else the CPU model."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    return cpu_name()


def device_env(device: str, packages=()) -> dict:
    """This machine's entry for env.json ``devices``: host, device name, which GPU (its
    index and UUID, blank on the CPU), GPU, driver and versions (of ``packages`` too)."""
    env = collect_env([], 0, device, packages)
    return {
        "host": socket.gethostname(),
        "device_name": device_name(device),
        **which_gpu(device),
        **{k: env[k] for k in DEVICE_FIELDS},
    }


def which_gpu(device: str) -> dict:
    """``gpu_index`` (the machine's numbering, through CUDA_VISIBLE_DEVICES, which Ray sets
    for each actor) and ``gpu_uuid`` of ``device``; None on the CPU."""
    import torch

    if not (device.startswith("cuda") and torch.cuda.is_available()):
        return dict.fromkeys(GPU_WHERE)
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    return {
        "gpu_index": int(visible[index]) if visible[index:] and visible[index].isdigit() else index,
        "gpu_uuid": f"GPU-{uuid}" if uuid else None,
    }
