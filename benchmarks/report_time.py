"""How long `attnbench report` takes on one run folder, with the machine's load beside it.

    python benchmarks/report_time.py results/<run-id> [--repeat 3]

Prints one line per try: the wall time of the whole command (a fresh interpreter: imports,
analysis, markdown, every figure) and the 1-minute load average before and after, since a
loaded machine stretches the time. The report goes to a temporary folder."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time


def one_try(run_dir: str) -> float:
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        cmd = [sys.executable, "-m", "attnbench", "report", run_dir, "--reports-dir", out]
        subprocess.run(cmd, check=True, capture_output=True)
        return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    for i in range(args.repeat):
        before = os.getloadavg()[0]
        seconds = one_try(args.run_dir)
        print(
            f"try {i + 1}: {seconds:.1f} s  (load {before:.2f} before, "
            f"{os.getloadavg()[0]:.2f} after, {os.cpu_count()} cores)"
        )


if __name__ == "__main__":
    main()
