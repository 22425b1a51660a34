"""scripts/gpu_check.sh in its CPU dry run: every stage runs, stays in its budget, prints one
line per row, and packs what it made into OUT/<stage>.tgz, also when stopped early; a call's
archives resume the run on a fresh copy of the working tree (as a GPU machine gets it); the
row counts in docs/gpu.md are the script's grids."""

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pandas as pd
import pytest

from attnbench.impls.xformers_kernels import build_mismatch

ROOT = Path(__file__).resolve().parent.parent
SCRIPT_IN_REPO = Path("scripts") / "gpu_check.sh"
SCRIPT = ROOT / SCRIPT_IN_REPO


def gpu_check(stage, tmp_path, *extra, budget=480, script=SCRIPT, out=None, **env):
    """The script's dry run; its work folder is tmp_path/work unless ATTNBENCH_WORK is given
    ("" = the checkout the script is in)."""
    env = {"ATTNBENCH_WORK": str(tmp_path / "work"), **env}
    if not env["ATTNBENCH_WORK"]:
        del env["ATTNBENCH_WORK"]
    base = {k: v for k, v in os.environ.items() if k != "ATTNBENCH_WORK"}
    return subprocess.run(
        ["bash", str(script), stage, str(out or tmp_path / "out"), *extra],
        capture_output=True,
        text=True,
        timeout=900,
        env={**base, "ATTNBENCH_DRY_RUN": "1", "ATTNBENCH_BUDGET_S": str(budget), **env},
    )


def packed(tmp_path, stage, out=None) -> list[str]:
    with tarfile.open((out or tmp_path / "out") / f"{stage}.tgz") as tar:
        return tar.getnames()


def fresh_copy(dest: Path) -> Path:
    """The working tree as a GPU call gets it: tracked and untracked-not-ignored files, no .git."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
        text=True, check=True,
    ).stdout.split("\0")  # fmt: skip
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


@pytest.mark.parametrize(
    "args,needle",
    [
        (["everything"], "unknown stage 'everything'"),
        (["env,race,nope"], "unknown stage 'nope'"),
        (["env,tests,race,full"], "4 stages in one call; at most 3"),
        (["--from", "/no/such.tgz", "env"], "--from /no/such.tgz: no such archive"),
    ],
)
def test_bad_stages_are_one_line_and_exit_2(tmp_path, args, needle):
    proc = subprocess.run(
        ["bash", str(SCRIPT), *args[:-1], args[-1], str(tmp_path / "out")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "stage",
    # env alone (its ceilings in its log): slow; the resume test below runs it in a call of two
    [pytest.param(s, marks=pytest.mark.slow) for s in ("env", "tests", "race", "full", "lab-bwd")],
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
    if stage == "lab-bwd":  # the lab's dry run: its rows and its table
        assert {"results/lab-bwd-dry-run/kernel_lab.jsonl", "logs/lab-bwd.log"} <= set(names)
        assert "| bwd | dq_tma | ok |" in proc.stdout


@pytest.mark.slow
def test_fidelity_stage_gives_a_verdict_per_check(tmp_path):
    proc = gpu_check("fidelity", tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    for check in ("timer vs profiler", "repeatability", "backend label"):
        assert f"fidelity: {check}:" in proc.stdout
    assert "backend label: " in proc.stdout and "PASS" in proc.stdout  # CPU ops name it
    assert any(n.endswith("fidelity.csv") for n in packed(tmp_path, "fidelity"))


@pytest.mark.slow  # about 3 min (its budget is the point): pytest -m slow -k fresh_copy
def test_a_call_stopped_by_its_budget_resumes_on_a_fresh_copy(tmp_path):
    """Call 1 (env and first-light) on one copy of the working tree, stopped by its budget
    (the slow impl waits at the first case's longer length, after two rows); its archives
    brought to a fresh copy (.lease/, as docs/gpu.md says); call 2 finishes the run there,
    measuring only the rows call 1 did not."""
    first_copy = fresh_copy(tmp_path / "a")
    plugin = ["--plugin", "tests/plugins/slow.py", "--impls", "slow,sdpa"]  # in the copy
    out1, out2 = tmp_path / "out1", tmp_path / "out2"
    started = time.monotonic()
    first = gpu_check(
        "env,first-light", tmp_path, *plugin, "--timeout", "900",  # the budget stops it
        budget=150, script=first_copy / SCRIPT_IN_REPO, out=out1, ATTNBENCH_WORK="",
        ATTNBENCH_SLOW_S="600", ATTNBENCH_SLOW_MIN_SEQ="64",
        ATTNBENCH_RESERVE_S="5",
    )  # fmt: skip
    took = time.monotonic() - started
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    assert "stopped early" in first.stdout and took < 150 + 40, took  # the budget, kill-after
    for name in ("env.log", "env.tgz", "first-light.log", "first-light.tgz"):
        assert (out1 / name).exists(), name
    assert "stopped early" in (out1 / "first-light.log").read_text()  # the log as it went
    assert "stage env: budget" in (out1 / "env.log").read_text()  # its own log, its budget
    assert "logs/env.log" in packed(tmp_path, "env", out1)
    done_first = sum(line.startswith("[") for line in first.stdout.splitlines())
    assert done_first == 2, first.stdout[-3000:]  # slow and sdpa at S32; slow at S64 waits

    second_copy = fresh_copy(tmp_path / "b")
    lease = second_copy / ".lease"
    lease.mkdir()
    for archive in out1.glob("*.tgz"):
        shutil.copy(archive, lease)
    sha = "0123456789abcdef0123456789abcdef01234567"
    (lease / "source").write_text(f"sha={sha}\ndirty=0\nstamped_utc=now\n")
    second = gpu_check(
        "first-light", tmp_path, *plugin, script=second_copy / SCRIPT_IN_REPO, out=out2,
        ATTNBENCH_WORK="", ATTNBENCH_SLOW_S="0.001",
    )  # fmt: skip
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-2000:]
    assert f"({done_first} rows already done)" in second.stdout
    lines = [line for line in second.stdout.splitlines() if line.startswith("[")]
    assert len(lines) == 16 - done_first and lines[-1].startswith(f"[{16 - done_first}/")
    run = second_copy / "results" / "first-light-dry-run"
    df = pd.read_csv(run / "results.csv")
    assert len(df) == 16 and not df.duplicated(["impl", "mode", "seq_q", "causal"]).any()
    assert (df["status"] == "ok").all()
    resumed_env = next(run.glob("env-resume-*.json")).read_text()
    assert sha in resumed_env  # git_sha from the stamp: the copy has no .git
    assert any(n.endswith("results.csv") for n in packed(tmp_path, "first-light", out2))


def _doc_rows() -> dict[str, str]:
    """docs/gpu.md's stage table: stage -> its rows cell."""
    rows = {}
    for line in (ROOT / "docs" / "gpu.md").read_text().splitlines():
        m = re.match(r"\| `([a-z0-9-]+)` \|[^|]*\| ([^|]+) \|", line)
        if m:
            rows[m.group(1)] = m.group(2).strip()
    return rows


def plan(stages: str, budget: int = 450) -> list[str]:
    proc = subprocess.run(
        ["bash", str(SCRIPT), stages], capture_output=True, text=True, timeout=60,
        env={**os.environ, "ATTNBENCH_PLAN": "1", "ATTNBENCH_BUDGET_S": str(budget)},
    )  # fmt: skip
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    return proc.stdout.splitlines()


STAGES = re.search(r'STAGES="([^"]+)"\nSTAGES\+=" ([^"]+)"', SCRIPT.read_text()).groups()


@pytest.mark.parametrize("stage", " ".join(STAGES).split())
def test_plan_mode_prints_every_stages_budget_expected_seconds_and_commands(stage):
    lines = plan(stage)
    head = re.fullmatch(rf"plan: {stage} budget (\d+) s, expected about (\d+) s", lines[0])
    assert head and int(head.group(2)) > 0, lines
    commands = [line for line in lines[1:-1] if line.startswith(f"plan: {stage} $ ")]
    assert commands and len(commands) == len(lines) - 2, lines  # nothing but its commands
    assert lines[-1] == f"plan: {stage}: expected about {head.group(2)} s in all, budget 450 s"


def test_a_call_exits_non_zero_when_a_stage_fails_with_each_stages_exit_last(tmp_path):
    proc = gpu_check("first-light,launch", tmp_path, "--impls", "nope", budget=200)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "stage first-light: run first-light-dry-run FAILED (exit 2)" in proc.stdout
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("gpu_check.sh: first-light launch done in ")
    assert last.endswith("; exits: first-light=2 launch=0")
    assert "stage launch: packed" in proc.stdout  # the stage after it still ran


@pytest.mark.skipif(
    importlib.util.find_spec("xformers") is not None and build_mismatch() is None,
    reason="docs/gpu.md counts the image's rows, where xformers cannot run: a preset's grid "
    "leaves an impl that cannot run out, and here xformers runs",
)
def test_the_row_counts_in_docs_gpu_md_are_the_scripts_grids(capsys):
    from attnbench.cli import main

    lines = plan("first-light,fidelity,race") + plan("race-full,llama,full") + plan("scaling")
    counts: dict[str, list[int]] = {}
    for line in lines:
        stage, dollar, *cmd = shlex.split(line.removeprefix("plan: "))
        if dollar != "$" or cmd[:3] != ["python3", "-m", "attnbench"] or cmd[3] == "fidelity":
            continue  # a sweep's line (attnbench sweep or race)
        assert main([*cmd[3:], "--dry-run"]) == 0
        text = capsys.readouterr().out
        counts.setdefault(stage, []).append(int(re.search(r"= (\d+) rows", text).group(1)))
    assert set(counts) == {"first-light", "fidelity", "race", "race-full", "llama", "full",
                           "scaling"}  # fmt: skip
    doc = _doc_rows()
    for stage, ns in counts.items():
        want = str(ns[0]) if len(ns) == 1 else f"{len(ns)} × {ns[0]}"
        assert doc.get(stage) == want, (stage, doc.get(stage), ns)
