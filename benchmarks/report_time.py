"""How long `attnbench report` takes on one run folder, with the machine's load beside it.

    python benchmarks/report_time.py results/<run-id> [--repeat 3]
    python benchmarks/report_time.py results/<run-id> --code /tmp/before --code . --repeat 5

Prints one line per try: the wall time of the whole command (a fresh interpreter: imports,
analysis, markdown, every figure), the CPU time it and its drawing processes used, and the
1-minute load average before and after, since a loaded machine stretches the time. With
``--code`` (a checkout's root, given more than once to compare), each try runs every checkout
in turn, so a before/after comparison sees the same load; the last line per checkout is its
median. The report goes to a temporary folder."""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _python(code: str | None, *args: str) -> subprocess.CompletedProcess:
    """``python *args`` with the attnbench of ``code`` (a checkout's root; None: the
    installed one): python -m puts its own folder first on the path, so it runs there."""
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = code = os.path.abspath(code)
    cmd = [sys.executable, *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, cwd=code)


def timed_package(code: str | None) -> str:
    """The folder of the attnbench that ``code``'s tries import."""
    probe = "import attnbench, os; print(os.path.dirname(attnbench.__file__))"
    return _python(code, "-c", probe).stdout.strip()


def one_try(run_dir: str, code: str | None) -> tuple[float, float]:
    """(wall s, CPU s) of one `attnbench report` of ``run_dir`` with ``code``'s attnbench."""
    with tempfile.TemporaryDirectory() as out:
        cpu, start = _children_cpu_s(), time.perf_counter()
        _python(code, "-m", "attnbench", "report", os.path.abspath(run_dir), "--reports-dir", out)
        return time.perf_counter() - start, _children_cpu_s() - cpu


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument(
        "--code",
        action="append",
        metavar="DIR",
        help="a checkout's root whose attnbench to time (repeat to compare; default: installed)",
    )
    args = p.parse_args(argv)
    codes = args.code or [None]
    walls: dict = {code: [] for code in codes}
    for code in codes:
        print(f"{code or 'installed'}: times {timed_package(code)}")
    for i in range(args.repeat):
        for code in codes:
            before = os.getloadavg()[0]
            wall, cpu = one_try(args.run_dir, code)
            walls[code].append(wall)
            print(
                f"try {i + 1}{f' {code}' if code else ''}: {wall:.1f} s, CPU {cpu:.1f} s  "
                f"(load {before:.2f} before, {os.getloadavg()[0]:.2f} after, "
                f"{os.cpu_count()} cores)"
            )
    for code, times in walls.items():
        print(f"median{f' {code}' if code else ''}: {statistics.median(times):.1f} s")
    return walls


if __name__ == "__main__":
    main()
