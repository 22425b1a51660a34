"""The reproducer of a row: the one-row ``attnbench sweep`` command that measures it again.

Everything comes from the run folder: the case from the row's key columns, the seed and
whether it was timed by CUDA-graph replay from the row, the preset and timing budget from
grid.json, the plugins (plugins.py: the run's, as env.json records them, or the
``--plugin`` files given in their place), and the options that change how rows are measured
(threads, timeout, worker isolation, the allocator's tunables) from env.json's ``options``.
"""

from __future__ import annotations

import shlex

from attnbench.case import Case
from attnbench.dims import DIMS
from attnbench.options import MEASURE_OPTIONS, OPTIONS, flag


def case_flags(case: Case) -> list[str]:
    """The sweep flags that select exactly ``case``: each dimension's own (dims.py)."""
    return [text for dim in DIMS for text in dim.flags(case)]


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


def repro_argv(row, env: dict, grid: dict, plugins: list[str]) -> list[str]:
    """The command (argv, starting with ``attnbench``) that measures ``row`` again alone, with
    ``plugins`` (--plugin values: the files and modules its impl, mask kind or modifier come
    from)."""
    case = Case.from_row(row)
    impl = str(row["impl"])
    argv = ["attnbench", "sweep"]
    if grid.get("preset"):
        argv += ["--preset", str(grid["preset"])]
    argv += ["--device", case.device, "--impls", impl]
    argv += [text for plugin in plugins for text in ("--plugin", plugin)]
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


def repro_command(row, env: dict, grid: dict, plugins: list[str]) -> str:
    return shlex.join(repro_argv(row, env, grid, plugins))
