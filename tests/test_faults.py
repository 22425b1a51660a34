"""Fault injection: misbehaving plugins never stop a sweep, never lose a row, and each fault is
recorded with the right status and a useful reason."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from sweeps import sweep as run_sweep
from torchlog import own_lines

from attnbench.cli import main
from attnbench.store.results import read_results

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = Path(__file__).resolve().parent / "plugins"
GRID = [
    "--batch",
    "1",
    "--heads",
    "2",
    "--head-dim",
    "16",
    "--seq-len",
    "64,128,256",
    "--causal",
    "false",
    "--mode",
    "fwd",
    "--dtype",
    "fp32",
    "--rep-ms",
    "2",
]


def sweep(*args, timeout=600, cwd=None, env=None):
    """scripts/sweep.py on the CPU without progress or report (these test fault handling)."""
    env = dict(os.environ) if env is None else env
    return run_sweep("--no-progress", "--no-report", *args, timeout=timeout, cwd=cwd, env=env)


FAULTY = ["naive", "f_raise", "f_nan", "f_shape", "f_oom", "f_abort", "f_long", "broken_import"]


@pytest.fixture(scope="module")
def faulty_run(tmp_path_factory):
    """No --timeout: a healthy row may take any time on a busy machine (the hang has a run of
    its own). The import that fails is an installed package's entry point (a folder on
    PYTHONPATH with its dist-info), where a failure is a row; a --plugin that fails to import
    is bad input."""
    res = tmp_path_factory.mktemp("faults")
    site = res / "site"
    dist = site / "broken_plugin-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[attnbench.impls]\nbroken_import = broken_import\n")
    shutil.copy(PLUGINS / "broken_import.py", site)
    proc = sweep(
        *GRID,
        "--impls",
        ",".join(FAULTY),
        "--plugin",
        str(PLUGINS / "faulty.py"),
        "--results-dir",
        str(res),
        "--reports-dir",
        str(res / "reports"),
        "--run-id",
        "faults",
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
        },
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = read_results(res / "faults")
    rows = _Rows({name: g.set_index("seq_q") for name, g in df.groupby("impl")})
    rows.run_dir = res / "faults"
    return rows


class _Rows(dict):
    """Impl -> its rows by seq_q, and the run folder."""

    run_dir: Path


def test_every_pair_has_exactly_one_row(faulty_run):
    assert sorted(faulty_run) == sorted(FAULTY)
    for rows in faulty_run.values():
        assert sorted(rows.index) == [64, 128, 256]


def test_the_healthy_impl_is_complete_and_correct(faulty_run):
    naive = faulty_run["naive"]
    assert (naive["status"] == "ok").all() and naive["agrees"].all()
    assert naive["time_ms"].notna().all() and naive["peak_mem_mib"].notna().all()


def test_raise_is_an_error_with_the_message(faulty_run):
    rows = faulty_run["f_raise"]
    assert (rows["status"] == "error").all()
    assert rows["reason"].str.contains("ValueError: planted failure in f_raise").all()
    assert rows["time_ms"].isna().all()


def test_nan_output_never_agrees(faulty_run):
    rows = faulty_run["f_nan"]
    assert (rows["status"] == "ok").all()
    assert (~rows["agrees"]).all()
    assert rows["reason"].str.contains("out non-finite").all()
    assert rows["rel_err"].isna().all() and rows["max_abs_err"].isna().all()


def test_wrong_shape_is_an_error_naming_both_shapes(faulty_run):
    rows = faulty_run["f_shape"]
    assert (rows["status"] == "error").all()
    assert rows.loc[64, "reason"] == (
        "bad output: out has shape (1, 2, 63, 16) in layout bhsd, expected (1, 2, 64, 16)"
    )


def test_oom_is_recorded_with_size_and_larger_sizes_are_skipped(faulty_run):
    rows = faulty_run["f_oom"]
    assert rows.loc[64, "status"] == "ok"
    assert rows.loc[128, "status"] == "oom"
    assert "seq_q=128" in rows.loc[128, "reason"] and "64.00 GiB" in rows.loc[128, "reason"]
    assert rows.loc[256, "status"] == "oom"
    assert rows.loc[256, "reason"].startswith(
        "skipped: f_oom ran out of memory at the smaller seq_q=128"
    )
    assert rows.loc[[128, 256], "time_ms"].isna().all()


def test_abort_is_a_crash_with_the_workers_stderr_and_the_next_length_runs(faulty_run):
    rows = faulty_run["f_abort"]
    assert rows.loc[128, "status"] == "crash" and pd.isna(rows.loc[128, "time_ms"])
    assert "SIGABRT" in rows.loc[128, "reason"]
    assert "planted abort in f_abort" in rows.loc[128, "reason"]
    # a crash is not an out-of-memory: the larger length runs, in a fresh worker process
    assert (rows.loc[[64, 256], "status"] == "ok").all() and rows.loc[[64, 256], "agrees"].all()


def test_a_long_compile_error_keeps_the_compilers_error_and_the_run_keeps_it_whole(faulty_run):
    rows = faulty_run["f_long"]
    assert (rows["status"] == "error").all()
    reason = rows.loc[64, "reason"]
    assert reason.startswith("RuntimeError: C++ compile error Command: g++ -I/very/long")
    assert (
        "[...] /tmp/k.cpp:85:55: error: planted_x (cut short: the full error is in errors.log"
        in reason
    )
    assert "warning" not in reason and len(reason) < 700
    log = (faulty_run.run_dir / "errors.log").read_text()
    assert log.count("== f_long: B1 H2 S") == 3
    assert "-I/very/long/include/path/number/30 " in log and "error: planted_x" in log
    assert "Traceback" in log and "tests/plugins/faulty.py" in log
    assert "f_raise" not in log  # a short error is whole in its reason


def test_a_long_error_without_a_compilers_line_keeps_its_start_and_its_end():
    from attnbench.run.measuring.failed import error_reason

    with pytest.raises(ValueError) as caught:
        raise ValueError("start " + "x " * 400 + "the end")
    reason, full = error_reason(caught.value)
    assert reason.startswith("ValueError: start x") and " [...] " in reason
    assert reason.endswith("the end (cut short: the full error is in errors.log in the run folder)")
    assert "the end" in full and "Traceback" in full


def test_an_error_from_another_process_starts_with_that_processs_cause():
    """A compile worker's failure reaches the row as one exception whose message holds the
    worker's traceback (torch.compile's InductorError: SubprocException): the reason starts
    with the traceback's last exception line, which a terminal line shows."""
    from attnbench.run.measuring.failed import error_reason

    class InductorError(RuntimeError):
        pass

    worker = "\n".join(
        [
            "SubprocException: An exception occurred in a subprocess:",
            "Name=triton_tem_fused_flex_attention_0",
            "Traceback (most recent call last):",
            *[f'  File "/site/torch/_inductor/f{i}.py", line {i}, in g{i}' for i in range(30)],
            "triton.compiler.errors.CompilationError: at 194:23:",
            "    block_n_start, block_n_end if block_n_end <= last else last,",
            "AssertionError('Ternary expression has inconsistent types int64 and int32')",
            "Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace",
        ]
    )
    with pytest.raises(InductorError) as caught:
        raise InductorError(worker)
    reason, full = error_reason(caught.value)
    assert reason.startswith("AssertionError('Ternary expression has inconsistent types int64")
    assert "reported as InductorError: SubprocException" in reason and "errors.log" in reason
    assert "File " not in reason and len(reason) < 500
    assert "f29.py" in full


def test_hang_is_a_timeout_and_the_next_row_gets_a_fresh_worker(tmp_path, registered):
    """Only the hanging impl runs, so no healthy row can hit the short timeout."""
    code = main(
        [
            "sweep",
            "--no-progress",
            *GRID[:7],
            "64,128",
            *GRID[8:],
            "--impls",
            "f_hang",
            "--plugin",
            str(PLUGINS / "faulty.py"),
            "--timeout",
            "2",
            "--results-dir",
            str(tmp_path),
            "--run-id",
            "hang",
            "--no-report",
        ]
    )
    assert code == 0
    rows = read_results(tmp_path / "hang")
    assert list(rows["status"]) == ["timeout", "timeout"]
    assert rows["reason"].str.contains("no result after 2 s").all()


def test_import_failure_of_an_installed_plugin_is_unsupported_naming_it_and_error(faulty_run):
    rows = faulty_run["broken_import"]
    assert (rows["status"] == "unsupported").all()
    assert rows["reason"].str.contains("entry point broken_import", regex=False).all()
    assert rows["reason"].str.contains("failed to import").all()
    assert rows["reason"].str.contains("this_module_does_not_exist_anywhere").all()


@pytest.mark.parametrize(
    "text, needle",
    [
        ("def broken(:\n", "SyntaxError"),
        ("import this_module_does_not_exist_anywhere\n", "ModuleNotFoundError"),
        ("import sys\nprint('bye')\nsys.exit(3)\n", "sys.exit(3) at import"),
    ],
)
def test_a_plugin_file_that_fails_to_import_is_one_line_exit_2(
    tmp_path, capsys, registered, text, needle
):
    plugin = tmp_path / "bad_plugin.py"
    plugin.write_text(text)
    args = ["--plugin", str(plugin), "--results-dir", str(tmp_path / "res"), "--device", "cpu"]
    assert main(["sweep", *GRID, *args]) == 2
    lines = own_lines(capsys.readouterr().err)
    assert len(lines) == 1 and str(plugin) in lines[0] and needle in lines[0], lines
    assert not (tmp_path / "res").exists()


KILL_GRID = [
    "--batch",
    "1",
    "--heads",
    "2",
    "--head-dim",
    "16",
    "--seq-len",
    "32,48,64,80",
    "--causal",
    "both",
    "--mode",
    "fwd,fwd_bwd",
    "--rep-ms",
    "20",
    "--impls",
    "naive,slow,xformers",
    "--plugin",
    str(PLUGINS / "slow.py"),
    "--no-isolate",
]


def _keys(df):
    return df[["impl", "mode", "seq_q", "causal", "status"]].astype(str).apply(tuple, axis=1)


@pytest.mark.slow
def test_sigkill_then_resume_gives_exactly_the_rows_of_an_uninterrupted_run(tmp_path):
    whole = sweep(*KILL_GRID, "--results-dir", str(tmp_path), "--run-id", "whole")
    assert whole.returncode == 0, whole.stderr[-2000:]
    expected = read_results(tmp_path / "whole")

    args = [
        sys.executable,
        str(ROOT / "scripts" / "sweep.py"),
        "--no-progress",
        "--no-report",
        *KILL_GRID,
        "--results-dir",
        str(tmp_path),
        "--run-id",
        "killed",
    ]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    csv_path = tmp_path / "killed" / "results.csv"
    deadline = time.time() + 300
    while time.time() < deadline:
        if csv_path.exists() and len(csv_path.read_text().splitlines()) > 10:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partial = len(read_results(tmp_path / "killed"))
    assert 0 < partial < len(expected), "the kill must land part way through"
    with open(csv_path, "a") as f:  # as if the kill had cut a write in half
        f.write("killed,naive,fwd,1,2,2,32,3")

    resumed = sweep(*KILL_GRID, "--results-dir", str(tmp_path), "--run-id", "killed", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    got = read_results(tmp_path / "killed")
    assert len(got) == len(expected)
    assert sorted(_keys(got)) == sorted(_keys(expected))
    assert not got.duplicated(["impl", "mode", "seq_q", "causal"]).any()
    assert got[got["status"] == "ok"]["time_ms"].notna().all()
    samples = pd.read_csv(tmp_path / "killed" / "samples.csv")
    per_row = samples.groupby(["impl", "mode", "seq_q", "causal"]).size()
    for _, row in got[got["status"] == "ok"].iterrows():
        assert per_row[(row["impl"], row["mode"], row["seq_q"], row["causal"])] == row["samples"]


@pytest.mark.slow  # two sweeps
def test_resume_with_a_different_grid_is_refused(tmp_path):
    first = sweep(
        "--preset",
        "smoke",
        "--impls",
        "naive",
        "--seq-len",
        "32",
        "--mode",
        "fwd",
        "--results-dir",
        str(tmp_path),
        "--run-id",
        "r",
    )
    assert first.returncode == 0, first.stderr[-2000:]
    before = (tmp_path / "r" / "results.csv").read_bytes()
    again = sweep(
        "--preset",
        "smoke",
        "--impls",
        "naive",
        "--seq-len",
        "32,64",
        "--mode",
        "fwd",
        "--results-dir",
        str(tmp_path),
        "--run-id",
        "r",
        "--resume",
    )
    assert again.returncode == 2
    assert "--resume: cases item 2 was" in again.stderr and len(own_lines(again.stderr)) == 1
    assert (tmp_path / "r" / "results.csv").read_bytes() == before


@pytest.mark.slow  # a sweep with an aborting plugin (test_rounds.py plants one by default)
def test_an_aborting_plugin_costs_one_row_with_default_flags(tmp_path):
    """No --isolate, no --timeout: the default still turns an abort into a crash row."""
    proc = sweep(
        *GRID,
        "--impls",
        "f_abort,naive",
        "--plugin",
        str(PLUGINS / "faulty.py"),
        "--results-dir",
        str(tmp_path),
        "--run-id",
        "abort",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = read_results(tmp_path / "abort")
    assert len(df) == 6
    crashed = df[df["status"] == "crash"]
    assert list(crashed["impl"]) == ["f_abort"] and list(crashed["seq_q"]) == [128]
    assert (df[df["impl"] == "naive"]["status"] == "ok").all()  # later impls still ran
    assert "SIGABRT" in crashed["reason"].iloc[0]


def test_an_impl_that_exits_its_process_without_isolation_is_a_crash_row(tmp_path):
    """--no-isolate: os._exit(0) once ended the sweep with exit 0, no rows and no word;
    sys.exit(3) as silently. Each is now its row's crash, and the sweep goes on."""
    proc = sweep(
        *GRID,
        *("--impls", "naive,x_os_exit,x_sys_exit", "--plugin", str(PLUGINS / "exits.py")),
        *("--no-isolate", "--results-dir", str(tmp_path), "--run-id", "x"),
    )
    assert proc.returncode == 0, proc.stderr
    rows = read_results(tmp_path / "x")
    assert len(rows) == 9, rows
    crashed = rows[rows["status"] == "crash"].set_index("impl")
    assert sorted(crashed.index) == ["x_os_exit", "x_sys_exit"]
    assert (crashed["seq_q"] == 128).all()
    assert "called os._exit(0)" in crashed.loc["x_os_exit", "reason"]
    assert "called sys.exit(3)" in crashed.loc["x_sys_exit", "reason"]
    assert (rows.loc[rows["status"] != "crash", "status"] == "ok").all()
