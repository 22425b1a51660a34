"""benchmarks/kernel_lab.py: its CPU dry run (Triton's interpreter, tiny shapes, two variants
and one that cannot compile), planted faults (a variant that hangs in the compile phase, one
that hangs in the timing pass, a default forward that fails), its budget, and its one-line
refusals (exit 2)."""

import functools
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parent
SCRIPT = BENCH / "kernel_lab.py"
sys.path.insert(0, str(BENCH))  # kernel_lab_jobs

pytest.importorskip("triton")


def in_process(capsys, monkeypatch, *args) -> tuple[int, str]:
    """The lab's main() in this process, for what is settled before a kernel runs (bad input,
    no GPU, a spent budget): no interpreter's start-up. Its exit code and stderr."""
    import kernel_lab

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # restored after the test (main sets it too)
    capsys.readouterr()
    code = kernel_lab.main(list(args))
    return code, capsys.readouterr().err


def run(*args, script=SCRIPT, env=None):
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=600,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


@functools.cache
def interpreter_broken() -> str | None:
    """tests/interpreter.py's answer, asked in a process that interprets (this one may have
    imported triton without TRITON_INTERPRET): the dry run needs an interpreter that runs the
    kernels' loops (not triton 3.6 with numpy 2.5, the GPU image's pair)."""
    code = "import interpreter; print(interpreter.broken_reason() or '')"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
        cwd=BENCH.parent / "tests", env={**os.environ, "TRITON_INTERPRET": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip() or None


@pytest.fixture
def interpreter():
    why = interpreter_broken()
    if why:
        pytest.skip(why)


# The lab with planted faults (PLANT: which; PLANT_WHERE: "everywhere", or "lab" for the lab's
# own process only, its compile jobs untouched): the variant of config HANG never returns; the
# default forward (the backward variants' input) raises.
PLANTED = """
import multiprocessing, os, sys, time
sys.path.insert(0, {bench!r})
import kernel_lab

HANG = {hang!r}
real_run, real_default = kernel_lab.run_variant, kernel_lab.default_forward


def planted(fault):
    here = os.environ["PLANT_WHERE"] == "everywhere" or multiprocessing.parent_process() is None
    return fault in os.environ["PLANT"].split(",") and here


def run_variant(kind, cfg, *args, **kwargs):
    if kind == "fwd" and cfg == HANG and planted("hang"):
        time.sleep(3600)
    return real_run(kind, cfg, *args, **kwargs)


def default_forward(case, inputs):
    if planted("default"):
        raise RuntimeError("planted: the default forward fails")
    return real_default(case, inputs)


kernel_lab.run_variant, kernel_lab.default_forward = run_variant, default_forward
if __name__ == "__main__":
    sys.exit(kernel_lab.main())
"""
HANG = (16, 16, 4, 3, True)
HANG_WS = (16, 16, 4, 3, False, (("ONE_LOOP", True), ("WS", True)))


def planted_lab(tmp_path, hang, plant, where, *args):
    script = tmp_path / "planted_lab.py"
    script.write_text(PLANTED.format(bench=str(BENCH), hang=hang))
    return run(*args, "--out", str(tmp_path / "out"), script=script,
               env={"PLANT": plant, "PLANT_WHERE": where})  # fmt: skip


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "kernel_lab.jsonl").read_text().splitlines()]


def test_dry_run_checks_times_and_tables_each_variant_and_a_failure_costs_one_row(
    tmp_path, interpreter
):
    # the bad variant's BLOCK_N (24) is no power of two: its compile and its row fail
    proc = run("--dry-run", "--causal", "true", "--out", str(tmp_path),
               "--extra", "fwd:bad=(16,24,4,2,True)")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    got = {(r["kind"], r["variant"]): r for r in rows(tmp_path)}
    assert set(got) == {("fwd", "ws"), ("bwd", "dq_tma"), ("fwd", "bad"), ("fwd", "sdpa"),
                        ("bwd", "sdpa")}  # fmt: skip
    for key in [("fwd", "ws"), ("bwd", "dq_tma"), ("fwd", "sdpa"), ("bwd", "sdpa")]:
        assert got[key]["status"] == "ok" and got[key]["time_ms"] > 0, got[key]
    assert "ONE_LOOP" in got[("fwd", "ws")]["config"]
    assert got[("fwd", "ws")]["compile_note"] == "interpreted: nothing compiled"
    bad = got[("fwd", "bad")]
    assert (
        bad["status"] == "failed" and bad["reason"].startswith("compile: ") and "time_ms" not in bad
    )
    assert len({r["call"] for r in got.values()}) == 1  # one call: its rows compare
    table = (tmp_path / "kernel_lab.md").read_text()
    assert table.startswith("# Kernel lab: cpu, call ")
    assert "| case | kind | variant | status | time_ms |" in table
    assert table.count("\n| B") == 5 and "| fwd | bad | failed |" in table
    # the fastest control of a (case, kind) is 1x itself
    assert re.search(r"\| fwd \| sdpa \| ok \| [\d.e+-]+ \| [\d.e+-]+ \| 1 \|", table), table


def test_rows_past_the_budget_are_skipped_with_the_reason(tmp_path, capsys, monkeypatch):
    code, err = in_process(
        capsys, monkeypatch, "--dry-run", "--budget-s", "0", "--out", str(tmp_path)
    )
    assert code == 0, err[-3000:]
    got = rows(tmp_path)
    assert len(got) == 2 * 4  # two cases (full, causal) x (two variants + sdpa fwd and bwd)
    assert all(r["status"] == "skipped" and "budget of 0 s" in r["reason"] for r in got)


@pytest.mark.slow  # about 40 s: a compile job's timeout spent waiting (the job runner's own
# hang test below runs in the default suite)
def test_a_variant_that_hangs_in_the_compile_phase_costs_only_its_rows(tmp_path, interpreter):
    """Its compile job has no answer within --timeout-s: killed, its rows are ``hang`` with
    the reason and are not timed; every other row is measured."""
    started = time.monotonic()
    proc = planted_lab(tmp_path, HANG, "hang", "everywhere", "--dry-run", "--timeout-s", "30",
                       "--causal", "true", "--extra", f"fwd:hang={HANG!r}")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert time.monotonic() - started < 200
    got = rows(tmp_path / "out")
    hung = [r for r in got if r["variant"] == "hang"]
    assert len(hung) == 1 and hung[0]["status"] == "hang", hung
    assert hung[0]["reason"].startswith("compile: no answer within 30 s")
    assert "time_ms" not in hung[0]
    others = [r for r in got if r["variant"] != "hang"]
    assert len(others) == 4 and all(r["status"] == "ok" for r in others), others
    assert "| fwd | hang | hang |" in (tmp_path / "out" / "kernel_lab.md").read_text()


@pytest.mark.slow  # about 1.5 min: a row's timeout spent waiting
def test_a_warp_specialized_variant_that_hangs_while_timed_is_timed_last(tmp_path, interpreter):
    """It passes the compile phase and hangs in the lab's own process: timed after every other
    row, its row is ``hang``, the rows after it ``skipped`` with why, the table is written."""
    proc = planted_lab(tmp_path, HANG_WS, "hang", "lab", "--dry-run", "--timeout-s", "40",
                       "--variants", "fwd:ws", "--kinds", "fwd", "--extra",
                       f"fwd:hang_ws={HANG_WS!r}")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    got = rows(tmp_path / "out")
    status = [(r["variant"], r["status"]) for r in got]
    # WS variants after the others and the controls of every case; the first one's order kept
    assert status[:2] == [("sdpa", "ok"), ("sdpa", "ok")], status
    assert status[2:] == [("ws", "ok"), ("hang_ws", "hang"), ("ws", "skipped"),
                          ("hang_ws", "skipped")], status  # fmt: skip
    assert got[3]["reason"] == "no result within 40 s; the lab stopped"
    assert all("hang_ws hung before it" in r["reason"] for r in got[4:])
    assert (tmp_path / "out" / "kernel_lab.md").read_text().count("\n| B") == 6


def test_a_failing_default_forward_costs_only_the_backward_variants_rows(tmp_path, interpreter):
    """The backward variants' input fails in the timing pass: their rows say so; the forward
    variants and every control are measured."""
    proc = planted_lab(tmp_path, HANG, "default", "lab", "--dry-run", "--causal", "true")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    got = {(r["kind"], r["variant"]): r for r in rows(tmp_path / "out")}
    assert set(got) == {("fwd", "ws"), ("bwd", "dq_tma"), ("fwd", "sdpa"), ("bwd", "sdpa")}
    for (kind, variant), r in got.items():
        if (kind, variant) == ("bwd", "dq_tma"):
            assert r["status"] == "failed" and "time_ms" not in r, r
            assert r["reason"] == (
                "the default forward failed: RuntimeError: planted: the default forward fails"
            )
        else:
            assert r["status"] == "ok" and r["time_ms"] > 0, r


@pytest.mark.parametrize(
    "args,message",
    [
        (["--dry-run", "--variants", "fwd:nope"], "unknown variant(s) fwd:nope (known: "),
        (["--dry-run", "--extra", "fwd:x=(16,16,4,2,True,(('WS',True),))"], "WS needs ONE_LOOP"),
        (["--dry-run", "--controls", "nope"], "unknown control impl(s) nope"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, args, message):
    code, err = in_process(capsys, monkeypatch, *args, "--out", str(tmp_path))
    assert code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "kernel_lab.jsonl").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_without_a_gpu_it_says_so_and_exits_2(tmp_path, capsys, monkeypatch):
    code, err = in_process(capsys, monkeypatch, "--out", str(tmp_path))
    assert code == 2 and "needs a CUDA GPU" in err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_lab_on_a_gpu_compiles_checks_and_times_with_its_controls(tmp_path):
    proc = run("--variants", "fwd:ws,bwd:dq_tma", "--seq-len", "1024", "--tokens", "2048",
               "--heads", "4", "--controls", "sdpa_flash", "--causal", "true",
               "--rep-ms", "20", "--out", str(tmp_path))  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    got = {(r["kind"], r["variant"]): r for r in rows(tmp_path)}
    for key in [("fwd", "ws"), ("bwd", "dq_tma"), ("fwd", "sdpa_flash"), ("bwd", "sdpa_flash")]:
        assert got[key]["status"] == "ok" and got[key]["time_ms"] > 0, got[key]
    assert got[("fwd", "ws")]["warps"] == 12 and got[("fwd", "ws")]["regs"] > 0
    assert got[("bwd", "dq_tma")]["smem"] <= 232448


JOB_FUNCTIONS = """
import os, time


def answers(x):
    return {"x": x}


def hangs(x):
    time.sleep(3600)


def dies(x):
    os._exit(3)
"""


def test_a_job_that_hangs_or_dies_is_its_own_answer_and_the_others_finish(tmp_path, monkeypatch):
    """The compile phase's runner, on plain functions: a hang is killed at its timeout, a dead
    process is said with its exit code, a job not started before the deadline is skipped."""
    from kernel_lab_jobs import run_jobs

    (tmp_path / "job_functions.py").write_text(JOB_FUNCTIONS)
    monkeypatch.syspath_prepend(str(tmp_path))  # the spawned processes get this sys.path
    import job_functions as f

    jobs = {"a": (1,), "hang": (2,), "dies": (3,), "b": (4,)}
    fns = {"a": f.answers, "hang": f.hangs, "dies": f.dies, "b": f.answers}
    started = time.monotonic()
    got = {
        key: run_jobs(fns[key], {key: args}, 1, 10, time.monotonic() + 120)[key]
        for key, args in jobs.items()
    }
    assert got["a"] == {"x": 1} and got["b"] == {"x": 4}
    assert got["hang"] == {"hang": "no answer within 10 s (its process was killed)"}
    assert got["dies"] == {"error": "its process died (exit code 3) with no answer"}
    assert time.monotonic() - started < 100
    late = run_jobs(f.answers, {"late": (5,)}, 1, 10, time.monotonic() - 1)
    assert late == {"late": {"skipped": "the lab's budget was spent before it started"}}
