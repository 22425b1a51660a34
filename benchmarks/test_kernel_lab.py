"""benchmarks/kernel_lab.py: its CPU dry run (Triton's interpreter, tiny shapes, two variants
and one that cannot compile), its budget, and its one-line refusals (exit 2)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent / "kernel_lab.py"

pytest.importorskip("triton")


def run(*args):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600
    )


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "kernel_lab.jsonl").read_text().splitlines()]


def test_dry_run_checks_times_and_tables_each_variant_and_a_failure_costs_one_row(tmp_path):
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


def test_rows_past_the_budget_are_skipped_with_the_reason(tmp_path):
    proc = run("--dry-run", "--budget-s", "0", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = rows(tmp_path)
    assert len(got) == 2 * 4  # two cases (full, causal) x (two variants + sdpa fwd and bwd)
    assert all(r["status"] == "skipped" and "budget of 0 s" in r["reason"] for r in got)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--dry-run", "--variants", "fwd:nope"], "unknown variant(s) fwd:nope (known: "),
        (["--dry-run", "--extra", "fwd:x=(16,16,4,2,True,(('WS',True),))"], "WS needs ONE_LOOP"),
        (["--dry-run", "--controls", "nope"], "unknown control impl(s) nope"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    proc = run(*args, "--out", str(tmp_path))
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert (
        len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "kernel_lab.jsonl").exists()
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_without_a_gpu_it_says_so_and_exits_2(tmp_path):
    proc = run("--out", str(tmp_path))
    assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stderr


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
