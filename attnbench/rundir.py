"""Loading one run folder (results.csv + env.json) for reporting, with errors that say how
to fix the input."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from attnbench.results import CASE_KEY, read_results


class RunError(ValueError):
    """The run folder cannot be reported on; the message says how to fix it."""


def load_run(run_dir: Path) -> tuple[pd.DataFrame, dict]:
    """results.csv as a typed frame and env.json (empty dict when absent), or RunError."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunError(f"run folder {run_dir} does not exist; pass a folder written by a "
                       f"sweep, e.g. results/<run-id>")
    csv = run_dir / "results.csv"
    if not csv.is_file():
        raise RunError(f"{csv} not found; pass the folder of a sweep run that wrote "
                       f"results.csv")
    try:
        df = read_results(csv)
    except (ValueError, TypeError, pd.errors.ParserError) as exc:
        raise RunError(f"{csv} cannot be read as attnbench results ({exc}); "
                       f"regenerate it with a sweep") from exc
    missing = [c for c in (*CASE_KEY, "status") if c not in df.columns]
    if missing:
        raise RunError(f"{csv} lacks columns {', '.join(missing)}; it was not written by "
                       f"attnbench.results (regenerate it with a sweep)")
    env_path = run_dir / "env.json"
    env = {}
    if env_path.is_file():
        try:
            env = json.loads(env_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise RunError(f"{env_path} is not valid JSON ({exc}); delete it to report "
                           f"without environment details") from exc
    return df, env
