"""scripts/sweep.py in a subprocess on the CPU (also on a machine with a GPU: the tests that use
it are about the command line, its files and its faults, not the device)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def sweep(*args, cwd=None, env=None, timeout=600):
    """The documented main job with ``args``; ``env`` None: this process's, Python's
    warnings off (a torch or library warning is not the command's output)."""
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "sweep.py"), "--device", "cpu", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env={**os.environ, "PYTHONWARNINGS": "ignore"} if env is None else env,
    )
