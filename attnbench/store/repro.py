"""The reproducer of a row: the one-row ``attnbench sweep`` command that measures it again.

Everything comes from the run folder: the case from the row's key columns, the seed and
whether it was timed by CUDA-graph replay from the row, the preset and timing budget from
grid.json, the plugin that registered the impl from env.json's ``impls`` (its source file or
module), and the options that change how rows are measured (threads, timeout, worker
isolation, the allocator's tunables) from env.json's ``options``.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from attnbench.case import Case
from attnbench.dims import DIMS
from attnbench.options import MEASURE_OPTIONS, OPTIONS, flag

BUILTIN_PREFIX = "attnbench.impls."


def case_flags(case: Case) -> list[str]:
    """The sweep flags that select exactly ``case``: each dimension's own (dims.py)."""
    return [text for dim in DIMS for text in dim.flags(case)]


def plugin_flags(source: str | None) -> list[str]:
    """--plugin for an impl that a file or a module registered (built-ins and entry points
    load by themselves)."""
    if not source or source.startswith(BUILTIN_PREFIX) or source.startswith("entry point "):
        return []
    if source.startswith("module "):
        return ["--plugin", source.removeprefix("module ")]
    return ["--plugin", str(Path(source))]


def measure_flags(options: dict) -> list[str]:
    """The run's options that change how a row is measured (options.py scope ``measure``, as
    env.json keeps them), as flags: a toggle only when it was switched off."""
    flags = []
    for name in MEASURE_OPTIONS:
        value = options.get(name)
        if value is None:
            continue
        if OPTIONS[name].style != "toggle":
            flags += [flag(name), str(value)]
        elif str(value).lower() == "false":
            flags.append(flag(name).replace("--", "--no-", 1))
    return flags


def repro_argv(row, env: dict, grid: dict) -> list[str]:
    """The command (argv, starting with ``attnbench``) that measures ``row`` again alone."""
    case = Case.from_row(row)
    impl = str(row["impl"])
    argv = ["attnbench", "sweep"]
    if grid.get("preset"):
        argv += ["--preset", str(grid["preset"])]
    argv += ["--device", case.device, "--impls", impl]
    argv += plugin_flags((env.get("impls") or {}).get(impl, {}).get("source"))
    argv += case_flags(case)
    seed = row["seed"] if "seed" in row and str(row["seed"]) not in ("", "<NA>") else None
    seed = grid.get("seed", 0) if seed is None else seed
    argv += ["--seed", str(int(seed))]
    if grid.get("rep_ms") is not None:
        argv += ["--rep-ms", f"{float(grid['rep_ms']):g}"]
    argv += measure_flags(env.get("options") or {})
    if "cuda_graph" in row and str(row["cuda_graph"]) == "True":
        argv.append("--cuda-graph")
    return argv


def repro_command(row, env: dict, grid: dict) -> str:
    return shlex.join(repro_argv(row, env, grid))
