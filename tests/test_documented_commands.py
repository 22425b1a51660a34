"""Every command that README.md and docs/ show in a shell block is run as written, in document
order, in a fresh folder, with its lengths shrunk by one rule (``shrink``; docs/testing.md).
A command fails on a traceback, an exit code its page does not document, a run that measured
nothing, or a report not written. A command that cannot run here is in NOT_RUN with its reason,
and a sweep of a GPU preset is planned (--dry-run) on a machine without CUDA; a line that is
neither fails the test, so a new command in the docs is run from the day it is written."""

from __future__ import annotations

import re
import runpy
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import torch

from attnbench import plugins
from attnbench.cli import COMMANDS, main
from attnbench.options import load_config
from attnbench.spec import GPU_PRESETS

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "impls" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = ("bash", "sh", "console", "shell", "")  # fenced blocks in these languages hold commands
# a fenced block whose first line is '# NAME.ext' (or '# NAME.ext -> ...') is a file the
# commands use (sweep.toml, my_attn.py): it is written before they run
FILE_NAME = re.compile(r"# ([\w.-]+\.(?:py|toml))\b")

NOT_RUN = (  # (pattern, why): each documented line that is not run here
    (r"^pip install", "installs packages; .ci/run installs the checkout and its test extra"),
    (
        r"^(python -m )?pytest ",
        "runs the test suite or benchmarks (tests/test_docs.py runs "
        "docs/benchmarks.md's pytest-benchmark commands, marked slow)",
    ),
    (r"^pytest-benchmark ", "lists saved benchmark runs (tests/test_docs.py, slow)"),
    (r"^(ray |export RAY_)", "starts or configures a Ray cluster (tests/test_ray.py starts one)"),
    (r"--device cuda", "needs a CUDA GPU"),
    (
        r"^attnbench race$",
        "the race preset is a GPU grid: on a CPU it refuses with exit 2 (tests/test_cli.py)",
    ),
    (
        r"^bash scripts/gpu_check\.sh",
        "the stages of a GPU lease (tests/test_gpu_check.py runs each stage's dry run)",
    ),
    (r"^(for |done$)", "shell loop syntax: the commands inside it run once each"),
    (r"^\$ ", "a transcript of a run made elsewhere (tests/test_repro.py checks its output)"),
    (r"\[|\bRUN_DIR\b|\bRUN_[AB]\b|\s\|\s", "a synopsis of the options, not a command"),
    (r"^python benchmarks/", "a benchmark (benchmarks/test_*.py run it in the suite)"),
)
LENGTH_FLAGS = ("--seq-len", "--seq-len-kv", "--window")
SHRINK = 16  # lengths (and document and block sizes) divided by this
MIN_LEN = 16
DEFAULT_SEQ = "32,64"  # a sweep that names no length
EXIT_CODES = {"compare": (0, 1, 4)}  # compare --fail-above: its gate (1) and too few judged (4)


@dataclass(frozen=True)
class Documented:
    page: str
    line: str

    @property
    def argv(self) -> list[str]:
        args = shlex.split(self.line.replace("$i", "1"))
        if args[:2] == ["python", "scripts/sweep.py"]:
            return ["sweep", *args[2:]]
        if args[:1] == ["python"] and args[1].startswith("scripts/"):
            return [Path(args[1]).stem, *args[2:]]
        return args[1:] if args[:1] == ["attnbench"] else args

    def why_not_run(self) -> str | None:
        return next((why for pat, why in NOT_RUN if re.search(pat, self.line)), None)


def blocks(page: Path) -> list[tuple[str, str]]:
    """(language, text) of each fenced block of a page."""
    out, lang, lines = [], None, []
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            if lang is None:
                lang, lines = line[3:].strip(), []
            else:
                out.append((lang, "\n".join(lines) + "\n"))
                lang = None
        elif lang is not None:
            lines.append(line)
    return out


def documented() -> list[Documented]:
    """Every line of every shell block: comments dropped, continued lines joined, '&&' split."""
    out = []
    for page in PAGES:
        for block in [text for lang, text in blocks(page) if lang in SHELL]:
            lines = block.replace("\\\n", " ").splitlines()
            if any(line.startswith("$ ") for line in lines):  # a transcript: the rest is output
                lines = [line for line in lines if line.startswith("$ ")]
            for line in lines:
                line = re.split(r"\s#\s|^#", line)[0].strip()
                out += [Documented(page.name, part.strip()) for part in line.split("&&") if part]
    return [d for d in out if d.line]


def shrink(argv: list[str], compiled: bool) -> list[str]:
    """The one rule: every length (--seq-len, --seq-len-kv, --window, the sizes in --docs
    and block= of --sparsity) divided by 16, at least 16 (4 for documents and blocks); a
    sweep naming no length gets --seq-len 32,64; --rep-ms 1 and --no-progress. Without
    ``compiled`` (the default run), a list of lengths keeps its first two, and the impls that
    compile a graph per shape (torch.compile: seconds to minutes each on a CPU) are left out
    of --impls; the slow run keeps both."""
    out, i = [], 0
    while i < len(argv):
        arg, value = argv[i], argv[i + 1] if i + 1 < len(argv) else None
        if arg in LENGTH_FLAGS:
            lengths = [str(max(MIN_LEN, int(n) // SHRINK)) for n in value.split(",")]
            value = ",".join(lengths if compiled else lengths[:2])
        elif arg in ("--docs", "--sparsity"):  # document lengths; block sizes, not counts
            number = r"(?<![a-z=])(\d+)" if arg == "--docs" else r"(?<=block=)(\d+)"
            value = re.sub(number, lambda m: str(max(4, int(m[1]) // SHRINK)), value)
        elif arg == "--impls" and not compiled:
            value = ",".join(n for n in value.split(",") if not _compiles(n)) or value
        if arg in (*LENGTH_FLAGS, "--docs", "--sparsity", "--impls"):
            out += [arg, value]
            i += 2
            continue
        out.append(arg)
        i += 1
    if "--seq-len" not in out:
        out += ["--seq-len", DEFAULT_SEQ]
    return [*out, "--rep-ms", "1", "--no-progress"]


def _compiles(name: str) -> bool:
    impl = plugins.discover().get(name)
    return bool(impl and impl.compiled)


def _files(tmp: Path) -> None:
    """Write the files the pages' commands name (a block headed '# NAME.ext')."""
    for page in PAGES:
        for _, text in blocks(page):
            first, _, body = text.partition("\n")
            if name := FILE_NAME.match(first):
                (tmp / name[1]).write_text(body)


def _substitute(argv: list[str], runs: list[Path], tmp: Path) -> list[str]:
    """results/<run-id> names the last run made in results/ (that has the --baseline impl, if
    one is given), <a> and <b> (<run-a>, <run-b>) the last two; /tmp/ is the test's folder,
    tests/ the checkout's."""
    argv = [arg.replace("/tmp/", f"{tmp}/") for arg in argv]
    argv = [str(ROOT / a) if a.startswith("tests/") else a for a in argv]  # the checkout's
    if not any("<" in arg for arg in argv):
        return argv
    mine = [r for r in runs if r.parent == Path("results")]
    baseline = _value(argv, "--baseline")
    fits = [r for r in mine if baseline in set(pd.read_csv(r / "results.csv")["impl"])]
    names = {"<a>": mine[-2:][0], "<run-a>": mine[-2:][0], "<b>": mine[-1], "<run-b>": mine[-1]}
    names["<run-id>"] = (fits if baseline else mine)[-1]
    out = []
    for arg in argv:
        for key, run in names.items():
            arg = arg.replace(key, run.name)
        out.append(arg)
    return out


def _run(cmd: Documented, tmp: Path, runs: list[Path], capfd, compiled: bool) -> str:
    """Run one documented command in ``tmp``; return what it did, or raise AssertionError."""
    argv = _substitute(cmd.argv, runs, tmp)
    command = argv[0]
    assert command in COMMANDS, f"{cmd.page}: {cmd.line}: not an attnbench command"
    sweeps = command in ("sweep", "race")
    if sweeps and _gpu_grid(argv) and not torch.cuda.is_available():
        argv = [*argv, "--device", "cpu", "--dry-run"]  # planned: every option checked
    if sweeps:
        argv = shrink(argv, compiled)
        if "--run-id" not in argv:
            argv += ["--run-id", f"doc{len(runs)}"]
    code = main(argv)
    out, err = capfd.readouterr()
    where = f"{cmd.page}: {cmd.line}\n  ran: attnbench {shlex.join(argv)}\n"
    assert "Traceback" not in err + out, where + err[-3000:]
    assert code in EXIT_CODES.get(command, (0,)), where + f"exit {code}\n" + err[-3000:]
    if not sweeps or "--dry-run" in argv:
        return f"exit {code}"
    run = Path(_value(argv, "--results-dir", "results")) / _value(argv, "--run-id")
    runs.append(run)
    df = pd.read_csv(run / "results.csv")
    assert (df["status"] == "ok").any(), where + df[["impl", "status", "reason"]].to_string()
    if "--no-report" not in argv:
        report = Path(_value(argv, "--reports-dir", "reports")) / run.name / "report.md"
        assert report.exists(), where + "no report written\n" + err[-3000:]
    return ", ".join(f"{n} {s}" for s, n in df["status"].value_counts().items())


def _gpu_grid(argv: list[str]) -> bool:
    """A GPU preset, named or in the sweep file: without CUDA it is planned (--dry-run)."""
    config = load_config(Path(_value(argv, "--config"))) if "--config" in argv else {}
    return _value(argv, "--preset", config.get("preset")) in GPU_PRESETS


def _value(argv: list[str], flag: str, default: str | None = None) -> str:
    return argv[argv.index(flag) + 1] if flag in argv else default


def test_every_documented_line_is_run_or_says_why_not():
    lines = documented()
    assert len(lines) > 30
    unknown = [
        f"{d.page}: {d.line}"
        for d in lines
        if not d.why_not_run() and d.argv[:1] != [] and d.argv[0] not in COMMANDS
    ]
    assert not unknown, "neither run nor in NOT_RUN: " + "; ".join(unknown)


# the default run's sweeps: those whose reports and rows no other default test renders (a
# plugin's impl, a score modifier under masks); then the commands that read "your" runs
# (placeholders, or none). The rest run with -m "" (about 700 rows and 14 reports)
DEFAULT_SWEEPS = ("--plugin my_attn.py", "--score-mod")


def _documented_runs(which: str) -> list[Documented]:
    """The lines to run: a line documented on several pages runs once."""
    unique: dict[str, Documented] = {}
    for d in documented():
        if not d.why_not_run():
            unique.setdefault(d.line, d)
    lines = list(unique.values())
    if which == "compiled":  # only the commands whose impls the other runs leave out
        impls = lambda d: _value(d.argv, "--impls", "").split(",")  # noqa: E731
        return [d for d in lines if any(_compiles(n) for n in impls(d))]
    if which == "default":
        reads = [d for d in lines if d.argv[0] not in ("sweep", "race")]
        reads = [d for d in reads if "<" in d.line or len(d.argv) == 1]
        return [d for d in lines if any(f in d.line for f in DEFAULT_SWEEPS)] + reads
    return lines


@pytest.mark.parametrize(
    "which",
    [
        # two sweeps, their reports and every command reading them: under 2 min on 2 cores
        "default",
        pytest.param("all", marks=pytest.mark.slow),  # every sweep: many minutes on 2 cores
        pytest.param("compiled", marks=pytest.mark.slow),  # with their torch.compile impls
    ],
)
def test_every_documented_command_runs(which, tmp_path, monkeypatch, capfd, registered):
    """In one folder, as a user would type them (results/ and reports/ under it): the sweeps
    in document order, then the commands that read runs (report, compare, repro, list)."""
    monkeypatch.chdir(tmp_path)
    _files(tmp_path)
    runs: list[Path] = []
    done, failed = [], []
    commands = _documented_runs(which)
    compiled = which == "compiled"
    for cmd in sorted(commands, key=lambda d: d.argv[0] not in ("sweep", "race")):
        try:
            done.append(f"{cmd.page}: {cmd.line} -> {_run(cmd, tmp_path, runs, capfd, compiled)}")
        except AssertionError as exc:
            failed.append(str(exc))
    print("\n".join(done))
    assert not failed, "\n\n".join(failed)


@pytest.mark.parametrize("script", ["sweep", "race", "report", "compare"])
def test_help_of_the_scripts_runs(script, monkeypatch, capsys):
    """The one-line wrappers in scripts/ answer --help, run as a user runs them (``__main__``;
    tests/test_cli.py runs scripts/sweep.py in a process of its own)."""
    monkeypatch.setattr(sys, "argv", [f"scripts/{script}.py", "--help"])
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts the checkout first
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(ROOT / "scripts" / f"{script}.py"), run_name="__main__")
    assert done.value.code == 0
    assert "usage:" in capsys.readouterr().out
