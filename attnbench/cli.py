"""``python scripts/sweep.py``: flags -> spec -> sweep -> CSV, env.json and a summary.

Every flag is checked before any work starts; a bad one gets one line on stderr naming the
value and what is allowed, exit code 2, and nothing written.
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from datetime import datetime
from pathlib import Path

import pandas as pd
import torch

from attnbench import registry
from attnbench.case import CaseError, canonical_dtype
from attnbench.results import collect_env, write_json_atomic
from attnbench.spec import PRESETS, Spec
from attnbench.sweep import run_sweep
from attnbench.timing import TimerConfig

RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class UsageError(Exception):
    """Bad input: printed as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own errors: one line, exit 2
        raise UsageError(message)


def _list(flag: str, cast):
    def parse(text: str):
        items = text.split(",")
        if any(not item.strip() for item in items):
            raise UsageError(f"{flag} {text!r}: empty item in the comma-separated list")
        try:
            return [cast(item.strip()) for item in items]
        except (ValueError, CaseError) as exc:
            raise UsageError(f"{flag} {text!r}: {exc}") from None
    return parse


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise ValueError(f"{value} must be a positive integer")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not value > 0:
        raise ValueError(f"{value} must be positive")
    return value


def _bool(text: str) -> list[bool]:
    table = {"true": [True], "false": [False], "both": [False, True]}
    if text.lower() not in table:
        raise ValueError(f"{text!r} is not one of true, false, both")
    return table[text.lower()]


def _causal(text: str) -> list[bool]:
    values = [v for part in _list("--causal", _bool)(text) for v in part]
    return list(dict.fromkeys(values))


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="sweep.py", description="Sweep attention impls over a grid of cases and "
                "write <results-dir>/<run-id>/results.csv, samples.csv and env.json.")
    p.add_argument("--preset", help=f"base grid: {', '.join(PRESETS)} "
                   "(default: gpu with CUDA, else cpu); the flags below override its fields")
    p.add_argument("--impls", type=_list("--impls", str), help="comma list (default: all)")
    p.add_argument("--batch", type=_list("--batch", _positive_int))
    p.add_argument("--heads", type=_list("--heads", _positive_int), help="query heads")
    p.add_argument("--kv-heads", type=_list("--kv-heads", _positive_int),
                   help="key/value heads (default: = heads); fewer is GQA/MQA")
    p.add_argument("--seq-len", type=_list("--seq-len", _positive_int), help="query length")
    p.add_argument("--seq-len-kv", type=_list("--seq-len-kv", _positive_int),
                   help="key/value length (default: = seq-len)")
    p.add_argument("--head-dim", type=_list("--head-dim", _positive_int))
    p.add_argument("--dtype", type=_list("--dtype", canonical_dtype),
                   help="float32, bfloat16, float16 (fp32, bf16, fp16 accepted)")
    p.add_argument("--causal", type=_causal, help="true, false or both")
    p.add_argument("--mode", type=_list("--mode", _mode), help="fwd, bwd, fwd_bwd")
    p.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    p.add_argument("--plugin", action="append", default=[], metavar="PATH",
                   help="a .py file or module registering impls (repeatable)")
    p.add_argument("--run-id", help="name of the run folder (default: time-device-preset)")
    p.add_argument("--results-dir", default="results", type=Path)
    p.add_argument("--reports-dir", default="reports", type=Path)
    p.add_argument("--rep-ms", type=_list("--rep-ms", _positive_float), metavar="MS",
                   help="time spent measuring each row (default 100; smoke preset 10)")
    p.add_argument("--threads", type=_positive_int, help="CPU threads torch may use "
                   "(default: torch's own choice)")
    p.add_argument("--seed", default=0, type=int, help="seed of the inputs (default 0)")
    p.add_argument("--list", action="store_true", help="list every impl and exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _mode(text: str) -> str:
    from attnbench.case import MODES
    if text not in MODES:
        raise ValueError(f"unknown mode {text!r} (allowed: {', '.join(MODES)})")
    return text


def _device(arg: str | None) -> str:
    if arg is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if arg.split(":")[0] not in ("cpu", "cuda"):
        raise UsageError(f"--device {arg!r}: unknown device (allowed: cpu, cuda)")
    if arg.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {arg}: no CUDA device is visible to torch "
                         f"{torch.__version__}; use --device cpu")
    return arg


def _did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _select_impls(names: list[str] | None, impls: dict) -> list:
    if names is None:
        return list(impls.values())
    for name in names:
        if name not in impls:
            raise UsageError(f"--impls: unknown impl {name!r}{_did_you_mean(name, impls)} "
                             f"(known: {', '.join(impls)}; see --list)")
    return [impls[n] for n in dict.fromkeys(names)]


def _run_dir(results_dir: Path, run_id: str | None, device: str, preset: str) -> tuple[str, Path]:
    if results_dir.exists() and not results_dir.is_dir():
        raise UsageError(f"--results-dir {results_dir}: is a file, not a folder")
    run_id = run_id or f"{datetime.now():%Y%m%d-%H%M%S}-{device.split(':')[0]}-{preset}"
    if not RUN_ID.match(run_id):
        raise UsageError(f"--run-id {run_id!r}: use letters, digits, '.', '_' and '-' only "
                         f"(no path separators)")
    run_dir = results_dir / run_id
    if (run_dir / "results.csv").exists():
        raise UsageError(f"--run-id {run_id}: {run_dir} already holds results; pick another "
                         f"--run-id")
    return run_id, run_dir


def list_impls(impls: dict, device: str) -> str:
    rows = []
    for impl in impls.values():
        rows.append({
            "impl": impl.name,
            "available": "yes" if impl.available else "no",
            "devices": ",".join(impl.devices),
            "dtypes": ",".join(d.replace("float", "f").replace("bf", "bf") for d in impl.dtypes),
            "head_dims": "any" if impl.head_dims is None else ",".join(map(str, impl.head_dims)),
            "causal/cross/gqa/bwd": "/".join("y" if f else "n" for f in
                                             (impl.causal, impl.cross, impl.gqa, impl.backward)),
            "source": impl.source,
            "note": impl.unavailable or ("" if device in impl.devices
                                         else f"not on {device}") or impl.description,
        })
    return pd.DataFrame(rows).to_string(index=False)


def summary_table(rows: list[dict]) -> str:
    """Median ms per case (rows) and impl (columns); a status word where there is no time,
    '!' after a time whose output disagrees with the reference."""
    def cell(r):
        if r["status"] != "ok":
            return r["status"]
        return f"{r['time_ms']:.3g}" + ("" if r["agrees"] in (True, None) else " !")
    df = pd.DataFrame(rows)
    df["case"] = [f"{r['mode']} {r['dtype']} {'causal' if r['causal'] else 'full'} "
                  f"B{r['batch']} H{r['heads']}/{r['kv_heads']} "
                  f"S{r['seq_q']}x{r['seq_kv']} D{r['head_dim']}" for r in rows]
    df["cell"] = [cell(r) for r in rows]
    table = df.pivot(index="case", columns="impl", values="cell")
    table = table.loc[list(dict.fromkeys(df["case"])), list(dict.fromkeys(df["impl"]))]
    return "time_ms (median; '!' = disagrees with the reference)\n" + table.to_string()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser().parse_args(argv)
        device = _device(args.device)
        for spec_text in args.plugin:
            registry.plugin_source(spec_text)  # a missing plugin is bad input, before work
        impls = registry.discover(args.plugin)
        if args.list:
            print(list_impls(impls, device.split(":")[0]))
            return 0
        preset = args.preset or ("gpu" if device.startswith("cuda") else "cpu")
        spec = Spec.from_preset(preset, device, batch=args.batch, heads=args.heads,
                                kv_heads=args.kv_heads, seq_len=args.seq_len,
                                seq_len_kv=args.seq_len_kv, head_dim=args.head_dim,
                                dtype=args.dtype, causal=args.causal, mode=args.mode,
                                rep_ms=args.rep_ms)
        cases = spec.cases()
        selected = _select_impls(args.impls, impls)
        run_id, run_dir = _run_dir(args.results_dir, args.run_id, device, preset)
    except (UsageError, CaseError, registry.RegistryError) as exc:
        msg = str(exc)
        if isinstance(exc, CaseError) and "preset" in msg:
            msg += _did_you_mean(args.preset, PRESETS)
        print(f"sweep.py: error: {msg}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / "env.json", collect_env(["scripts/sweep.py", *argv],
                                                        args.seed, device))
    print(f"{len(cases)} cases x {len(selected)} impls on {device} -> {run_dir}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if device == "cpu" and load > 0.5 * (os.cpu_count() or 1):
        print(f"warning: load average {load:.1f} on {os.cpu_count()} cores; other processes "
              f"will disturb CPU timings (see --threads)", file=sys.stderr)
    rows = run_sweep(cases, selected, run_dir, run_id=run_id, seed=args.seed,
                     timer=TimerConfig(rep_ms=spec.rep_ms[0]), progress=not args.no_progress)
    print(summary_table(rows))
    print(f"\nresults: {run_dir / 'results.csv'}")
    return 0
