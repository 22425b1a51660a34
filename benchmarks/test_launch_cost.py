"""benchmarks/launch_cost.py: host against GPU time per call. It needs a GPU; without one it
says so in one line and exits 2 (the rule for bad input)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent / "launch_cost.py"


def run(*args):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: the gpu test runs")
def test_without_a_gpu_it_says_so_in_one_line_and_exits_2():
    proc = run("--impls", "sdpa")
    assert proc.returncode == 2 and not proc.stdout
    assert proc.stderr.strip() == "launch_cost.py: needs a CUDA GPU; none is visible to torch"


def test_an_unknown_launch_path_is_one_line_and_exit_2():
    pytest.importorskip("triton")
    proc = run("--launch-paths", "cached,fast")
    assert proc.returncode == 2 and not proc.stdout
    assert proc.stderr.strip() == (
        "launch_cost.py: --launch-paths cached,fast: each one of cached, autotuner"
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_it_gives_host_and_gpu_microseconds_per_call():
    proc = run("--impls", "sdpa,triton_flash", "--seq-len", "256", "--mode", "fwd", "--calls", "20")
    assert proc.returncode == 0, proc.stderr
    rows = proc.stdout.splitlines()[1:]
    assert len(rows) == 4, proc.stdout  # two impls, causal and not
    for row in rows:
        found = re.search(r"\s(\d+\.\d)\s+(\d+\.\d)(  launch-bound)?$", row)
        assert found and float(found[1]) > 0 and float(found[2]) > 0, row
