"""``attnbench report``, ``compare`` and ``fidelity`` read rows and need no tensor, so they
import no torch (2 s of a report's 5): the commands run in a fresh interpreter that records
which attnbench modules were on the stack when torch was first imported, so a failure names
the import to make lazy or the constant to move (docs/layout.md: "Imports")."""

import json
import os
import subprocess
import sys
from pathlib import Path

from synth import env, smoke_rows, write_rounds_run

ROOT = Path(__file__).resolve().parent.parent

# The child: a finder first on sys.meta_path sees every import; on torch's first, it keeps the
# command running and each attnbench frame on the stack (module:line and function), innermost
# first; it finds nothing itself, so the import goes on as it would.
CHILD = """
import json, sys

class Watch:
    step, chain = "import attnbench.cli", None

    def find_spec(self, name, path=None, target=None):
        if name == "torch" and Watch.chain is None:
            frames, f = [], sys._getframe(1)
            while f is not None:
                module = f.f_globals.get("__name__", "")
                if module.startswith("attnbench"):
                    frames.append(f"{module}:{f.f_lineno} ({f.f_code.co_name})")
                f = f.f_back
            Watch.chain = [Watch.step, *frames]
        return None

sys.meta_path.insert(0, Watch())
from attnbench.cli import main

codes = {}
for argv in json.loads(sys.argv[1]):
    Watch.step = "attnbench " + " ".join(argv)
    codes[argv[0]] = main(argv)
print(json.dumps({"codes": codes, "torch": Watch.chain}))
"""


def run_child(commands: list[list[str]], cwd: Path) -> dict:
    """The commands' exit codes and the torch import's chain (None: no torch) from a fresh
    interpreter that imports attnbench from this tree."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(commands)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        env={**os.environ, "PYTHONPATH": path, "PYTHONWARNINGS": "ignore"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def profiled_run(root: Path, name: str, seed: int) -> Path:
    """A small run timed in rounds with its speed anchor, made with --profile and its
    grid.json: what report, compare and fidelity each read."""
    rows = smoke_rows(name, seqs=(64, 128, 256), seed=seed)
    run = write_rounds_run(root, name, rows, {**env(), "profile": ["all"]}, rounds=3, seed=seed)
    cases = sorted({f"{r['impl']} {r['seq_q']} {r['mode']} {r['causal']}" for r in rows})
    grid = {"device": "cpu", "impls": sorted({r["impl"] for r in rows}), "cases": cases}
    (run / "grid.json").write_text(json.dumps(grid))
    return run


def test_report_compare_and_fidelity_import_no_torch(tmp_path):
    a, b = profiled_run(tmp_path, "a", 0), profiled_run(tmp_path, "b", 1)
    out = tmp_path / "out"
    commands = [
        ["report", str(a), "--reports-dir", str(out)],
        ["compare", str(a), str(b), "--out", str(out / "compare")],
        ["fidelity", str(a), str(b), "--out", str(out / "fidelity")],
    ]
    got = run_child(commands, tmp_path)
    assert got["codes"] == {"report": 0, "compare": 0, "fidelity": 0}
    assert got["torch"] is None, "torch was imported by:\n  " + "\n  <- ".join(got["torch"])
    assert (out / "a" / "report.md").is_file() and (out / "a" / "time_vs_seq.png").is_file()
    assert (out / "compare" / "compare.md").is_file()
    assert (out / "fidelity" / "fidelity.txt").is_file()


def test_the_guard_names_the_module_that_imports_torch(tmp_path):
    """The chain the test above prints on failure: here torch is imported on purpose, by the
    module that probes the machine (for the version line), which imports it at the top."""
    got = run_child([["--version"]], tmp_path)
    assert got["codes"] == {"--version": 0}
    assert got["torch"][0] == "attnbench --version"
    assert any(frame.startswith("attnbench.cli:") for frame in got["torch"])
    assert got["torch"][1].split(":")[0] != "attnbench.cli"  # the importing module comes first
