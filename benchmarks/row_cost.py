"""The harness's fixed cost per row: everything a row costs besides the impl's own calls.

Tiny rows (``sdpa`` at B1 H1 D16, sequence lengths 16 to 64, causal both, fwd and bwd, a 1 ms
timer budget) take microseconds of attention each, so a row's wall time here is the harness:
the support check, the accuracy comparison, the timer's warm-up and bookkeeping, the memory
pass, garbage collection, the clock sampler and the durable CSV writes. Every impl is
discovered first, as a sweep does, so the heap holds what a real sweep's does.

    python benchmarks/row_cost.py [--rows N] [--executor inprocess|subprocess|both]

prints seconds per row for each executor: one warm-up row first (a worker's start and the
first call's lazy set-up are start-up, not per-row cost), then N rows timed together.
``tests``-style use: ``benchmarks/test_row_cost.py`` runs it on a few rows.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from attnbench import plugins  # noqa: E402
from attnbench.case import Case  # noqa: E402
from attnbench.measure.timing import TimerConfig  # noqa: E402
from attnbench.run.executing.local import InProcess, Subprocess  # noqa: E402
from attnbench.run.executing.worker import Worker, WorkerSpec  # noqa: E402
from attnbench.run.measuring.row import Settings  # noqa: E402
from attnbench.run.sweep import run_sweep  # noqa: E402

REP_MS = 1.0
EXECUTORS = ("inprocess", "subprocess")


def tiny_cases(rows: int) -> list[Case]:
    """``rows`` tiny cases: lengths 16, 24, ... with both causal values and both modes."""
    cases = []
    n = 16
    while len(cases) < rows:
        for causal in (False, True):
            for mode in ("fwd", "bwd"):
                cases.append(Case(1, 1, 1, n, n, 16, causal=causal, mode=mode))
        n += 8
    return cases[:rows]


def per_row_s(executor: str, rows: int) -> float:
    """Seconds per tiny row, the executor already started and warm."""
    impls = plugins.discover()
    sdpa = impls["sdpa"]
    spec = WorkerSpec(settings=Settings(timer=TimerConfig(rep_ms=REP_MS)))
    ex = Worker(spec, Subprocess(spec) if executor == "subprocess" else InProcess(spec))
    try:
        with tempfile.TemporaryDirectory(prefix="attnbench-rowcost-") as tmp:
            for sub in ("warm", "run"):
                (Path(tmp) / sub).mkdir()
            warm = Case(1, 1, 1, 8, 8, 16)
            run_sweep([warm], [sdpa], Path(tmp) / "warm", [ex], run_id="warm", seed=0,
                      progress=False)  # fmt: skip
            cases = tiny_cases(rows)
            start = time.perf_counter()
            done = run_sweep(cases, [sdpa], Path(tmp) / "run", [ex], run_id="run", seed=0,
                             progress=False)  # fmt: skip
            elapsed = time.perf_counter() - start
    finally:
        ex.close()
    bad = [r for r in done if r["status"] != "ok"]
    if bad or len(done) != rows:
        raise RuntimeError(f"{len(bad)} of {len(done)} tiny rows failed: {bad[:1]}")
    return elapsed / rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=40)
    p.add_argument("--executor", choices=(*EXECUTORS, "both"), default="both")
    args = p.parse_args(argv)
    for name in EXECUTORS if args.executor == "both" else (args.executor,):
        print(f"{name}: {per_row_s(name, args.rows):.3f} s per row over {args.rows} tiny rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
