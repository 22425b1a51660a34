"""scripts/gpu_check.sh in its CPU dry run: every stage runs, stays in its budget, prints one
line per row, and packs what it made into OUT/<stage>.tgz, also when stopped early."""

import os
import subprocess
import tarfile
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def gpu_check(stage, tmp_path, *extra, budget=480, **env):
    return subprocess.run(
        ["bash", str(SCRIPT), stage, str(tmp_path / "out"), *extra],
        capture_output=True,
        text=True,
        timeout=900,
        env={
            **os.environ,
            "ATTNBENCH_DRY_RUN": "1",
            "ATTNBENCH_WORK": str(tmp_path / "work"),
            "ATTNBENCH_BUDGET_S": str(budget),
            **env,
        },
    )


def packed(tmp_path, stage) -> list[str]:
    with tarfile.open(tmp_path / "out" / f"{stage}.tgz") as tar:
        return tar.getnames()


def test_unknown_stage_is_one_line_and_exit_2(tmp_path):
    proc = gpu_check("everything", tmp_path)
    assert proc.returncode == 2 and "unknown stage 'everything'" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "stage",
    ["env", *(pytest.param(s, marks=pytest.mark.slow) for s in ("tests", "race", "full"))],
)
def test_each_stage_runs_dry_and_packs_its_results(tmp_path, stage):
    proc = gpu_check(stage, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    names = packed(tmp_path, stage)
    assert f"stage {stage}: packed" in proc.stdout
    if stage in ("race", "full"):
        run = next(n for n in names if n.endswith("results.csv"))
        rows = [line for line in proc.stdout.splitlines() if line.startswith("[")]
        assert rows and rows[-1].startswith(f"[{len(rows)}/{len(rows)}]")  # one line per row
        assert any(n.endswith("report.md") for n in names)
        assert run.startswith("results/")
    if stage == "env":
        assert "logs/env.log" in names and '"copy_gb_s"' in proc.stdout
    if stage == "tests":  # on the CPU the GPU tests say why they skip
        assert "logs/tests.log" in names and "needs a CUDA GPU" in proc.stdout


@pytest.mark.slow
def test_fidelity_stage_gives_a_verdict_per_check(tmp_path):
    proc = gpu_check("fidelity", tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    for check in ("timer vs profiler", "repeatability", "backend label"):
        assert f"fidelity: {check}:" in proc.stdout
    assert "backend label: " in proc.stdout and "PASS" in proc.stdout  # CPU ops name it
    assert any(n.endswith("fidelity.csv") for n in packed(tmp_path, "fidelity"))


def test_a_stage_stopped_by_its_budget_packs_and_resumes(tmp_path):
    plugin = ["--plugin", str(ROOT / "tests" / "plugins" / "slow.py"), "--impls", "slow,sdpa"]
    first = gpu_check(
        "first-light", tmp_path, *plugin, budget=40, ATTNBENCH_RESERVE_S="0", ATTNBENCH_SLOW_S="1.0"
    )
    assert first.returncode == 0, first.stderr[-2000:]
    assert "stopped early" in first.stdout
    assert (tmp_path / "out" / "first-light.tgz").exists()
    second = gpu_check("first-light", tmp_path, *plugin, ATTNBENCH_SLOW_S="0.001")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-2000:]
    csv = tmp_path / "work" / "results" / "first-light-dry-run" / "results.csv"
    df = pd.read_csv(csv)
    assert len(df) == 16 and not df.duplicated(["impl", "mode", "seq_q", "causal"]).any()
    assert any(n.endswith("results.csv") for n in packed(tmp_path, "first-light"))
