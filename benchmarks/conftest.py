"""pytest-benchmark set-up: where the numbers came from goes into every saved run."""

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from attnbench.run.executing.environment import collect_env  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def pytest_benchmark_update_machine_info(config, machine_info):
    """GPU name, torch / CUDA / cuDNN / triton / xformers versions (env.json's fields), so
    that --benchmark-compare warns when two runs are not like for like. The commit is in
    pytest-benchmark's own commit_info; nothing that changes from run to run goes here."""
    env = collect_env(sys.argv, seed=0, device=DEVICE)
    machine_info["attnbench"] = {
        key: env[key]
        for key in (
            "device",
            "gpu_name",
            "gpu_sm_count",
            "gpu_mem_gib",
            "cpu_name",
            "cpu_threads",
            "torch",
            "cuda",
            "cudnn",
            "triton",
            "xformers",
        )
    }


def pytest_configure(config):
    """A run that saves or compares benchmarks must measure: pytest-benchmark turns itself
    off under xdist (the project's default ``-n auto``) and under ``--benchmark-disable``
    (pyproject's addopts), and would then save nothing without a word. Such a run is refused
    with the missing flag named."""
    # an xdist worker has workerinput (its environment is no guide: a pytest started from a
    # worker's test inherits PYTEST_XDIST_WORKER)
    if hasattr(config, "workerinput") or not config.pluginmanager.hasplugin("benchmark"):
        return
    wants = [
        flag
        for flag, option in (
            ("--benchmark-save", "benchmark_save"),
            ("--benchmark-autosave", "benchmark_autosave"),
            ("--benchmark-compare", "benchmark_compare"),
            ("--benchmark-compare-fail", "benchmark_compare_fail"),
            ("--benchmark-json", "benchmark_json"),
        )
        if config.getoption(option, None)
    ]
    measuring = config.getoption("benchmark_enable", False) or not config.getoption(
        "benchmark_disable", False
    )
    if not (wants or config.getoption("benchmark_enable", False)):
        return
    if not measuring:
        raise pytest.UsageError(
            f"{wants[0]} needs --benchmark-enable (pyproject's addopts disable the timing): "
            f"pytest benchmarks/ -n 0 --benchmark-enable ..."
        )
    if config.getoption("numprocesses", None):
        raise pytest.UsageError(
            "pytest-benchmark measures nothing in parallel workers (pyproject's addopts run "
            "-n auto): add -n 0, e.g. pytest benchmarks/ -n 0 --benchmark-enable ..."
        )
