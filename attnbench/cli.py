"""The command line: ``attnbench sweep | race | list | report | compare | fidelity | repro``.

Every option (flag or sweep-file field) is checked before any work starts; bad input gets one
line on stderr naming the value and what is allowed, exit code 2, and nothing written (see
docs/cli.md). ``python scripts/sweep.py ...`` is ``attnbench sweep ...``.
"""

from __future__ import annotations

import argparse
import errno
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from attnbench import plugins as run_plugins
from attnbench.errors import ClusterLost, UsageError, did_you_mean
from attnbench.options import OPTIONS, flag, load_config, parse_value
from attnbench.report.render.terminal import list_impls, models_table, summary_table
from attnbench.repro import repro_command
from attnbench.store.env import write_env
from attnbench.store.results import done_keys, load_run, read_results
from attnbench.store.rundir import RunDir
from attnbench.store.schema import LOST

if TYPE_CHECKING:  # the sweep's modules import torch (2 s): imported by the commands that sweep
    from attnbench.run.planning.plan import Plan
    from attnbench.run.planning.target import Target

EXIT_OK, EXIT_REGRESSION, EXIT_USAGE = 0, 1, 2
EXIT_LOST = 3  # --executor ray: the cluster's head, every executor, or rows were lost
EXIT_UNJUDGED = 4  # compare --fail-above: too few cases could be judged (contended)
COMMANDS = {  # command -> what it does, for attnbench --help
    "sweep": "sweep impls over a grid of cases: results.csv, samples.csv, env.json, a report",
    "race": "the kernel race: the race preset (a GPU grid) as a sweep",
    "list": "every impl, available or not: what it supports, where it came from, why not",
    "report": "regenerate a run's report from its results.csv and env.json",
    "compare": "run B against run A, per case; --fail-above PCT is a regression gate",
    "fidelity": "can the numbers be trusted: timer vs profiler, repeatability, backend labels",
    "repro": "print the one-row command that measures a row of a run again",
}


class _Parser(argparse.ArgumentParser):
    def __init__(self, **kwargs):  # --impl is not --impls: no prefixes of long options
        super().__init__(allow_abbrev=False, **kwargs)

    def error(self, message: str):  # argparse's own errors: one line, exit 2
        raise UsageError(f"{message}{self._close_flag(message)} (see {self.prog} --help)")

    def _close_flag(self, message: str) -> str:
        """'; did you mean --seq-len?' for the first unrecognized flag close to a known one."""
        head, sep, given = message.partition("unrecognized arguments: ")
        flags = [w.split("=")[0] for w in given.split() if w.startswith("--")] if sep else []
        known = [f for f in self._option_string_actions if f.startswith("--")]
        return next((hint for f in flags if (hint := did_you_mean(f, known))), "")


def _add_option(p: argparse.ArgumentParser, name: str, option) -> None:
    """``name``'s flags as its ``style`` says (options.Option)."""
    help_, style = _help(name), option.style
    if style == "append":
        p.add_argument(flag(name), dest=name, action="append", metavar=option.metavar, help=help_)
    elif style == "optional":
        p.add_argument(
            flag(name), dest=name, nargs="?", const=option.const, metavar=option.metavar, help=help_
        )
    elif style in ("toggle", "const"):
        p.add_argument(flag(name), dest=name, action="store_const", const="true", help=help_)
        if style == "toggle":
            no = flag(name).replace("--", "--no-", 1)
            p.add_argument(no, dest=name, action="store_const", const="false", help=option.no_help)
    else:
        p.add_argument(flag(name), dest=name, metavar=name.upper(), help=help_)


def _help(name: str) -> str:
    """An option's help as argparse wants it: argparse %-formats help, so '%' is '%%'."""
    return OPTIONS[name].help.replace("%", "%%")


def _usage() -> str:
    lines = [
        f"usage: attnbench {{{','.join(COMMANDS)}}} [options]   |   attnbench --version",
        "",
        "Benchmark and profile attention implementations: time, TFLOP/s, memory, scaling and",
        "agreement with a float64 reference, one CSV row per case and impl.",
        "",
        "commands:",
        *(f"  {name:<9} {what}" for name, what in COMMANDS.items()),
        "",
        "attnbench COMMAND --help lists a command's options (docs/cli.md in the source tree).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage(), file=sys.stdout if argv else sys.stderr)
        return EXIT_OK if argv else EXIT_USAGE
    if argv[0] in ("-V", "--version"):
        from attnbench.run.executing.environment import version_line

        print(version_line())
        return EXIT_OK
    command, rest = argv[0], argv[1:]
    try:
        if command not in COMMANDS:
            raise UsageError(
                f"unknown command {command!r}{did_you_mean(command, COMMANDS)} "
                f"(commands: {', '.join(COMMANDS)})"
            )
        return {
            "sweep": sweep,
            "race": race,
            "list": list_command,
            "report": report,
            "compare": compare,
            "fidelity": fidelity,
            "repro": repro,
        }[command](rest)
    except UsageError as exc:
        print(f"attnbench {command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ClusterLost as exc:
        print(f"attnbench {command}: error: {exc}", file=sys.stderr)
        return EXIT_LOST
    except BrokenPipeError:  # the reader left early (attnbench list | head): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def build_parser(command: str = "sweep") -> argparse.ArgumentParser:
    p = _Parser(
        prog=f"attnbench {command}",
        description="Sweep attention impls over a grid of cases and "
        "write <results-dir>/<run-id>/results.csv, samples.csv and env.json.",
    )
    p.add_argument(
        "--config",
        type=Path,
        metavar="FILE.toml",
        help="sweep file: TOML whose keys are the options below (flags win)",
    )
    for name, option in OPTIONS.items():
        _add_option(p, name, option)
    p.add_argument("--run-id", help="name of the run folder (default: time-device-preset)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run --run-id: rows "
        "already in its results.csv are kept and not run again",
    )
    p.add_argument(
        "--results-dir",
        default="results",
        type=Path,
        help="where the run folder <run-id>/ (results.csv, samples.csv, env.json) goes "
        "(default: results)",
    )
    p.add_argument(
        "--reports-dir",
        default="reports",
        type=Path,
        help="where the report <run-id>/report.md and its figures go (default: reports)",
    )
    p.add_argument("--list", action="store_true", help="list every impl and exit")
    p.add_argument(
        "--list-models", action="store_true", help="list the model presets (--model) and exit"
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check every option, print the grid's size (cases x impls = rows), its cases and "
        "impls, and exit without running or writing anything (also for --device cuda on a "
        "machine without a GPU)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--no-report",
        action="store_true",
        help="write no report at the end (attnbench report RUN_DIR makes it later)",
    )
    _tolerance_argument(p)
    p.add_argument(
        "--row-lines",
        action="store_true",
        help="print one line per finished row "
        "(for logs: a run killed midway still shows how far it got)",
    )
    return p


def resolve_options(args: argparse.Namespace) -> dict:
    """Sweep file first, flags over it; every value parsed by the same rules."""
    values = load_config(args.config) if args.config else {}
    for name in OPTIONS:
        given = getattr(args, name)
        if name == "plugin" and given:
            values[name] = [p for text in given for p in parse_value(name, text, "--plugin")]
        elif given is not None and name != "plugin":
            values[name] = parse_value(name, given, flag(name))
    return values


def _check_folders(*pairs: tuple[str, Path]) -> None:
    """Each folder can be written: it is a folder, or can be made in the nearest existing one
    (tried with a temporary file, removed at once), before any work starts."""
    for name, folder in pairs:
        if folder.exists() and not folder.is_dir():
            raise UsageError(f"{name} {folder}: is a file, not a folder")
        base = folder
        while not base.exists():
            base = base.parent
        if not base.is_dir():
            raise UsageError(
                f"{name} {folder}: {base} is a file, so no folder can be made "
                f"under it; pick another {name}"
            )
        try:
            fd, probe = tempfile.mkstemp(prefix=".attnbench-probe-", dir=base)
        except OSError as exc:
            raise UsageError(
                f"{name} {folder}: cannot write in {base} ({exc.strerror}); "
                f"pick a folder you can write to"
            ) from None
        os.close(fd)
        os.unlink(probe)


def sweep(argv: list[str], command: str = "sweep", default_preset: str | None = None) -> int:
    from attnbench.run.planning.plan import Plan
    from attnbench.run.planning.target import Target

    args = build_parser(command).parse_args(argv)
    if args.list_models:
        return _print(models_table())
    opts = resolve_options(args)
    target = Target.from_options(opts, dry_run=args.dry_run)
    if args.list:
        return _print(list_impls(target.impls, target.device_type))
    plan = Plan.from_options(
        opts, target, command=command, default_preset=default_preset, dry_run=args.dry_run
    )
    if args.dry_run:
        return _print(plan.dry_run_text())
    if plan.run.retry and not args.resume:
        raise UsageError("--retry: only with --resume (it names rows of a run to run again)")
    _check_folders(("--results-dir", args.results_dir), ("--reports-dir", args.reports_dir))
    run_id, run = plan.run_dir(args.results_dir, args.run_id, resume=args.resume)
    try:
        return _sweep(args, argv, plan, target, run, run_id)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        again = (
            f"every row finished before is in {run.results}: free space, then continue with: "
            f"{plan.resume_command(argv, run_id, bool(args.run_id))}"
            if run.results.exists()
            else "no row was finished: free space, then run the same command again"
        )
        raise UsageError(f"{exc.strerror} (writing {exc.filename or run.path}); {again}") from None


def _sweep(args, argv: list[str], plan: Plan, target: Target, run: RunDir, run_id: str) -> int:
    """The sweep of a checked ``plan`` into ``run``, its summary and its report."""
    from attnbench.run.executing import executors
    from attnbench.run.planning.plan import warn_if_busy

    with executors.start(target.executor, plan) as pool:
        if pool.started:
            print(pool.started)
        pool.on_head_lost(_head_lost(plan, argv, run, run_id, bool(args.run_id)))
        done = done_keys(run.path, plan.run.retry) if args.resume else set()
        print(plan.start_text(run, len(done)))
        if warning := warn_if_busy(plan.device):
            print(warning, file=sys.stderr)
        devices = pool.measure_devices()  # every executor lost: ClusterLost, nothing written
        run.write_grid(plan.grid)
        write_env(run.env_to_write(args.resume), plan.env(argv) | devices)
        try:
            plan.sweep(run, run_id, pool.executors, done, args.no_progress, args.row_lines)
        except KeyboardInterrupt:
            print(plan.interrupted_text(argv, run, run_id, bool(args.run_id)), file=sys.stderr)
            return 130
    rows = read_results(run.path)
    print(summary_table(rows, [i.name for i in plan.impls]))
    if args.no_report:
        print(f"\nresults: {run.results}")
    else:
        print(f"\nresults: {run.results}\nreport:  {_write_report(run.path, args)}")
    return _lost_rows(rows, plan, argv, run_id, bool(args.run_id))


def _write_report(run_dir: Path, args: argparse.Namespace) -> Path:
    from attnbench.report.report import write_report  # matplotlib: only once there are rows

    return write_report(run_dir, args.reports_dir, tolerance=args.tolerance)


def _lost_rows(rows, plan: Plan, argv: list[str], run_id: str, named: bool) -> int:
    """EXIT_OK, or, when rows of the run are ``lost`` (their executor was lost), one line
    with their count and the command that runs them, and EXIT_LOST."""
    lost = int(rows["status"].eq(LOST).sum()) if len(rows) else 0
    if not lost:
        return EXIT_OK
    print(
        f"attnbench {plan.command}: {lost} row(s) lost with their executor (status lost, no "
        f"number); run them with: {plan.resume_command(argv, run_id, named)}",
        file=sys.stderr,
    )
    return EXIT_LOST


def _head_lost(plan: Plan, argv: list[str], run: RunDir, run_id: str, named: bool):
    """What happens when the Ray cluster's head is lost mid-sweep: the summary of the rows
    written, one line with the cause and the command that continues, exit EXIT_LOST (the
    rows are safe: each was fsynced when written; Ray's calls in flight cannot be ended)."""

    def lost(address: str) -> None:
        try:
            print(summary_table(read_results(run.path), [i.name for i in plan.impls]))
        except (OSError, ValueError):  # no row yet
            pass
        print(
            f"attnbench {plan.command}: error: the Ray cluster's head ({address}) stopped "
            f"answering; every finished row is in {run.results}. Continue, on a running "
            f"cluster, with: {plan.resume_command(argv, run_id, named)}",
            file=sys.stderr,
        )
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_LOST)

    return lost


def _print(text: str) -> int:
    print(text)
    return EXIT_OK


def race(argv: list[str]) -> int:
    """The kernel race: the ``race`` preset (fixed tokens and hidden size) as a sweep."""
    return sweep(argv, command="race", default_preset="race")


def list_command(argv: list[str]) -> int:
    p = _Parser(
        prog="attnbench list",
        description="List every impl: where it runs, what it supports, and why it is unavailable.",
    )
    p.add_argument("--plugin", action="append", default=[], metavar="PATH", help=_help("plugin"))
    p.add_argument("--device", default=None, help=_help("device"))
    from attnbench.run.planning.target import check_device

    args = p.parse_args(argv)
    plugins = [x for text in args.plugin for x in parse_value("plugin", text, "--plugin")]
    for text in plugins:
        run_plugins.plugin_source(text)
    # what runs on a device is a question worth asking on a machine without one
    device = (
        check_device(None)
        if args.device is None
        else parse_value("device", args.device, "--device")
    )
    print(list_impls(run_plugins.discover(plugins), device.split(":")[0]))
    return EXIT_OK


def report(argv: list[str]) -> int:
    p = _Parser(
        prog="attnbench report",
        description="Regenerate <reports-dir>/<run-id>/"
        "report.md and its figures from a run's results.csv and env.json.",
    )
    p.add_argument("run_dir", type=Path, help="a sweep's run folder, e.g. results/<run-id>")
    p.add_argument(
        "--reports-dir",
        type=Path,
        default=Path("reports"),
        help="where <run-id>/report.md goes (default: reports)",
    )
    p.add_argument(
        "--baseline",
        help="impl the speedups are relative to "
        "(default: the impl the run recorded as its baseline)",
    )
    p.add_argument("--svg", action="store_true", help="also write each figure as SVG")
    _tolerance_argument(p)
    _plugin_argument(p)
    args = p.parse_args(argv)
    df, env = load_run(args.run_dir)
    impls = sorted(df["impl"].dropna().unique())
    if args.baseline is not None and args.baseline not in impls:
        raise UsageError(
            f"--baseline {args.baseline!r} is not an impl of this run; pick one "
            f"of: {', '.join(impls) or '(no rows)'}"
        )
    _check_folders(("--reports-dir", args.reports_dir))
    _load_plugins(env, args.plugin)  # the rows' mask kinds and score modifiers may be theirs
    from attnbench.report.report import write_report  # matplotlib: only once input is valid

    written = write_report(
        args.run_dir, args.reports_dir, args.baseline, args.svg, tolerance=args.tolerance
    )
    print(written)
    return EXIT_OK


def _tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value >= 1.0 or value == float("inf"):
        raise argparse.ArgumentTypeError(
            f"{text!r}: the most a pick may lose is a ratio of 1 or more (e.g. 1.10)"
        )
    return value


def _tolerance_argument(p: argparse.ArgumentParser) -> None:
    from attnbench.report.decide.tolerance import TOLERANCE

    p.add_argument(
        "--tolerance",
        type=_tolerance,
        default=TOLERANCE,
        help="the most a recommended impl may be slower than the fastest agreeing kernel in "
        "any case of its workload, as a ratio (where the run's measured noise in a case is "
        "smaller, the noise is the limit there); a phase is split where one pick would lose "
        f"more (default: {TOLERANCE:g})",
    )


def _plugin_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="PATH",
        help="load this plugin file, folder or module instead of those the run recorded in its "
        "env.json (one moved since the run, say; repeatable)",
    )


def _load_plugins(env: dict, given: list[str]) -> list[str]:
    """Load the run's plugins (or ``given``), say which on stderr in one line; the --plugin
    values a reproducer of its rows passes."""
    plugins, line = run_plugins.load(
        env, [x for text in given for x in parse_value("plugin", text, "--plugin")]
    )
    if line:
        print(line, file=sys.stderr)
    return plugins


def _load_runs(run_a: Path, run_b: Path) -> list[tuple[str, pd.DataFrame, dict]]:
    """(name, results, env) of runs A and B; a bad folder is a usage error naming which."""
    runs = []
    for label, path in (("A", run_a), ("B", run_b)):
        try:
            df, env = load_run(path)
        except UsageError as exc:
            raise UsageError(f"run {label}: {exc}") from None
        runs.append((path.resolve().name, df, env))
    _check_two_runs(run_a, run_b, runs[0][1:], runs[1][1:])
    return runs


def _check_two_runs(run_a: Path, run_b: Path, a: tuple, b: tuple) -> None:
    """Runs A and B must be two runs: the same folder twice, or a copy of it (the same start
    time and the same rows), has nothing to compare and no run-to-run noise to measure."""
    same = run_a.resolve() == run_b.resolve()
    copy = a[1].get("time_utc") == b[1].get("time_utc") and a[0].equals(b[0])
    if same or copy:
        what = "the same folder" if same else f"a copy of {run_a} (same start time and rows)"
        raise UsageError(
            f"run B {run_b} is {what}: a run against itself has nothing to compare and no "
            f"run-to-run noise to measure; sweep the same grid again and compare the two runs"
        )


def fidelity(argv: list[str]) -> int:
    p = _Parser(
        prog="attnbench fidelity",
        description="Can the numbers be trusted? Timer vs "
        "profiler, repeatability and backend labels, from two back-to-back runs of the "
        "same grid made with --profile (docs/method.md).",
    )
    p.add_argument("run_a", type=Path, help="the first run folder")
    p.add_argument("run_b", type=Path, help="the same grid, run again right after")
    p.add_argument(
        "--out",
        type=Path,
        help="folder for fidelity.csv and fidelity.txt (default: reports/fidelity/<A>_vs_<B>)",
    )
    args = p.parse_args(argv)
    from attnbench.report.compare.fidelity import check_runs, write_fidelity

    runs = _load_runs(args.run_a, args.run_b)
    check_runs([(path, df, env) for path, (_, df, env) in zip((args.run_a, args.run_b), runs)])
    out = args.out or (
        Path("reports") / "fidelity" / f"{args.run_a.resolve().name}_vs_{args.run_b.resolve().name}"
    )
    _check_folders(("--out", out))
    _, lines = write_fidelity(args.run_a, args.run_b, out)
    for line in lines:
        print(f"fidelity: {line}")
    print(out / "fidelity.csv")
    return EXIT_OK


def repro(argv: list[str]) -> int:
    p = _Parser(
        prog="attnbench repro",
        description="Print the one-row command (impl, case, plugin, seed and measuring "
        "options) that measures a row of a run again.",
    )
    p.add_argument("run_dir", type=Path, help="a sweep's run folder, e.g. results/<run-id>")
    p.add_argument("row", type=int, help="the row's position in results.csv (0: the first)")
    _plugin_argument(p)
    args = p.parse_args(argv)
    df, env = load_run(args.run_dir)
    run = RunDir(args.run_dir)
    if not 0 <= args.row < len(df):
        raise UsageError(
            f"row {args.row}: {run.results} has rows 0 to {len(df) - 1}"
            if len(df)
            else f"row {args.row}: {run.results} has no rows"
        )
    plugins = _load_plugins(env, args.plugin)  # the row's mask kind or modifier may be theirs
    # without grid.json the preset and rep_ms come from the defaults
    print(repro_command(df.iloc[args.row], env, run.read_grid(), plugins))
    return EXIT_OK


def _percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number; give a percentage such as 5 for +5%"
        ) from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} must be a finite percentage >= 0, such as 5 for +5%"
        )
    return value


def compare(argv: list[str]) -> int:
    p = _Parser(
        prog="attnbench compare",
        description="Compare run B against run A: per-case "
        "time ratios (B / A), one-sided and failed cases, and a regression gate.",
    )
    p.add_argument("run_a", type=Path, help="the reference run folder (A)")
    p.add_argument("run_b", type=Path, help="the run under test (B)")
    p.add_argument(
        "--fail-above",
        type=_percent,
        metavar="PCT",
        help="exit 1 when any case ok in both is more than PCT%% slower in B, "
        "or ok in A and not ok in B, or no case is ok in both (nothing compared); exit 4 "
        "when fewer than half the compared cases could be judged (the rest contended)",
    )
    p.add_argument(
        "--out",
        type=Path,
        help="folder for compare.md, "
        "compare.csv and ratio_vs_seq.png (default: reports/compare/<A>_vs_<B>)",
    )
    args = p.parse_args(argv)
    runs = _load_runs(args.run_a, args.run_b)
    out = args.out or Path("reports") / "compare" / f"{runs[0][0]}_vs_{runs[1][0]}"
    _check_folders(("--out", out))
    from attnbench.report.compare.compare import (
        cannot_judge,
        gate_fails,
        summary_lines,
        write_compare,
    )

    cmp, path = write_compare(runs[0], runs[1], out, args.fail_above, (args.run_a, args.run_b))
    for line in summary_lines(cmp, args.fail_above):
        print(line)
    print(path)
    if args.fail_above is not None and gate_fails(cmp, args.fail_above):
        return EXIT_REGRESSION
    if args.fail_above is not None and cannot_judge(cmp):
        return EXIT_UNJUDGED
    return EXIT_OK
