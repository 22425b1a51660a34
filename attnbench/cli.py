"""The command line: ``attnbench sweep | race | list | report | compare | fidelity | repro``.

Every option (flag or sweep-file field) is checked before any work starts; bad input gets one
line on stderr naming the value and what is allowed, exit code 2, and nothing written (see
docs/cli.md). ``python scripts/sweep.py ...`` is ``attnbench sweep ...``.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pandas as pd
import torch

from attnbench import checkout, registry
from attnbench.case import Case
from attnbench.errors import UsageError
from attnbench.measure import allocator, ceilings
from attnbench.measure.timing import TimerConfig
from attnbench.models import models_table
from attnbench.options import OPTIONS, as_text, flag, load_config, parse_value
from attnbench.run.executors import InProcess, Subprocess
from attnbench.run.row import Settings
from attnbench.run.sweep import run_sweep
from attnbench.spec import GPU_PRESETS, Spec
from attnbench.store.atomic import write_json_atomic
from attnbench.store.env import collect_env, device_env, device_name
from attnbench.store.repro import MEASURE_OPTIONS, repro_command
from attnbench.store.results import done_keys, read_results
from attnbench.store.rundir import GRID_FILE, load_run, run_folder
from attnbench.store.schema import CASE_KEY

EXIT_OK, EXIT_REGRESSION, EXIT_USAGE = 0, 1, 2
COMMANDS = {  # command -> what it does, for attnbench --help
    "sweep": "sweep impls over a grid of cases: results.csv, samples.csv, env.json, a report",
    "race": "the kernel race: the race preset (a GPU grid) as a sweep",
    "list": "every impl, available or not: what it supports, where it came from, why not",
    "report": "regenerate a run's report from its results.csv and env.json",
    "compare": "run B against run A, per case; --fail-above PCT is a regression gate",
    "fidelity": "can the numbers be trusted: timer vs profiler, repeatability, backend labels",
    "repro": "print the one-row command that measures a row of a run again",
}
TOGGLES = {  # boolean options with a --no- flag: the help of the --no- flag
    "isolate": "run impls in this process",
    "group_by_device_name": "let a device of any kind continue a family started on another",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own errors: one line, exit 2
        raise UsageError(f"{message} (see {self.prog} --help)")


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


def _version() -> str:
    root = checkout.root()
    return f"attnbench {checkout.version()}" + (f" (checkout {root})" if root else "")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage(), file=sys.stdout if argv else sys.stderr)
        return EXIT_OK if argv else EXIT_USAGE
    if argv[0] in ("-V", "--version"):
        print(_version())
        return EXIT_OK
    command, rest = argv[0], argv[1:]
    try:
        if command not in COMMANDS:
            close = difflib.get_close_matches(command, COMMANDS, n=1)
            raise UsageError(
                f"unknown command {command!r}"
                + (f"; did you mean {close[0]!r}?" if close else "")
                + f" (commands: {', '.join(COMMANDS)})"
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
    for name, opt in OPTIONS.items():
        if name == "plugin":
            p.add_argument("--plugin", action="append", metavar="PATH", help=opt.help)
        elif name == "profile":
            p.add_argument("--profile", nargs="?", const="all", metavar="MATCH", help=opt.help)
        elif name in TOGGLES:
            p.add_argument(flag(name), dest=name, action="store_const", const="true", help=opt.help)
            p.add_argument(
                flag(name).replace("--", "--no-", 1),
                dest=name,
                action="store_const",
                const="false",
                help=TOGGLES[name],
            )
        elif name == "cuda_graph":
            p.add_argument("--cuda-graph", action="store_const", const="true", help=opt.help)
        elif name == "malloc_tunables":
            p.add_argument("--malloc-tunables", action="store_const", const="true", help=opt.help)
            p.add_argument(
                "--no-malloc-tunables",
                dest="malloc_tunables",
                action="store_const",
                const="false",
                help="leave glibc's allocator at its defaults (to measure their effect)",
            )
        else:
            p.add_argument(flag(name), dest=name, metavar=name.upper(), help=opt.help)
    p.add_argument("--run-id", help="name of the run folder (default: time-device-preset)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run --run-id: rows "
        "already in its results.csv are kept and not run again",
    )
    p.add_argument("--results-dir", default="results", type=Path)
    p.add_argument("--reports-dir", default="reports", type=Path)
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


def _device(text: str | None, local: bool = True) -> str:
    """The sweep's device; with ``local`` False (Ray) the GPUs may be on other machines."""
    if text is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not local and text.startswith("cuda:"):
        raise UsageError(
            f"--device {text}: with --executor ray give --device cuda (each actor owns one GPU)"
        )
    if local and text.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(
            f"--device {text}: no CUDA device is visible to torch "
            f"{torch.__version__}; use --device cpu"
        )
    return text


def triton_cache_dir() -> str:
    """Triton's default cache folder ($TRITON_HOME or ~, then .triton/cache), without
    importing triton."""
    home = os.environ.get("TRITON_HOME") or os.path.expanduser("~")
    return os.path.join(home, ".triton", "cache")


def _check_executor(opts: dict) -> str:
    executor = opts.get("executor", "local")
    if executor != "ray":
        for name in ("ray_address", "ray_actors"):
            if name in opts:
                raise UsageError(f"{flag(name)} needs --executor ray")
    elif opts.get("isolate") is False:
        raise UsageError("--no-isolate needs --executor local (Ray actors are always isolated)")
    return executor


def _select_impls(
    names: list[str] | None, impls: dict, spec: Spec, cases: list[Case]
) -> tuple[list, dict[str, str]]:
    """The impls to run, and those left out (name -> why). Named impls all run (their rows
    say what they cannot do); without names, the preset's impls (or every impl) that can run
    some case of the grid, so that no preset fills its rows with 'unsupported'."""
    if names is None:
        if spec.impls is not None:  # the preset's own
            pool = [impls[n] for n in spec.impls if n in impls]
            left_out = {n: "not registered here" for n in spec.impls if n not in impls}
        else:
            pool = [i for i in impls.values() if spec.compiled or not i.compiled]
            left_out = {
                i.name: "uses torch.compile (a compile per shape): name it in --impls"
                for i in impls.values()
                if i not in pool
            }
        selected = []
        for impl in pool:
            reasons = [impl.reasons(c) for c in cases]
            if all(reasons):
                left_out[impl.name] = "; ".join(reasons[0])
            else:
                selected.append(impl)
        return selected, left_out
    for name in names:
        if name not in impls:
            close = difflib.get_close_matches(name, list(impls), n=1)
            did = f"; did you mean {close[0]!r}?" if close else ""
            raise UsageError(
                f"--impls: unknown impl {name!r}{did} "
                f"(known: {', '.join(impls)}; see attnbench list)"
            )
    return [impls[n] for n in names], {}


def _left_out_text(left_out: dict[str, str]) -> str:
    lines = ["not run, as no --impls named them (name them to record their rows anyway):"]
    return "\n".join(lines + [f"  {name}: {why}" for name, why in left_out.items()])


def _plan_text(cases: list, selected: list, left_out: dict, device: str) -> str:
    shown = [f"  {c.label()}" for c in cases[:DRY_RUN_CASES]]
    more = len(cases) - len(shown)
    lines = [
        f"dry run: {len(cases)} cases x {len(selected)} impls = {len(cases) * len(selected)} "
        f"rows on {device} (nothing run, nothing written)",
        f"impls: {', '.join(i.name for i in selected)}",
        "cases:",
        *shown,
        *([f"  ... and {more} more"] if more > 0 else []),
    ]
    return "\n".join(lines + ([_left_out_text(left_out)] if left_out else []))


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


def _check_profile_filter(profile: tuple[str, ...] | None, impls: list, cases: list) -> None:
    """--profile with texts that no (impl, case) pair contains would profile nothing."""
    if not profile:
        return
    pairs = [f"{i.name} {c.label()}" for i in impls for c in cases]
    if not any(all(part in text for part in profile) for text in pairs):
        raise UsageError(
            f"--profile {','.join(profile)}: no (impl, case) pair contains all of "
            f"{list(profile)}; pairs look like {pairs[0]!r} (give parts of it, "
            f"comma separated, or 'all')"
        )


def sweep(argv: list[str], command: str = "sweep", default_preset: str | None = None) -> int:
    args = build_parser(command).parse_args(argv)
    if args.list_models:
        print(models_table())
        return EXIT_OK
    opts = resolve_options(args)
    executor = _check_executor(opts)
    device = _device(opts.get("device"), local=executor == "local" and not args.dry_run)
    if opts.get("cuda_graph") and not device.startswith("cuda"):
        raise UsageError(
            f"--cuda-graph replays CUDA graphs, but the device is {device}; use --device cuda "
            f"or leave --cuda-graph out"
        )
    plugins = opts.get("plugin", [])
    for text in plugins:
        registry.plugin_source(text)  # a missing plugin is bad input, before any work
    impls = registry.discover(plugins)
    if args.list:
        print(list_impls(impls, device.split(":")[0]))
        return EXIT_OK
    preset = opts.get("preset") or default_preset or ("gpu" if device.startswith("cuda") else "cpu")
    spec = Spec.from_preset(
        preset,
        device,
        **{
            k: opts.get(k)
            for k in (
                "batch",
                "heads",
                "kv_heads",
                "seq_len",
                "seq_len_kv",
                "head_dim",
                "dtype",
                "causal",
                "mode",
                "mask",
                "window",
                "level",
                "causal_align",
                "model",
                "phase",
                "docs",
                "sparsity",
            )
        },
        rep_ms=[opts["rep_ms"]] if "rep_ms" in opts else None,
    )
    if preset in GPU_PRESETS and device == "cpu" and "device" not in opts:
        what = f"the {preset} preset" if command != "sweep" else f"--preset {preset}"
        size = f"{len(spec.cases())} cases" + (f" x {len(spec.impls)} impls" if spec.impls else "")
        raise UsageError(
            f"{what} is a GPU grid ({size} of {'/'.join(spec.dtype)}, N up to "
            f"{max(spec.seq_len)}) and no CUDA device is visible to torch "
            f"{torch.__version__}; run it on a GPU, or add --device cpu to run it here anyway"
        )
    cases = spec.cases()
    selected, left_out = _select_impls(opts.get("impls"), impls, spec, cases)
    if not selected:
        raise UsageError(
            f"no impl can run any case of this grid on {device}; name impls with --impls "
            f"(see attnbench list)"
        )
    _check_profile_filter(opts.get("profile"), selected, cases)
    if args.dry_run:
        print(_plan_text(cases, selected, left_out, device))
        return EXIT_OK
    seed = opts.get("seed", 0)
    grid = {
        "preset": preset,
        "device": device,
        "seed": seed,
        "rep_ms": spec.rep_ms[0],
        "impls": [i.name for i in selected],
        "cases": [c.label() for c in cases],
    }
    _check_folders(("--results-dir", args.results_dir), ("--reports-dir", args.reports_dir))
    run_id, run_dir = run_folder(
        args.results_dir,
        args.run_id,
        resume=args.resume,
        grid=grid,
        default_id=f"{datetime.now():%Y%m%d-%H%M%S}-{device.split(':')[0]}-{preset}",
    )
    isolate = opts.get("isolate", True) or "timeout" in opts
    settings = Settings(
        timer=TimerConfig(rep_ms=spec.rep_ms[0], cuda_graph=opts.get("cuda_graph", False)),
        profile=opts.get("profile"),
        traces_dir=run_dir / "traces",
        malloc_tunables=opts.get("malloc_tunables", True),
    )
    dtypes, quick = sorted({c.dtype for c in cases}), spec.rep_ms[0] < 50
    compile_cache = tempfile.TemporaryDirectory(prefix="attnbench-inductor-")
    # torch.compile's cache private to this sweep (its workers inherit it): no kernel compiled
    # by another process, for other settings, can be picked up; an explicit setting wins
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", compile_cache.name)
    # inductor points an unset TRITON_CACHE_DIR into its own cache folder (the temporary one
    # above), and every Triton kernel compiled after that (triton_flash's, its autotuning
    # results) would be lost with it: Triton's own cache stays where Triton keeps it
    os.environ.setdefault("TRITON_CACHE_DIR", triton_cache_dir())
    if executor == "ray":  # before anything is written: a bad address is a usage error
        from attnbench.run import ray_executor

        started = time.perf_counter()
        executors = ray_executor.start(
            opts.get("ray_address"),
            plugins=[registry.plugin_source(p) for p in plugins],
            seed=seed,
            settings=settings,
            timeout_s=opts.get("timeout"),
            device=device,
            threads=opts.get("threads"),
            actors=opts.get("ray_actors"),
            command=command,
        )
        print(
            f"ray: {len(executors)} actor{'s' if len(executors) > 1 else ''} up in "
            f"{time.perf_counter() - started:.1f} s "
            f"({', '.join(sorted({f'{e.device_name}@{e.host}' for e in executors}))})"
        )
    if "threads" in opts and executor == "local":
        torch.set_num_threads(opts["threads"])
    done = done_keys(run_dir) if args.resume else set()
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / GRID_FILE, grid)
    print(
        f"{len(cases)} cases x {len(selected)} impls on {device} -> {run_dir}"
        + (f" ({len(done)} rows already done)" if done else "")
    )
    if left_out:
        print(_left_out_text(left_out))
    _warn_if_busy(device)
    env = collect_env(["attnbench", command, *argv], seed, device)
    env["impls"] = {
        i.name: {"source": i.source, "baseline": i.baseline, "color": i.color} for i in selected
    }
    env["baseline"] = registry.baseline(selected)
    env["options"] = {k: as_text(opts[k]) for k in MEASURE_OPTIONS if k in opts}  # repro
    env["not_run"] = left_out
    env["profile"] = None if opts.get("profile") is None else list(opts["profile"])
    env["malloc"] = allocator.describe(settings.malloc_tunables, isolate)
    if executor == "ray":  # each actor measures its own device; the driver's is one of them
        env["devices"] = ray_executor.measure_devices(executors, dtypes, device, quick)
        here = env["devices"].get(device_name(device)) or next(iter(env["devices"].values()))
        env["ceilings"] = here["ceilings"]
    else:
        env["ceilings"] = ceilings.measure(dtypes, device, quick=quick)
        here = device_env(device)
        env["devices"] = {
            here.pop("device_name"): {
                "hosts": [here.pop("host")],
                "actors": 1,
                **here,
                "ceilings": env["ceilings"],
            }
        }
        settings = replace(
            settings,
            matmul_tflops=env["ceilings"]["matmul_tflops"],
            copy_gb_s=env["ceilings"]["copy_gb_s"],
            ceilings_contended=env["ceilings"]["contended"],
        )
        executors = [
            Subprocess(plugins, seed, settings, opts.get("timeout"), opts.get("threads"))
            if isolate
            else InProcess(seed, settings)
        ]
    env_name = "env.json" if not args.resume else f"env-resume-{datetime.now():%H%M%S}.json"
    write_json_atomic(run_dir / env_name, env)
    try:
        run_sweep(
            cases,
            selected,
            run_dir,
            executors,
            run_id=run_id,
            seed=seed,
            done=done,
            progress=not (args.no_progress or args.row_lines),
            row_lines=args.row_lines,
            group_by_device_name=opts.get("group_by_device_name", True),
        )
    except KeyboardInterrupt:
        print(
            f"\ninterrupted; every finished row is in {run_dir / 'results.csv'}. Continue "
            f"with: attnbench {command} {' '.join(argv)} --resume"
            + ("" if args.run_id else f" --run-id {run_id}"),
            file=sys.stderr,
        )
        return 130
    finally:
        for ex in executors:
            ex.close()
        if executor == "ray":
            ray_executor.shutdown()
        compile_cache.cleanup()
    print(summary_table(read_results(run_dir), [i.name for i in selected]))
    if args.no_report:
        print(f"\nresults: {run_dir / 'results.csv'}")
        return EXIT_OK
    from attnbench.report.report import write_report  # matplotlib: only once there are rows

    report_path = write_report(run_dir, args.reports_dir)
    print(f"\nresults: {run_dir / 'results.csv'}\nreport:  {report_path}")
    return EXIT_OK


def race(argv: list[str]) -> int:
    """The kernel race: the ``race`` preset (fixed tokens and hidden size) as a sweep."""
    return sweep(argv, command="race", default_preset="race")


def list_command(argv: list[str]) -> int:
    p = _Parser(
        prog="attnbench list",
        description="List every impl: where it runs, what it supports, and why it is unavailable.",
    )
    p.add_argument(
        "--plugin", action="append", default=[], metavar="PATH", help=OPTIONS["plugin"].help
    )
    p.add_argument("--device", default=None, help=OPTIONS["device"].help)
    args = p.parse_args(argv)
    plugins = [x for text in args.plugin for x in parse_value("plugin", text, "--plugin")]
    for text in plugins:
        registry.plugin_source(text)
    # what runs on a device is a question worth asking on a machine without one
    device = (
        _device(None) if args.device is None else parse_value("device", args.device, "--device")
    )
    print(list_impls(registry.discover(plugins), device.split(":")[0]))
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
        default=None,
        help="impl the speedups are relative to "
        "(default: the impl the run recorded as its baseline)",
    )
    p.add_argument("--svg", action="store_true", help="also write each figure as SVG")
    args = p.parse_args(argv)
    df, _ = load_run(args.run_dir)
    impls = sorted(df["impl"].dropna().unique())
    if args.baseline is not None and args.baseline not in impls:
        raise UsageError(
            f"--baseline {args.baseline!r} is not an impl of this run; pick one "
            f"of: {', '.join(impls) or '(no rows)'}"
        )
    _check_folders(("--reports-dir", args.reports_dir))
    from attnbench.report.report import write_report  # matplotlib: only once input is valid

    print(write_report(args.run_dir, args.reports_dir, baseline=args.baseline, svg=args.svg))
    return EXIT_OK


def _load_runs(run_a: Path, run_b: Path) -> list[tuple[str, pd.DataFrame, dict]]:
    """(name, results, env) of runs A and B; a bad folder is a usage error naming which."""
    runs = []
    for label, path in (("A", run_a), ("B", run_b)):
        try:
            df, env = load_run(path)
        except UsageError as exc:
            raise UsageError(f"run {label}: {exc}") from None
        runs.append((path.resolve().name, df, env))
    return runs


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
        default=None,
        help="folder for fidelity.csv and fidelity.txt (default: reports/fidelity/<A>_vs_<B>)",
    )
    args = p.parse_args(argv)
    from attnbench.report.fidelity import check_runs, write_fidelity

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
    args = p.parse_args(argv)
    df, env = load_run(args.run_dir)
    if not 0 <= args.row < len(df):
        raise UsageError(
            f"row {args.row}: {args.run_dir / 'results.csv'} has rows 0 to {len(df) - 1}"
            if len(df)
            else f"row {args.row}: {args.run_dir / 'results.csv'} has no rows"
        )
    try:
        grid = json.loads((args.run_dir / GRID_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        grid = {}  # the preset and rep_ms then come from the defaults
    print(repro_command(df.iloc[args.row], env, grid))
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
        default=None,
        metavar="PCT",
        help="exit 1 when any case ok in both is more than PCT%% slower in B, "
        "or ok in A and not ok in B, or no case is ok in both (nothing compared)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for compare.md, "
        "compare.csv and ratio_vs_seq.png (default: reports/compare/<A>_vs_<B>)",
    )
    args = p.parse_args(argv)
    runs = _load_runs(args.run_a, args.run_b)
    out = args.out or Path("reports") / "compare" / f"{runs[0][0]}_vs_{runs[1][0]}"
    _check_folders(("--out", out))
    from attnbench.report.compare import gate_fails, summary_lines, write_compare

    cmp, path = write_compare(runs[0], runs[1], out, args.fail_above)
    for line in summary_lines(cmp, args.fail_above):
        print(line)
    print(path)
    if args.fail_above is not None and gate_fails(cmp, args.fail_above):
        return EXIT_REGRESSION
    return EXIT_OK


LIST_WIDTH = 100  # attnbench list: lines no wider than this
DRY_RUN_CASES = 10  # --dry-run names this many cases, then counts the rest


def _compact(values, every=(), short=None) -> str:
    """A capability list in a few characters: 'all' when it is every allowed value, else
    the values (abbreviated by ``short``), an evenly spaced run of numbers as 'a-b/step' and
    a doubling one as 'a-b/x2'."""
    values = list(values)
    if every and set(values) >= set(every):
        return "all"
    if len(values) > 3 and all(isinstance(v, int) and v > 0 for v in values):
        steps = {b - a for a, b in zip(values, values[1:])}
        if len(steps) == 1:
            return f"{values[0]}-{values[-1]}/{steps.pop()}"
        if all(b == 2 * a for a, b in zip(values, values[1:])):
            return f"{values[0]}-{values[-1]}/x2"
    return ",".join((short or {}).get(v, str(v)) for v in values)


def list_impls(impls: dict, device: str) -> str:
    """Every impl on one line each (what it supports, where it came from), then a note per
    impl (what it is; why it cannot run here), every line within LIST_WIDTH characters."""
    import textwrap

    from attnbench.case import DEVICES, DTYPES
    from attnbench.masks import MASKS

    dtypes = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
    # mask names in the table, as the legend spells them out
    MASK_SHORT = {"padding": "pad", "window": "win", "document": "doc", "block_sparse": "bsp"}
    rows, notes = [], []
    for impl in impls.values():
        here = impl.available and device in impl.devices
        rows.append(
            {
                "impl": impl.name,
                "here": "yes" if here else "no",
                "dev": _compact(impl.devices, DEVICES),
                "dtypes": _compact(impl.dtypes, DTYPES, dtypes),
                "head_dims": "any" if impl.head_dims is None else _compact(impl.head_dims),
                "c/x/g/b": "/".join(
                    "y" if f else "n" for f in (impl.causal, impl.cross, impl.gqa, impl.backward)
                ),
                "masks": _compact(impl.masks, MASKS, MASK_SHORT),
                "br": "y" if "bottom_right" in impl.causal_align else "n",
                "pg": "y" if impl.paged else "n",
                "from": registry.origin(impl),
            }
        )
        why = impl.unavailable or ("" if here else f"not on {device}")
        where = "" if registry.origin(impl) == "built-in" else f" [{impl.source}]"
        text = "; ".join(t for t in (why, impl.description) if t) + where
        notes.append(
            textwrap.fill(
                f"{impl.name}: {text or '(no description)'}",
                width=LIST_WIDTH,
                subsequent_indent="    ",
                break_on_hyphens=False,
            )
        )
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in rows[0]} if rows else {}
    table = "\n".join(
        " ".join(str(r[c]).ljust(w) for c, w in widths.items()).rstrip()
        for r in [dict(zip(widths, widths)), *rows]
    )
    legend = textwrap.fill(
        "here: runs on this device; dev: devices (all: cpu and cuda); c/x/g/b: causal / cross "
        "(seq_q != seq_kv) / GQA / "
        "backward; masks: pad(ding), win(dow), doc(ument), bsp = block_sparse; br: bottom-right "
        "causal; pg: takes a paged KV cache; from: built-in (attnbench.impls), impls/ (the "
        "checkout's drop-in folder), --plugin, entry point",
        width=LIST_WIDTH,
        break_on_hyphens=False,
    )
    return "\n".join([table, "", legend, "", *notes])


def summary_table(df: pd.DataFrame, impls: list[str] | None = None) -> str:
    """Median ms per case (rows) and impl (columns) over the whole run (a resumed run too);
    a status word where there is no time, '!' after a time whose output disagrees with the
    reference. Impls that are unsupported in every case are named below, not tabulated."""
    if df.empty:
        return "no rows were run"

    def cell(r):
        if r["status"] != "ok":
            return r["status"]
        return f"{r['time_ms']:.3g}" + ("" if r["agrees"] is not False else " !")

    rows = df.drop_duplicates([c for c in CASE_KEY if c in df], keep="last")
    cells = pd.DataFrame(
        {
            "case": [Case.from_row(r).label() for _, r in rows.iterrows()],
            "impl": rows["impl"].to_numpy(),
            "cell": [cell(r) for _, r in rows.iterrows()],
        }
    )
    table = cells.pivot(index="case", columns="impl", values="cell").fillna("")
    order = [i for i in (impls or []) if i in table.columns] or list(dict.fromkeys(cells["impl"]))
    table = table.loc[list(dict.fromkeys(cells["case"])), order]
    never = [c for c in table.columns if (table[c] == "unsupported").all()]
    text = "time_ms (median; '!' = disagrees with the reference)\n"
    text += table.drop(columns=never).to_string() if len(never) < len(order) else ""
    if never:
        text += f"\nunsupported in every case (reasons in the report): {', '.join(never)}"
    return text


def _warn_if_busy(device: str) -> None:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if device == "cpu" and load > 0.5 * (os.cpu_count() or 1):
        print(
            f"warning: load average {load:.1f} on {os.cpu_count()} cores; other processes "
            f"will disturb CPU timings (see --threads)",
            file=sys.stderr,
        )
