"""The examples the docs show are run, so they cannot drift from the code."""

import importlib
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


@pytest.mark.slow  # a sweep of every guide example (test_plugin_contract.py runs two by default)
def test_the_plugin_guide_examples_register_and_agree(tmp_path):
    blocks = [b for b in python_blocks(ROOT / "docs" / "plugins.md") if "@register(" in b]
    plugin = tmp_path / "guide_examples.py"
    plugin.write_text(max(blocks, key=len))  # the one with an example per capability
    readme = tmp_path / "readme_example.py"
    readme.write_text(python_blocks(ROOT / "README.md")[0])
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "sweep.py"),
            "--device",
            "cpu",
            "--no-progress",
            "--no-report",
            "--plugin",
            str(plugin),
            "--plugin",
            str(readme),
            "--impls",
            "plain_gqa,seq_first,masked,fwd_only,my_attn",
            "--batch",
            "1",
            "--heads",
            "4",
            "--kv-heads",
            "4,2",
            "--seq-len",
            "48",
            "--head-dim",
            "64",
            "--dtype",
            "float32,bfloat16",
            "--causal",
            "both",
            "--mask",
            "none,padding",
            "--mode",
            "fwd",
            "--rep-ms",
            "2",
            "--results-dir",
            str(tmp_path / "res"),
            "--reports-dir",
            str(tmp_path / "rep"),
            "--run-id",
            "docs",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = pd.read_csv(tmp_path / "res" / "docs" / "results.csv")
    ok = df[df["status"] == "ok"]
    assert set(ok["impl"]) == {"plain_gqa", "seq_first", "masked", "my_attn"}
    assert ok["agrees"].all(), ok[~ok["agrees"]][["impl", "reason"]]
    fwd_only = df[df["impl"] == "fwd_only"]
    assert (fwd_only["status"] == "unsupported").all()  # CUDA only: said, not run


@pytest.mark.slow  # seven rows of README's my_attn in float16 on the CPU
def test_the_plugin_guides_test_file_passes_on_the_readme_impl(tmp_path, monkeypatch):
    """docs/plugins.md "Testing your impl": its test file, run by pytest as a plugin author
    would, against README's my_attn.py."""
    (block,) = [b for b in python_blocks(ROOT / "docs" / "plugins.md") if "# test_my_attn" in b]
    (tmp_path / "test_my_attn.py").write_text(block)
    (tmp_path / "my_attn.py").write_text(python_blocks(ROOT / "README.md")[0])
    monkeypatch.chdir(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts="],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-3000:]


def bash_commands(path: Path) -> list[str]:
    """The command lines of a page's bash blocks: comments dropped, continued lines joined."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", path.read_text(), flags=re.S):
        text = block.replace("\\\n", " ")
        for line in text.splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


@pytest.mark.slow  # three pytest runs, each importing torch and every impl: about a minute
def test_the_benchmark_commands_save_compare_and_list(tmp_path):
    """docs/benchmarks.md's three commands, on one tiny benchmark, into a private storage."""
    save, compare, listing = bash_commands(ROOT / "docs" / "benchmarks.md")
    storage = f"file://{tmp_path / 'store'}"
    quick = ["-k", "naive and not padding and not compiled", "-p", "no:cacheprovider"]
    quick += [f"--benchmark-storage={storage}", "--benchmark-max-time=0.01"]

    def pytest_run(line: str):
        args = shlex.split(line)
        assert args[0] == "pytest", line
        return subprocess.run(
            [sys.executable, "-m", "pytest", *args[1:], *quick],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )

    first = pytest_run(save)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    saved = list((tmp_path / "store").rglob("*_before.json"))
    assert len(saved) == 1, first.stdout[-2000:]
    second = pytest_run(compare)
    out = second.stdout + second.stderr
    assert "Comparing against benchmarks from" in out, out[-2000:]
    # its gate may trip on a busy machine; it must have compared, and said so if it failed
    assert second.returncode == 0 or "Performance has regressed" in out, out[-2000:]
    args = shlex.split(listing)
    assert args[0] == "pytest-benchmark", listing
    third = subprocess.run(
        [sys.executable, "-m", "pytest_benchmark", "--storage", storage, *args[1:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert third.returncode == 0 and "test_attention[naive" in third.stdout, third.stderr[-2000:]


def test_a_benchmark_run_that_would_save_nothing_is_refused(tmp_path):
    args = [sys.executable, "-m", "pytest", "benchmarks/", "--benchmark-enable"]
    args += ["--benchmark-save=x", f"--benchmark-storage=file://{tmp_path}"]
    args += ["-p", "no:cacheprovider"]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "add -n 0" in proc.stderr, proc.stderr[-2000:]
    assert not list(tmp_path.rglob("*.json"))


DOC_PAGES = [
    ROOT / "README.md",
    ROOT / "impls" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]


def _resolve(dotted: str):
    """Import the longest importable module prefix of ``dotted``; getattr the rest."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ModuleNotFoundError(dotted)


def test_every_python_path_the_docs_name_exists():
    named = set()
    for page in DOC_PAGES:
        text = page.read_text()
        named |= {(page.name, m) for m in re.findall(r"\battnbench(?:\.[A-Za-z_]\w*)+", text)}
        for module, names in re.findall(r"from (attnbench[\w.]*) import ([\w, ]+)", text):
            named |= {(page.name, f"{module}.{n.strip()}") for n in names.split(",")}
    assert len(named) > 5
    missing = []
    for page, dotted in sorted(named):
        try:
            _resolve(dotted)
        except (ImportError, AttributeError):
            missing.append(f"{page}: {dotted}")
    assert not missing, missing


def test_the_python_examples_on_results_run(tmp_path, capsys):
    """The pandas examples of docs/method.md and docs/reports.md, on a run folder with op and
    layer rows."""
    from dataclasses import replace

    from synth import env, ok_row, smoke_rows, write_run

    from attnbench.case import Case

    rows = smoke_rows("docs", seqs=(64, 128, 256))
    for r in [r for r in rows if r["status"] == "ok" and r["mode"] == "fwd"]:
        case = replace(Case.from_row(r), level="layer")
        rows.append(ok_row("docs", r["impl"], case, 2 * r["time_ms"], 1.0))
    run = write_run(tmp_path, "RUN", rows, env())
    blocks = [
        b
        for page in ("method.md", "reports.md")
        for b in python_blocks(ROOT / "docs" / page)
        if "read_results" in b
    ]
    assert len(blocks) == 2
    for block in blocks:
        exec(compile(block.replace('"results/RUN"', repr(str(run))), "docs", "exec"), {})
    out = capsys.readouterr().out
    assert "attention share of the layer" in out and "slope" in out
