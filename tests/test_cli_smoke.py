"""The smoke preset end to end on the CPU, as a user runs it: one run (with a user's plugin
from outside the repository) read by every test here."""

import csv
import importlib.util
import json
import re
import textwrap

import pytest
from sweeps import sweep

from attnbench.store.results import read_results
from attnbench.store.schema import COLUMNS, METRICS

XFORMERS = importlib.util.find_spec("xformers") is not None
REQUIRED = (
    "run_id, impl, mode, batch, heads, kv_heads, seq_q, seq_kv, head_dim, dtype, causal, "
    "device, status, reason, time_ms, time_ms_p20, time_ms_p80, samples, rounds, speedup, "
    "speedup_lo, speedup_hi, speed_compute, speed_memory, tflops, "
    "peak_mem_mib, max_abs_err, rel_err, agrees"
).split(", ")

USER_PLUGIN = """
import torch.nn.functional as F
from attnbench.registry import register

@register("my_sdpa", devices=("cpu", "cuda"), backward=False)
def my_sdpa(q, k, v, *, causal, scale):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
"""


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("smoke")
    plugin = tmp / "outside" / "my_plugin.py"
    plugin.parent.mkdir()
    plugin.write_text(textwrap.dedent(USER_PLUGIN))
    # the smoke preset leaves the torch.compile impls out (tests/test_compiled.py covers them)
    proc = sweep(
        "--preset",
        "smoke",
        "--run-id",
        "smoke1",
        "--results-dir",
        str(tmp / "res"),
        "--plugin",
        str(plugin),
        "--no-progress",
        cwd=tmp,
    )
    assert proc.returncode == 0, proc.stderr
    return proc, tmp / "res" / "smoke1"


def test_smoke_writes_csv_with_the_exact_schema(smoke_run):
    _, run_dir = smoke_run
    with open(run_dir / "results.csv", newline="") as f:
        header = next(csv.reader(f))
    assert header == list(COLUMNS)
    assert header[: len(REQUIRED)] == REQUIRED


def test_smoke_rows_cover_every_case_and_impl(smoke_run):
    proc, run_dir = smoke_run
    df = read_results(run_dir)
    impls = set(df["impl"])
    assert {"naive", "sdpa", "tiled", "my_sdpa"} <= impls
    # a CPU preset runs what a CPU can run; the rest are named once, with why, not as rows
    gpu_only = {"xformers", "sdpa_efficient", "sdpa_cudnn", "triton_flash", "triton_flash_fa2"}
    assert not gpu_only & impls
    not_run = json.loads((run_dir / "env.json").read_text())["not_run"]
    # xformers' reason: the device; where it was built for another torch, that (its build
    # record); where it is not installed, that it is missing
    whys = ("device=cpu (supported: cuda)", "xformers refuses every operator")
    whys = whys if XFORMERS else ("needs xformers, which is not installed",)
    assert gpu_only <= set(not_run) and any(w in not_run["xformers"] for w in whys)
    # named once: folded into counts as the run starts (--dry-run names each)
    folded = [line for line in proc.stdout.splitlines() if line.startswith("not run: ")]
    assert len(folded) == 1
    assert sum(int(n) for n in re.findall(r"(?:: |, )(\d+) ", folded[0])) == len(not_run)
    assert "xformers" not in proc.stdout.split("time_ms (median")[0]
    assert "WARNING[XFORMERS]" not in proc.stderr  # its log block is in its reason instead
    assert (df["status"] == "ok").mean() > 0.8  # no filler
    assert len(df) == 8 * len(impls)  # smoke: 2 lengths x 2 causal x 2 modes
    assert not df.duplicated(["impl", "mode", "seq_q", "causal"]).any()
    assert (df["run_id"] == "smoke1").all()


def test_rows_that_did_not_run_have_blank_metrics_never_zero(smoke_run):
    _, run_dir = smoke_run
    df = read_results(run_dir)
    bwd = df[(df["impl"] == "my_sdpa") & (df["mode"] == "fwd_bwd")]
    assert len(bwd) and (bwd["status"] == "unsupported").all()
    for col in METRICS:
        assert bwd[col].isna().all(), col
    with open(run_dir / "results.csv", newline="") as f:
        for row in csv.DictReader(f):
            if row["status"] != "ok":
                assert all(row[c] == "" for c in METRICS)


def test_user_plugin_from_outside_the_repo_shows_up(smoke_run):
    _, run_dir = smoke_run
    df = read_results(run_dir)
    mine = df[df["impl"] == "my_sdpa"]
    assert set(mine[mine["mode"] == "fwd"]["status"]) == {"ok"}
    assert mine[mine["mode"] == "fwd"]["agrees"].all()
    bwd = mine[mine["mode"] == "fwd_bwd"]
    assert (bwd["status"] == "unsupported").all()
    assert bwd["reason"].str.contains("no backward").all()


def test_ok_rows_have_consistent_metrics(smoke_run):
    _, run_dir = smoke_run
    df = read_results(run_dir)
    ok = df[df["status"] == "ok"]
    assert ok["agrees"].all(), ok[~ok["agrees"]][["impl", "reason"]]
    assert (ok["rel_err"] <= ok["err_bound"]).all()  # agrees is readable from the row
    assert (ok["max_abs_err"] <= ok["max_abs_bound"]).all()
    assert ok["page_faults"].notna().all() and (ok["page_faults"] >= 0).all()  # CPU rows
    assert (ok["time_ms_p20"] <= ok["time_ms"]).all() and (ok["time_ms"] <= ok["time_ms_p80"]).all()
    tflops = ok["flops"] / (ok["time_ms"] * 1e-3) / 1e12
    assert ((ok["tflops"] - tflops).abs() <= 1e-9 * tflops).all()
    samples = read_results_samples(run_dir)
    counts = samples.groupby(["impl", "mode", "seq_q", "causal"]).size()
    for _, row in ok.iterrows():
        assert counts[(row["impl"], row["mode"], row["seq_q"], row["causal"])] == row["samples"]


def read_results_samples(run_dir):
    import pandas as pd

    return pd.read_csv(run_dir / "samples.csv")


def test_env_json_says_where_it_ran(smoke_run):
    _, run_dir = smoke_run
    env = json.loads((run_dir / "env.json").read_text())
    for key in (
        "cpu_name",
        "gpu_name",
        "torch",
        "cuda",
        "triton",
        "xformers",
        "git_sha",
        "command",
        "time_utc",
        "seed",
        "device",
    ):
        assert key in env
    assert env["device"] == "cpu" and env["gpu_name"] is None
    assert "--preset smoke" in env["command"]
    assert env["malloc"]["how"]  # the allocator setting the rows were timed under
    if env["malloc"]["enabled"]:
        assert "glibc.malloc.trim_threshold" in env["malloc"]["GLIBC_TUNABLES"]


def test_summary_table_is_printed(smoke_run):
    proc, _ = smoke_run
    assert "time_ms (median" in proc.stdout
    assert "unsupported" in proc.stdout


def test_sweep_writes_its_report(smoke_run):
    proc, run_dir = smoke_run
    report = run_dir.parent.parent / "reports" / "smoke1" / "report.md"
    assert report.exists(), proc.stdout[-500:]
    text = report.read_text()
    assert "smoke1" in text and "time_vs_seq.png" in text
