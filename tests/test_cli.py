"""The CLI end to end on the CPU, as a user runs it."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from sweeps import ROOT, sweep
from torchlog import own_lines

from attnbench.cli import main
from attnbench.store.results import read_results
from attnbench.store.schema import columns_markdown


def test_list_shows_every_impl_with_reasons(capsys):
    assert main(["sweep", "--list"]) == 0
    out = capsys.readouterr().out
    for name in ("naive", "sdpa", "tiled", "xformers"):
        assert name in out


@pytest.mark.parametrize(
    "args,message",
    [
        (["--seq-len", "1,,2"], "--seq-len '1,,2': empty item"),
        (["--seq-len", "abc"], "'abc' is not an integer"),
        (["--batch", "0"], "0 must be a positive integer"),
        (["--heads", "6", "--kv-heads", "4"], "heads=6 must be a multiple of kv_heads=4"),
        (["--dtype", "fp64"], "unknown dtype 'fp64'"),
        (["--mode", "forward"], "unknown mode 'forward'"),
        (["--impls", "sdpa_flsh"], "unknown impl 'sdpa_flsh'; did you mean 'sdpa_flash'?"),
        (["--preset", "smok"], "unknown preset 'smok'; did you mean 'smoke'?"),
        (["--head-dim", "-1"], "-1 must be a positive integer"),
        (["--seq-len", "64", "--seq-len-kv", "0"], "--seq-len-kv '0': 0 must be a positive"),
        (["--causal", "maybe"], "'maybe' is not one of true, false, both"),
        (["--level", "block"], "unknown level 'block'"),
        (["--level", "op,layr"], "unknown level 'layr'; did you mean 'layer'?"),
        (
            ["--level", "layer", "--seq-len", "64", "--seq-len-kv", "32"],
            "level=layer is self-attention",
        ),
        (["--mask", "paddin"], "unknown mask 'paddin'; did you mean 'padding'?"),
        (["--mask", "window"], "mask window needs its spec: give --window or --mask window:SPEC"),
        (["--window", "16"], "--window needs --mask window"),
        (["--mask", "padding", "--window", "16"], "--window needs --mask window"),
        (["--sparsity", "stride=4"], "--sparsity needs --mask block_sparse or strided"),
        (["--mask", "prefix_lm", "--causal", "false"], "--mask prefix_lm is causal only"),
        (["--mask", "prefix_lm:50%", "--causal", "both"], "--mask prefix_lm is causal only"),
        (["--mask", "causal", "--causal", "false"], "--mask causal is causal only"),
        (["--impl", "naive"], "unrecognized arguments: --impl naive"),
        (["--mask", "window", "--window", "0"], "--window '0': 0 must be a positive integer"),
        (["--mask", "window", "--window", "x"], "'x' is not an integer"),
        (
            ["--mask", "window", "--window", "4", "--seq-len", "64", "--seq-len-kv", "16"],
            "would see no key",
        ),
        (["--rep-ms", "-5"], "must be a positive number"),
        (["--rep-ms", "1e12"], "--rep-ms '1e12': 1e12 is more than 60000"),
        (["--threads", "1000"], "--threads 1000: this machine has"),
        (["--run-id", ""], "--run-id is empty"),
        (["--timeout", "abc"], "'abc' is not a number"),
        (["--resume"], "--resume needs the --run-id"),
        (["--resume", "--run-id", "never-ran"], "holds no results.csv to continue"),
        (["--config", "/nonexistent/sweep.toml"], "no such file"),
        (["--profile", "tiled,,S64"], "--profile 'tiled,,S64': empty item"),
        (["--plugin", "/nonexistent/p.py"], "no such file"),
        (["--run-id", "a/b"], "no path separators"),
        (
            ["--device", "cuda:0"]
            if not __import__("torch").cuda.is_available()
            else ["--device", "tpu"],
            "--device",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, capsys, args, message):
    code = main(["sweep", "--preset", "smoke", "--results-dir", str(tmp_path / "res"), *args])
    assert code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "res").exists()


@pytest.mark.parametrize(
    "text,message",
    [
        ("seq_lens = [64]\n", "unknown field 'seq_lens'; did you mean 'seq_len'?"),
        ("seq_len = [64, 0]\n", "seq_len = '64,0': 0 must be a positive integer"),
        ("seq_len = ['abc']\n", "'abc' is not an integer"),
        ("dtype = 'fp64'\n", "unknown dtype 'fp64'"),
        ("causal = [true, 3]\n", "'3' is not one of true, false, both"),
        ("impls = ['naive', 'tild']\n", "unknown impl 'tild'; did you mean 'tiled'?"),
        ("heads = [6]\nkv_heads = [4]\n", "heads=6 must be a multiple of kv_heads=4"),
        ("mask = ['none', 'diagonal']\n", "unknown mask 'diagonal'; did you forget --plugin"),
        ("mask = 'window'\n", "mask window needs its spec: give --window or --mask window:SPEC"),
        ("mask = 'window'\nwindow = -3\n", "window = '-3': -3 must be a positive integer"),
        ("level = ['op', 3]\n", "level = 'op,3': unknown level '3'"),
        ("windows = [8]\n", "unknown field 'windows'; did you mean 'window'?"),
        ("seq_len = [64\n", "not valid TOML"),
        ("batch = {a = 1}\n", "batch: {'a': 1} is not a number"),
    ],
)
def test_bad_sweep_file_is_one_line_exit_2_nothing_written(tmp_path, capsys, text, message):
    config = tmp_path / "sweep.toml"
    config.write_text(text)
    code = main(["sweep", "--config", str(config), "--results-dir", str(tmp_path / "res")])
    assert code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "res").exists()


def test_sweep_file_sets_the_grid_and_flags_override_it(tmp_path):
    config = tmp_path / "sweep.toml"
    config.write_text(
        'preset = "smoke"\nimpls = ["naive"]\nseq_len = [32, 48]\n'
        'mode = "fwd"\ncausal = true\nrep_ms = 2\n'
    )
    code = main(
        [
            "sweep",
            "--config",
            str(config),
            "--seq-len",
            "40",
            "--results-dir",
            str(tmp_path / "res"),
            "--run-id",
            "cfg",
            "--no-progress",
        ]
    )
    assert code == 0
    df = read_results(tmp_path / "res" / "cfg")
    assert list(df["seq_q"]) == [40] and list(df["impl"]) == ["naive"]
    assert df["causal"].all() and (df["mode"] == "fwd").all()


def _unwritable(tmp_path):
    """A folder this process cannot write in (as root: /proc, which no one can)."""
    if os.geteuid() == 0:
        return Path("/proc/attnbench-no-such-folder/rep")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    return ro / "rep"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--run-id", "../escape"], "no path separators"),
        (["--resume", "--run-id", "never-ran"], "holds no results.csv to continue"),
        (["--reports-dir", _unwritable], "cannot write in"),
    ],
    ids=["run-id-escape", "resume-missing", "unwritable-reports-dir"],
)
def test_a_refused_command_creates_no_folder(tmp_path, capsys, args, message):
    """With the default results/ and reports/ (relative to the working folder, tmp_path)."""
    args = [a(tmp_path) if callable(a) else a for a in args]
    before = sorted(tmp_path.rglob("*"))
    code = main(["sweep", "--preset", "smoke", "--impls", "naive", *map(str, args)])
    assert code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert sorted(tmp_path.rglob("*")) == before  # no results/, no reports/, nothing


def test_reports_dir_that_is_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "rep").write_text("not a folder")
    code = main(
        [
            "sweep",
            "--preset",
            "smoke",
            "--results-dir",
            str(tmp_path / "res"),
            "--reports-dir",
            str(tmp_path / "rep"),
        ]
    )
    assert code == 2 and "--reports-dir" in capsys.readouterr().err
    assert not (tmp_path / "res").exists()


@pytest.mark.slow  # a sweep of every mask and level
def test_sweep_file_sets_masks_windows_and_levels(tmp_path):
    config = tmp_path / "sweep.toml"
    config.write_text(
        'preset = "smoke"\nimpls = ["sdpa"]\nseq_len = [32]\nmode = "fwd"\n'
        'causal = false\nmask = ["causal", "window"]\nwindow = [4, 8]\n'
        'level = ["op", "layer"]\nrep_ms = 2\n'
    )
    code = main(
        [
            "sweep",
            "--config",
            str(config),
            "--results-dir",
            str(tmp_path / "res"),
            "--run-id",
            "m",
            "--no-progress",
        ]
    )
    assert code == 0
    df = read_results(tmp_path / "res" / "m")
    got = sorted(zip(df["level"], df["mask"], df["causal"], df["window"].fillna(0)))
    assert got == sorted(
        (level, mask, causal, w)
        for level in ("op", "layer")
        for mask, causal, w in (("none", True, 0), ("window", False, 4), ("window", False, 8))
    )
    assert (df["status"] == "ok").all() and df["agrees"].all()
    assert df["backend"].notna().all()


def test_bad_input_exit_code_through_the_script(tmp_path):
    (tmp_path / "res").write_text("not a folder")
    proc = sweep("--preset", "smoke", "--results-dir", str(tmp_path / "res"))
    assert proc.returncode == 2 and "is a file" in proc.stderr
    assert len(own_lines(proc.stderr)) == 1


def test_docs_document_every_column_and_ci_runs_the_readme_test_command():
    assert columns_markdown() in (ROOT / "docs" / "columns.md").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "python -m pytest -q" in readme
    assert "python3 -m pytest -q" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--results-dir", "plain/x"], "plain is a file, so no folder can be made under it"),
        (["--reports-dir", "plain/rep"], "plain is a file, so no folder can be made under it"),
        (["--results-dir", "/proc/attnbench-x"], "cannot write in /proc"),
        (["--profile", "nomatchxyz"], "no (impl, case) pair contains all of ['nomatchxyz']"),
    ],
)
def test_unusable_output_folders_and_profile_filters_are_refused_up_front(
    tmp_path, capsys, args, needle
):
    (tmp_path / "plain").write_text("a file")
    code = main(["sweep", "--preset", "smoke", "--impls", "naive", "--seq-len", "32", *args])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(own_lines(err)) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain"]  # nothing written


@pytest.mark.slow  # two sweeps, one resumed
def test_a_resumed_run_summarises_every_row(tmp_path):
    base = [
        "--preset",
        "smoke",
        "--impls",
        "naive,tiled",
        "--seq-len",
        "32",
        "--mode",
        "fwd",
        "--results-dir",
        str(tmp_path),
        "--run-id",
        "r",
        "--no-progress",
        "--no-report",
    ]
    first = sweep(*base)
    assert first.returncode == 0, first.stderr[-2000:]
    again = sweep(*base, "--resume")
    assert again.returncode == 0 and "(4 rows already done)" in again.stdout, again.stderr
    summary = again.stdout.split("time_ms (median")[1]
    assert summary.count("S32 D32 float32") == 2 and "naive" in summary and "tiled" in summary


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a CUDA device is visible")
@pytest.mark.parametrize("args", [["race"], ["sweep", "--preset", "gpu"]])
def test_a_gpu_preset_on_a_cpu_is_refused_without_device_cpu(tmp_path, capsys, args):
    assert main([*args, "--results-dir", str(tmp_path / "res")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a GPU grid" in err and "add --device cpu" in err
    assert not (tmp_path / "res").exists()
    assert main([*args, "--dry-run"]) == 2  # a dry run is told how to see the GPU's grid
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "add --device cuda to see its grid" in err, err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a CUDA device is visible")
def test_a_gpu_preset_refused_on_a_cpu_counts_the_impls_its_sweep_file_names(tmp_path, capsys):
    config = tmp_path / "sweep.toml"
    config.write_text('preset = "gpu"\nimpls = ["sdpa", "naive", "tiled"]\n')
    assert main(["sweep", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert re.search(r"is a GPU grid \(\d+ cases x 3 impls of", err), err


@pytest.mark.slow  # a GPU preset swept on the CPU
def test_a_gpu_preset_runs_on_a_cpu_when_asked(tmp_path, capsys):
    tiny = ["--batch", "1", "--heads", "2", "--seq-len", "32", "--mode", "fwd", "--rep-ms", "2"]
    args = ["race", "--device", "cpu", *tiny, "--causal", "false", "--no-progress", "--no-report"]
    assert main([*args, "--results-dir", str(tmp_path / "res"), "--run-id", "r"]) == 0
    out = capsys.readouterr().out
    rows = read_results(tmp_path / "res" / "r")
    assert set(rows["impl"]) == {"sdpa_flash"} and (rows["status"] == "ok").all()
    # counted once as the run starts, not as rows: triton_flash and the CUDA backends
    assert re.search(r"^not run: .*\b\d+ not for device=cpu\b", out, flags=re.M), out


SEMAPHORE_PLUGIN = """
import multiprocessing

import torch.nn.functional as F
from attnbench import register

HELD = []


@register("holds_a_lock", backward=False)
def holds_a_lock(q, k, v, *, causal, scale):
    # a semaphore of multiprocessing's, as torch.compile's worker pools hold: a worker
    # killed at the end of the sweep leaks it, one that exits on its own releases it
    HELD.append(multiprocessing.get_context("spawn").Lock())
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
"""


@pytest.mark.slow  # a sweep in a subprocess
def test_the_worker_exits_cleanly_and_leaks_no_semaphore(tmp_path):
    plugin = tmp_path / "holds.py"
    plugin.write_text(SEMAPHORE_PLUGIN)
    args = [sys.executable, str(ROOT / "scripts" / "sweep.py"), "--device", "cpu"]
    args += ["--plugin", str(plugin), "--impls", "holds_a_lock", "--preset", "smoke"]
    args += ["--seq-len", "32", "--mode", "fwd", "--causal", "false", "--rep-ms", "2"]
    args += ["--no-progress", "--no-report", "--results-dir", str(tmp_path / "res")]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "leaked semaphore" not in proc.stderr, proc.stderr[-2000:]


def test_threads_reach_the_worker_process(tmp_path, capsys):
    plugin = tmp_path / "threads.py"
    plugin.write_text(
        "import torch\nfrom attnbench import Unsupported, register\n\n\n"
        "@register('says_threads')\ndef says_threads(q, k, v, *, causal, scale):\n"
        "    raise Unsupported(f'threads={torch.get_num_threads()}')\n"
    )
    args = ["sweep", "--device", "cpu", "--plugin", str(plugin), "--impls", "says_threads"]
    args += ["--preset", "smoke", "--seq-len", "32", "--mode", "fwd", "--causal", "false"]
    threads = 1 if torch.get_num_threads() > 1 else 2  # not what the worker would have anyway
    args += ["--threads", str(threads), "--no-progress", "--no-report", "--run-id", "t"]
    assert main([*args, "--results-dir", str(tmp_path / "res")]) == 0
    capsys.readouterr()
    assert read_results(tmp_path / "res" / "t")["reason"].tolist() == [f"threads={threads}"]


def test_help_names_every_command_and_version_says_which_attnbench(capsys):
    from attnbench import checkout
    from attnbench.cli import COMMANDS

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name, what in COMMANDS.items():
        assert f"  {name:<9} {what}" in out
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith(f"attnbench {checkout.version()}")
    assert checkout.version() != "unknown"


def test_row_lines_shorten_a_long_reason_between_words():
    from attnbench.run.progress import _outcome

    reason = " ".join(f"word{i:03d}" for i in range(60))  # 479 characters, cut anywhere
    line = _outcome({"status": "error", "reason": reason})
    kept = line.removeprefix("error (").removesuffix(")")
    assert kept.endswith(" ...") and len(kept) < len(reason)
    assert all(word in reason.split() for word in kept.removesuffix(" ...").split())


def test_a_sweep_keeps_tritons_cache_where_triton_keeps_it(monkeypatch):
    """Inductor points an unset TRITON_CACHE_DIR into its own (a sweep's temporary) cache; the
    sweep sets Triton's own default first, so triton_flash's compiled kernels outlive it."""
    triton = pytest.importorskip("triton")
    from attnbench.run.executing.executors import triton_cache_dir

    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    if hasattr(triton, "knobs"):
        assert triton_cache_dir() == triton.knobs.cache.dir
    monkeypatch.setenv("TRITON_HOME", "/somewhere")
    assert triton_cache_dir() == "/somewhere/.triton/cache"


def _exit_code(argv: list[str]) -> int:
    """main's exit code, also where argparse exits (--help) instead of returning."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def _documented_usage() -> dict[str, str]:
    """docs/cli.md's usage block: command -> its line ('attnbench report RUN_DIR [...]')."""
    block = re.search(r"```\n(attnbench .*?)```", (ROOT / "docs" / "cli.md").read_text(), re.S)
    lines = [line.split("#")[0] for line in block.group(1).splitlines()]
    return {line.split()[1]: line for line in lines if line.split()[1].isalpha()}


def _help_flags(text: str) -> set[str]:
    """The long options a --help output lists (its invocation column, not its prose)."""
    heads = re.findall(r"^  (-\S.*?)(?:  |$)", text, flags=re.M)
    return {f for head in heads for f in re.findall(r"--[a-z][a-z0-9-]*", head)}


def _sweep_flags() -> set[str]:
    from attnbench.options import OPTIONS, flag

    toggles = [n for n, o in OPTIONS.items() if o.style == "toggle"]
    return {flag(n) for n in OPTIONS} | {flag(n).replace("--", "--no-", 1) for n in toggles}


@pytest.mark.parametrize(
    "command", ["sweep", "race", "list", "report", "compare", "fidelity", "repro"]
)
def test_help_of_every_command_exits_0_and_lists_its_documented_options(command, capsys):
    assert _exit_code([command, "--help"]) == 0
    out = capsys.readouterr().out
    usage = _documented_usage()
    documented = set(re.findall(r"--[a-z][a-z0-9-]*", usage[command]))
    if command in ("sweep", "race"):  # [options]: every option of options.py, defined once
        documented |= _sweep_flags()
    assert documented <= _help_flags(out), documented - _help_flags(out)
    # the positional arguments outside [...]: RUN_DIR ROW is 'run_dir' and 'row' in --help
    positional = re.findall(r"\b[A-Z_]{2,}\b", re.sub(r"\[.*?\]", "", usage[command]))
    assert documented or positional
    assert all(re.search(rf"^  {p.lower()}\b", out, flags=re.M) for p in positional), positional
    assert out.startswith(f"usage: attnbench {command}")


def test_every_option_of_every_command_is_documented_in_cli_md(capsys):
    from attnbench.cli import COMMANDS

    docs = set(re.findall(r"--[a-z][a-z0-9-]*", (ROOT / "docs" / "cli.md").read_text()))
    assert set(_documented_usage()) == set(COMMANDS)
    assert _sweep_flags() <= docs, sorted(_sweep_flags() - docs)
    for command in COMMANDS:
        assert _exit_code([command, "--help"]) == 0
        missing = _help_flags(capsys.readouterr().out) - docs
        assert not missing, f"attnbench {command}: not in docs/cli.md: {sorted(missing)}"


@pytest.mark.parametrize(
    "argv",
    [
        ["sweep", "--impl", "naive", "--dry-run"],
        ["race", "--seq", "64", "--dry-run"],
        ["list", "--dev", "cpu"],
        ["compare", "a", "b", "--fail", "5"],
        ["report", "r", "--base", "naive"],
    ],
)
def test_a_prefix_of_a_long_option_is_not_taken_for_it(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unrecognized arguments" in err[0], err


def test_a_causal_only_mask_beside_another_takes_the_causal_cases_only():
    from attnbench.spec import Spec

    spec = Spec.from_preset("smoke", "cpu", mask=["none", "prefix_lm"], causal=[False])
    got = {(c.mask, c.causal) for c in spec.cases()}
    assert got == {("none", False), ("prefix_lm", True)}


def test_a_run_folds_the_impls_it_left_out_into_counts_and_a_dry_run_names_each(capsys):
    from types import SimpleNamespace

    from attnbench.run.planning.selection import COMPILED_LEFT_OUT, left_out_summary

    installed, missing = (
        SimpleNamespace(unavailable=None),
        SimpleNamespace(unavailable="needs foo, which is not installed (install: pip install foo)"),
    )
    left_out = {
        "a": "device=cpu (supported: cuda)",
        "b": "device=cpu (supported: cuda); dtype=float32 (supported: bfloat16)",
        "c": missing.unavailable,
        "d": COMPILED_LEFT_OUT,
        "e": "not registered here",
    }
    impls = {"a": installed, "b": installed, "c": missing, "d": installed}
    lines = left_out_summary(left_out, impls).splitlines()
    assert lines[0] == (
        "not run: 2 not for device=cpu, 1 not installed, 1 use torch.compile, 1 not registered here"
    )
    assert len(lines) == 2 and "--dry-run names each" in lines[1]
    assert main(["sweep", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "not run, as no --impls named them" in out
    assert "  flex: uses torch.compile" in out  # a dry run names each left-out impl and why


def test_a_grid_whose_inputs_cannot_fit_the_device_is_one_line_exit_2_nothing_written(
    tmp_path, capsys
):
    from attnbench.measure.memory import device_memory_bytes

    limit = device_memory_bytes("cpu")
    code = main(["sweep", "--device", "cpu", "--impls", "naive", "--batch", "100000",
                 "--heads", "32", "--seq-len", "8192", "--mode", "fwd", "--causal", "true",
                 "--results-dir", str(tmp_path / "res")])  # fmt: skip
    assert code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    need = 3 * 100000 * 32 * 8192 * 64 * 4 / 2**30  # q, k, v in float32 at D64
    assert (
        f"the inputs of case B100000 H32 S8192 D64 float32 causal fwd take {need:,.1f} GiB, more "
        f"than the {limit / 2**30:,.1f} GiB of cpu memory; use a smaller --batch, --heads or "
        f"--seq-len"
    ) in line
    assert not (tmp_path / "res").exists()


@pytest.mark.parametrize(
    "argv,hint",
    [
        (["sweep", "--seq-lenn", "128"], "--seq-lenn 128; did you mean '--seq-len'?"),
        (["compare", "a", "b", "--fail", "5"], "--fail 5; did you mean '--fail-above'?"),
        (["sweep", "--results-dirr=x"], "--results-dirr=x; did you mean '--results-dir'?"),
    ],
)
def test_a_mistyped_flag_gets_the_close_one(argv, hint, capsys):
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"unrecognized arguments: {hint} (see attnbench {argv[0]} --help)" in line


def test_the_folder_flags_have_help(capsys):
    assert _exit_code(["sweep", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--results-dir RESULTS_DIR where the run folder <run-id>/" in text
    assert "--reports-dir REPORTS_DIR where the report <run-id>/report.md" in text


def test_list_says_what_its_number_ranges_mean_and_only_the_dtypes_an_impl_takes(capsys):
    assert main(["list", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line[:1].isalpha()}
    assert rows["triton_flash"][3] == "fp16,bf16" and rows["triton_flash"][4] == "16-256/8"
    assert rows["triton_flash_fa2"][4] == "16-256/x2"
    legend = " ".join(out.split())
    assert "head_dims: a-b/s from a to b in steps of s, a-b/x2 from a to b doubling" in legend


def test_list_names_module_impls_and_the_gqa_head_order(registered, capsys):
    from attnbench import registry

    registry.register("xt_attn", head_order="interleaved")(lambda q, k, v, *, causal, scale: q)
    assert main(["list", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line[:1].isalpha()}
    head = rows["impl"]
    took, gqa = head.index("in"), head.index("c/x/g/b")
    assert rows["hf_llama_eager"][took] == "md" and rows["naive"][took] == "op"
    assert rows["flash_attn2_paged"][took] == "pg"
    assert rows["xt_attn"][gqa].split("/")[2] == "i" and rows["naive"][gqa].split("/")[2] == "y"
    legend = " ".join(out.split())
    assert "md (a module impl: x, at --level layer only)" in legend
    assert "i: h % kv_heads, head_order interleaved" in legend
