"""README's quick start says what its first command gives: the row count of the default grid
with step 1's packages alone (no extra: no transformers, xFormers or Triton), and with step
2's (the test extra, transformers among them), as --dry-run counts them."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = ("transformers", "xformers", "triton", "flash_attn", "flashinfer")  # not in step 1
DRY_RUN = """
import sys
for name in sys.argv[1:]:
    sys.modules[name] = None  # not installed
from attnbench.cli import main
sys.exit(main(["sweep", "--device", "cpu", "--dry-run"]))
"""


def _rows(*missing: str) -> int:
    proc = subprocess.run(
        [sys.executable, "-c", DRY_RUN, *missing], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return int(re.search(r"= (\d+) rows on cpu", proc.stdout).group(1))


def test_the_quick_start_row_counts_are_the_default_grid_s():
    text = (ROOT / "README.md").read_text()
    step1 = re.search(r"#\s+(\d+) rows and their report", text)
    step2 = re.search(r"\((\d+) rows once step 2 has\s+#\s+installed transformers", text)
    assert step1 and step2, "README's step 1 no longer says its row counts"
    assert int(step1.group(1)) == _rows(*EXTRAS)
    pytest.importorskip("transformers", reason="step 2's packages are not all installed")
    assert int(step2.group(1)) == _rows()
