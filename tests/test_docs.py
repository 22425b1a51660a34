"""The examples the docs show are run, so they cannot drift from the code."""

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


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
