"""The run folder: its id and path, grid.json (what it sweeps, checked on resume), the draws
file (what each case drew from the seed) and the errors log (failed rows' full errors), and
loading results.csv + env.json for reporting, with errors that say how to fix the input."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pandas as pd

from attnbench.errors import UsageError
from attnbench.store.results import read_results
from attnbench.store.schema import CASE_KEY


class RunError(UsageError):
    """The run folder cannot be reported on; the message says how to fix it."""


def load_run(run_dir: Path) -> tuple[pd.DataFrame, dict]:
    """results.csv as a typed frame and env.json (empty dict when absent), or RunError."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunError(
            f"run folder {run_dir} does not exist; pass a folder written by a "
            f"sweep, e.g. results/<run-id>"
        )
    csv = run_dir / "results.csv"
    if not csv.is_file():
        raise RunError(f"{csv} not found; pass the folder of a sweep run that wrote results.csv")
    try:
        df = read_results(csv)
    except (ValueError, TypeError, pd.errors.ParserError) as exc:
        raise RunError(
            f"{csv} cannot be read as attnbench results ({exc}); regenerate it with a sweep"
        ) from exc
    missing = [c for c in (*CASE_KEY, "status") if c not in df.columns]
    if missing:
        raise RunError(
            f"{csv} lacks columns {', '.join(missing)}; it was not written by "
            f"attnbench.store.results (regenerate it with a sweep)"
        )
    env_path = run_dir / "env.json"
    env = {}
    if env_path.is_file():
        try:
            env = json.loads(env_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise RunError(
                f"{env_path} is not valid JSON ({exc}); delete it to report "
                f"without environment details"
            ) from exc
    return df, env


DRAWS_FILE = "draws.jsonl"  # one JSON line per case that draws data (run/inputs.py draws)
ERRORS_FILE = "errors.log"  # the full error of each row whose reason had to be cut short


def append_line(path: Path, text: str) -> None:
    """``text`` (ending in a newline) appended to ``path``, flushed and fsynced; after a
    torn last line (a killed write) on a line of its own."""
    data = text.encode("utf-8")
    with open(path, "a+b") as f:
        if f.tell() > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                data = b"\n" + data
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def read_draws(run_dir: Path) -> dict[str, dict]:
    """The draws file of a run: case label -> its record (the last one, if written twice);
    empty when the run drew nothing. A torn last line (a killed write) is skipped."""
    path = Path(run_dir) / DRAWS_FILE
    if not path.is_file():
        return {}
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        out[record["case"]] = record
    return out


RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
GRID_FILE = "grid.json"  # what a run sweeps; a resumed run must sweep the same


def run_folder(
    results_dir: Path, run_id: str | None, *, resume: bool, default_id: str, grid: dict
) -> tuple[str, Path]:
    """The run's id and folder (not yet created), or UsageError: a bad id, a new run whose
    folder holds results, or a resume whose grid differs from the first run's."""
    if resume and not run_id:
        raise UsageError("--resume needs the --run-id of the run to continue")
    run_id = run_id or default_id
    if not RUN_ID.match(run_id):
        raise UsageError(
            f"--run-id {run_id!r}: use letters, digits, '.', '_' and '-' only (no path separators)"
        )
    run_dir = Path(results_dir) / run_id
    started = (run_dir / "results.csv").exists()
    if started and not resume:
        raise UsageError(
            f"--run-id {run_id}: {run_dir} already holds results; add --resume "
            f"to continue it, or pick another --run-id"
        )
    if resume and not started:
        raise UsageError(
            f"--resume: {run_dir} holds no results.csv to continue; check "
            f"--run-id and --results-dir"
        )
    if resume:
        check_same_grid(run_dir, grid)
    return run_id, run_dir


def check_same_grid(run_dir: Path, grid: dict) -> None:
    try:
        old = json.loads((run_dir / GRID_FILE).read_text())
    except (OSError, ValueError):
        raise UsageError(
            f"--resume: {run_dir / GRID_FILE} is missing or unreadable, so the "
            f"grid cannot be checked; start a new --run-id"
        ) from None
    for key in sorted(set(old) | set(grid)):
        if old.get(key) != grid.get(key):
            raise UsageError(
                f"--resume: {first_difference(key, old.get(key), grid.get(key))}; "
                f"resume with the same options or start a new --run-id"
            )


def first_difference(key: str, was, now) -> str:
    """The first place two grid values differ, in words (lists: the first differing item)."""
    if isinstance(was, list) and isinstance(now, list):
        i = next((i for i, (a, b) in enumerate(zip(was, now)) if a != b), min(len(was), len(now)))
        a = was[i] if i < len(was) else f"no item (it had {len(was)})"
        b = now[i] if i < len(now) else f"no item (now {len(now)})"
        return f"{key} item {i + 1} was {a!r} in the run but is now {b!r}"
    return f"the run used {key}={was!r} but now {key}={now!r}"
