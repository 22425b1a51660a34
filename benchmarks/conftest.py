"""pytest-benchmark set-up: where the numbers came from goes into every saved run."""

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from attnbench.store.env import collect_env  # noqa: E402

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
