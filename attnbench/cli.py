"""``python scripts/sweep.py``: options -> spec -> sweep -> CSV, env.json and a summary.

Every option (flag or sweep-file field) is checked before any work starts; a bad one gets one
line on stderr naming the value and what is allowed, exit code 2, and nothing written.
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import sys
from datetime import datetime
from pathlib import Path

import pandas as pd
import torch

from attnbench import ceilings, registry
from attnbench.case import CaseError
from attnbench.options import OPTIONS, UsageError, flag, load_config, parse_value
from attnbench.report import write_report
from attnbench.results import collect_env, done_keys, write_json_atomic
from attnbench.spec import Spec
from attnbench.sweep import Settings, run_sweep
from attnbench.timing import TimerConfig

RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
GRID_FILE = "grid.json"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own errors: one line, exit 2
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="sweep.py", description="Sweep attention impls over a grid of cases and "
                "write <results-dir>/<run-id>/results.csv, samples.csv and env.json.")
    p.add_argument("--config", type=Path, metavar="FILE.toml",
                   help="sweep file: TOML whose keys are the options below (flags win)")
    for name, opt in OPTIONS.items():
        if name == "plugin":
            p.add_argument("--plugin", action="append", metavar="PATH", help=opt.help)
        elif name == "profile":
            p.add_argument("--profile", nargs="?", const="all", metavar="MATCH", help=opt.help)
        elif name == "isolate":
            p.add_argument("--isolate", action="store_const", const="true", help=opt.help)
            p.add_argument("--no-isolate", dest="isolate", action="store_const",
                           const="false", help="run impls in this process")
        else:
            p.add_argument(flag(name), dest=name, metavar=name.upper(), help=opt.help)
    p.add_argument("--run-id", help="name of the run folder (default: time-device-preset)")
    p.add_argument("--resume", action="store_true", help="continue the run --run-id: rows "
                   "already in its results.csv are kept and not run again")
    p.add_argument("--results-dir", default="results", type=Path)
    p.add_argument("--reports-dir", default="reports", type=Path)
    p.add_argument("--list", action="store_true", help="list every impl and exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
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


def _device(text: str | None) -> str:
    if text is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if text.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {text}: no CUDA device is visible to torch "
                         f"{torch.__version__}; use --device cpu")
    return text


def _select_impls(names: list[str] | None, impls: dict, compiled: bool) -> list:
    if names is None:
        return [i for i in impls.values() if compiled or not i.compiled]
    for name in names:
        if name not in impls:
            close = difflib.get_close_matches(name, list(impls), n=1)
            did = f"; did you mean {close[0]!r}?" if close else ""
            raise UsageError(f"--impls: unknown impl {name!r}{did} "
                             f"(known: {', '.join(impls)}; see --list)")
    return [impls[n] for n in names]


def _run_dir(args, device: str, preset: str, grid: dict) -> tuple[str, Path]:
    results_dir = args.results_dir
    for name, folder in (("--results-dir", results_dir), ("--reports-dir", args.reports_dir)):
        if folder.exists() and not folder.is_dir():
            raise UsageError(f"{name} {folder}: is a file, not a folder")
    if args.resume and not args.run_id:
        raise UsageError("--resume needs the --run-id of the run to continue")
    run_id = args.run_id or f"{datetime.now():%Y%m%d-%H%M%S}-{device.split(':')[0]}-{preset}"
    if not RUN_ID.match(run_id):
        raise UsageError(f"--run-id {run_id!r}: use letters, digits, '.', '_' and '-' only "
                         f"(no path separators)")
    run_dir = results_dir / run_id
    started = (run_dir / "results.csv").exists()
    if started and not args.resume:
        raise UsageError(f"--run-id {run_id}: {run_dir} already holds results; add --resume "
                         f"to continue it, or pick another --run-id")
    if args.resume and not started:
        raise UsageError(f"--resume: {run_dir} holds no results.csv to continue; check "
                         f"--run-id and --results-dir")
    if args.resume:
        _check_same_grid(run_dir, grid)
    return run_id, run_dir


def _check_same_grid(run_dir: Path, grid: dict) -> None:
    try:
        old = json.loads((run_dir / GRID_FILE).read_text())
    except (OSError, ValueError):
        raise UsageError(f"--resume: {run_dir / GRID_FILE} is missing or unreadable, so the "
                         f"grid cannot be checked; start a new --run-id") from None
    for key in sorted(set(old) | set(grid)):
        if old.get(key) != grid.get(key):
            raise UsageError(f"--resume: the run used {key}={old.get(key)} but now "
                             f"{key}={grid.get(key)}; resume with the same options or start "
                             f"a new --run-id")


def list_impls(impls: dict, device: str) -> str:
    rows = [{
        "impl": impl.name,
        "available": "yes" if impl.available else "no",
        "devices": ",".join(impl.devices),
        "dtypes": ",".join(impl.dtypes),
        "head_dims": "any" if impl.head_dims is None else ",".join(map(str, impl.head_dims)),
        "causal/cross/gqa/bwd": "/".join("y" if f else "n" for f in
                                         (impl.causal, impl.cross, impl.gqa, impl.backward)),
        "masks": ",".join(impl.masks),
        "source": impl.source,
        "note": impl.unavailable or ("" if device in impl.devices
                                     else f"not on {device}; ") + impl.description,
    } for impl in impls.values()]
    return pd.DataFrame(rows).to_string(index=False)


def summary_table(rows: list[dict]) -> str:
    """Median ms per case (rows) and impl (columns); a status word where there is no time,
    '!' after a time whose output disagrees with the reference."""
    if not rows:
        return "no rows were run"
    def cell(r):
        if r["status"] != "ok":
            return r["status"]
        return f"{r['time_ms']:.3g}" + ("" if r["agrees"] in (True, None) else " !")
    df = pd.DataFrame(rows)
    df["case"] = [f"{r['mode']} {r['dtype']} {'causal' if r['causal'] else 'full'}"
                  f"{'' if r['mask'] == 'none' else ' ' + r['mask']}"
                  f"{'' if r['window'] is None else r['window']}"
                  f"{' layer' if r['level'] == 'layer' else ''} "
                  f"B{r['batch']} H{r['heads']}/{r['kv_heads']} "
                  f"S{r['seq_q']}x{r['seq_kv']} D{r['head_dim']}" for r in rows]
    df["cell"] = [cell(r) for r in rows]
    table = df.pivot(index="case", columns="impl", values="cell").fillna("")
    table = table.loc[list(dict.fromkeys(df["case"])), list(dict.fromkeys(df["impl"]))]
    return "time_ms (median; '!' = disagrees with the reference)\n" + table.to_string()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser().parse_args(argv)
        opts = resolve_options(args)
        device = _device(opts.get("device"))
        plugins = opts.get("plugin", [])
        for text in plugins:
            registry.plugin_source(text)  # a missing plugin is bad input, before any work
        impls = registry.discover(plugins)
        if args.list:
            print(list_impls(impls, device.split(":")[0]))
            return 0
        preset = opts.get("preset") or ("gpu" if device.startswith("cuda") else "cpu")
        spec = Spec.from_preset(preset, device, **{k: opts.get(k) for k in (
            "batch", "heads", "kv_heads", "seq_len", "seq_len_kv", "head_dim", "dtype",
            "causal", "mode", "mask", "window", "level")},
            rep_ms=[opts["rep_ms"]] if "rep_ms" in opts else None)
        cases = spec.cases()
        selected = _select_impls(opts.get("impls"), impls, spec.compiled)
        seed = opts.get("seed", 0)
        grid = {"preset": preset, "device": device, "seed": seed, "rep_ms": spec.rep_ms[0],
                "impls": [i.name for i in selected], "cases": [c.label() for c in cases]}
        run_id, run_dir = _run_dir(args, device, preset, grid)
    except (UsageError, CaseError, registry.RegistryError) as exc:
        print(f"sweep.py: error: {exc}", file=sys.stderr)
        return 2
    isolate = opts.get("isolate", device.startswith("cuda")) or "timeout" in opts
    if "threads" in opts:
        torch.set_num_threads(opts["threads"])
    done = done_keys(run_dir) if args.resume else set()
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / GRID_FILE, grid)
    print(f"{len(cases)} cases x {len(selected)} impls on {device} -> {run_dir}"
          + (f" ({len(done)} rows already done)" if done else ""))
    _warn_if_busy(device)
    env = collect_env(["scripts/sweep.py", *argv], seed, device)
    env["ceilings"] = ceilings.measure(sorted({c.dtype for c in cases}), device,
                                       quick=spec.rep_ms[0] < 50)
    env_name = "env.json" if not args.resume else f"env-resume-{datetime.now():%H%M%S}.json"
    write_json_atomic(run_dir / env_name, env)
    settings = Settings(timer=TimerConfig(rep_ms=spec.rep_ms[0]),
                        matmul_tflops=env["ceilings"]["matmul_tflops"],
                        profile=opts.get("profile"), traces_dir=run_dir / "traces")
    try:
        rows = run_sweep(cases, selected, run_dir, run_id=run_id, seed=seed,
                         settings=settings, isolate=isolate, timeout_s=opts.get("timeout"),
                         plugins=plugins, done=done, progress=not args.no_progress)
    except KeyboardInterrupt:
        print(f"\ninterrupted; every finished row is in {run_dir / 'results.csv'}. Continue "
              f"with: python scripts/sweep.py {' '.join(argv)} --resume"
              + ("" if args.run_id else f" --run-id {run_id}"), file=sys.stderr)
        return 130
    print(summary_table(rows))
    report = write_report(run_dir, args.reports_dir)
    print(f"\nresults: {run_dir / 'results.csv'}\nreport:  {report}")
    return 0


def _warn_if_busy(device: str) -> None:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if device == "cpu" and load > 0.5 * (os.cpu_count() or 1):
        print(f"warning: load average {load:.1f} on {os.cpu_count()} cores; other processes "
              f"will disturb CPU timings (see --threads)", file=sys.stderr)
