"""Command lines of scripts/report.py and scripts/compare.py.

Bad input prints one line ``error: ...`` on stderr, exits 2 and writes nothing."""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from attnbench.rundir import RunError, load_run

EXIT_OK, EXIT_REGRESSION, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse's default prints the usage too)
        self.exit(EXIT_USAGE, f"error: {message} (see {self.prog} --help)\n")


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give a percentage such "
                                         f"as 5 for +5%") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite percentage >= 0, "
                                         f"such as 5 for +5%")
    return value


def report_main(argv=None) -> int:
    parser = _Parser(prog="scripts/report.py",
                     description="Regenerate <reports-dir>/<run-id>/report.md and its figures "
                                 "from a run's results.csv and env.json.")
    parser.add_argument("run_dir", type=Path, help="a sweep's run folder, e.g. results/<run-id>")
    parser.add_argument("--reports-dir", type=Path, default=Path("reports"),
                        help="where <run-id>/report.md goes (default: reports)")
    parser.add_argument("--baseline", default=None,
                        help="impl the speedups are relative to (default: sdpa; the report "
                             "says so if the run has none)")
    args = parser.parse_args(argv)
    try:
        df, _ = load_run(args.run_dir)
    except RunError as exc:
        return _fail(str(exc))
    impls = sorted(df["impl"].dropna().unique())
    if args.baseline is not None and args.baseline not in impls:
        return _fail(f"--baseline {args.baseline!r} is not an impl of this run; pick one of: "
                     f"{', '.join(impls) or '(no rows)'}")
    if args.reports_dir.exists() and not args.reports_dir.is_dir():
        return _fail(f"--reports-dir {args.reports_dir} is a file; pass a folder")
    from attnbench.report import write_report  # imports matplotlib: only once input is valid

    path = write_report(args.run_dir, args.reports_dir, baseline=args.baseline or "sdpa")
    print(path)
    return EXIT_OK


def compare_main(argv=None) -> int:
    parser = _Parser(prog="scripts/compare.py",
                     description="Compare run B against run A: per-case time ratios "
                                 "(B / A), one-sided and failed cases, and a regression gate.")
    parser.add_argument("run_a", type=Path, help="the reference run folder (A)")
    parser.add_argument("run_b", type=Path, help="the run under test (B)")
    parser.add_argument("--fail-above", type=_percent, default=None, metavar="PCT",
                        help="exit 1 when any case ok in both is more than PCT%% slower in B, "
                             "or ok in A and not ok in B")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for compare.md, compare.csv and ratio_vs_seq.png "
                             "(default: reports/compare/<A>_vs_<B>)")
    args = parser.parse_args(argv)
    runs = []
    for label, path in (("A", args.run_a), ("B", args.run_b)):
        try:
            df, env = load_run(path)
        except RunError as exc:
            return _fail(f"run {label}: {exc}")
        runs.append((path.resolve().name, df, env))
    out = args.out or Path("reports") / "compare" / f"{runs[0][0]}_vs_{runs[1][0]}"
    if out.exists() and not out.is_dir():
        return _fail(f"--out {out} is a file; pass a folder")
    from attnbench.compare import regressions, summary_lines, write_compare

    cmp, path = write_compare(runs[0], runs[1], out, args.fail_above)
    for line in summary_lines(cmp, args.fail_above):
        print(line)
    print(path)
    if args.fail_above is not None and len(regressions(cmp, args.fail_above)):
        return EXIT_REGRESSION
    return EXIT_OK
