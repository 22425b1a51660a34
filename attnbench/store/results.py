"""Durable CSV append (each row flushed and fsynced), tail repair for resume, and typed reads
of a run's results (with env.json, for reporting, with errors that say how to fix the input);
the columns are in store/schema.py, the file names in store/rundir.py."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

import pandas as pd

from attnbench.errors import UsageError, one_line
from attnbench.store.rundir import RunDir
from attnbench.store.schema import (
    ANCHOR_COLUMNS,
    CASE_KEY,
    COLUMNS,
    KERNEL_COLUMNS,
    LATER_KEYS,
    RETRIED,
    SAMPLE_COLUMNS,
    STATUSES,
)

# the columns a results.csv must have to be one (load_run names those it lacks)
REQUIRED = tuple(c for c in (*CASE_KEY, "status") if c not in LATER_KEYS)
MEASURED = ("time_ms",)  # every results.csv ever written has it: a file without it is not one


def _fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if value != value else repr(value)  # NaN never becomes a number
    return str(value)


class CsvAppender:
    """Appends rows to a CSV, each one flushed and fsynced before ``write`` returns. The file
    (with its header, if new) is opened at the first row, so no row means no file."""

    def __init__(self, path: Path, columns: tuple[str, ...]):
        self.path, self.columns = Path(path), tuple(columns)
        self._file = self._writer = None

    def write(self, rows: list[dict] | dict) -> None:
        rows = [rows] if isinstance(rows, dict) else rows
        if not rows:
            return
        if self._file is None:
            new = not self.path.exists() or self.path.stat().st_size == 0
            self._file = open(self.path, "a", newline="", encoding="utf-8")
            self._writer = csv.DictWriter(self._file, fieldnames=self.columns)
            if new:
                self._writer.writeheader()
        try:
            for row in rows:
                self._writer.writerow({c: _fmt(row.get(c)) for c in self.columns})
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as exc:  # a full disk, say: the message names the file
            raise OSError(exc.errno, exc.strerror, str(self.path)) from exc

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def row_key(row: dict) -> tuple[str, ...]:
    """The (case, impl) identity of a row, as text, the same from a dict or a CSV line."""
    return tuple(_fmt(row.get(c)) or _fmt(LATER_KEYS.get(c)) for c in CASE_KEY)


def repair_tail(path: Path) -> bool:
    """Cut a torn last line (a write cut off by a kill) so it is never parsed as data."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return False
    data = path.read_bytes()
    if data.endswith(b"\n"):
        return False
    with open(path, "r+b") as f:
        f.truncate(data.rfind(b"\n") + 1)
        f.flush()
        os.fsync(f.fileno())
    return True


def done_keys(run_dir: Path, retry=()) -> dict[tuple[str, ...], str | None]:
    """Keys of the rows already in run_dir/results.csv, each with the device_name that ran it
    (None when unknown), after repairing its tail. Rows whose status is in RETRIED (lost to
    the infrastructure) or in ``retry`` (--retry) are taken out, to run again; samples and
    kernels of rows that are not in results.csv are dropped."""
    run = RunDir(run_dir)
    repair_tail(run.results)
    again = {*RETRIED, *retry}
    with open(run.results, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        rows, columns = list(reader), tuple(reader.fieldnames or ())
    keys = {row_key(r): r.get("device_name") or None for r in rows if r["status"] not in again}
    if len(keys) < len(rows) or columns != tuple(COLUMNS):  # also an older run's columns
        _rewrite(run.results, tuple(COLUMNS), [r for r in rows if row_key(r) in keys])
    repair_tail(run.anchor)  # per case, not per row: a resumed case's anchor is added again
    for path, columns in ((run.samples, SAMPLE_COLUMNS), (run.kernels, KERNEL_COLUMNS)):
        if not path.exists():
            continue
        repair_tail(path)
        with open(path, newline="", encoding="utf-8") as f:
            _rewrite(path, columns, [r for r in csv.DictReader(f) if row_key(r) in keys])
    return keys


def check_resumable(run_dir: Path) -> None:
    """Before a --resume writes anything: results.csv is attnbench's (its key and status
    columns, each whole row's status known; a torn last line is allowed, done_keys cuts it)
    and env.json, if there, is JSON; else UsageError naming the file, nothing touched."""
    run = RunDir(run_dir)
    try:
        text = run.results.read_text(encoding="utf-8")
        lines = text.splitlines(keepends=True)
        if lines and not lines[-1].endswith("\n"):
            lines.pop()  # a torn last line
        reader = csv.DictReader(lines)
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(
                f"its header lacks {len(missing)} of the key columns, {missing[0]!r} first"
            )
        for n, row in enumerate(reader, start=2):
            if None in row or row["status"] not in STATUSES:
                raise ValueError(f"line {n} is not a row of it")
    except (UnicodeDecodeError, csv.Error, ValueError) as exc:
        raise UsageError(
            f"--resume: {run.results} is not attnbench results ({one_line(exc, 120)}); "
            f"nothing was changed: restore the file or start a new --run-id"
        ) from None
    if run.env.is_file():
        try:
            json.loads(run.env.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise UsageError(
                f"--resume: {run.env} is not valid JSON ({one_line(exc, 120)}); nothing was "
                f"changed: restore it, or delete it (the report then lacks the environment), "
                f"or start a new --run-id"
            ) from None


def _rewrite(path: Path, columns, rows: list[dict]) -> None:
    """``path`` holds ``rows`` alone, replaced at once (fsynced first)."""
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def sample_lines(row: dict, times_ms: list[float], rounds: tuple[int, ...]) -> list[dict]:
    """samples.csv's lines of a row: each timing sample with its index and round."""
    return [
        {**row, "sample": i, "round": r, "time_ms": t}
        for i, (t, r) in enumerate(zip(times_ms, rounds))
    ]


def kernel_lines(row: dict, kernels: list[dict]) -> list[dict]:
    """kernels.csv's lines of a row: each kernel (or CPU op) of its profile."""
    return [{**row, **k} for k in kernels]


def row_writer(run_dir: Path) -> CsvAppender:
    return CsvAppender(RunDir(run_dir).results, tuple(COLUMNS))


def samples_writer(run_dir: Path) -> CsvAppender:
    return CsvAppender(RunDir(run_dir).samples, SAMPLE_COLUMNS)


def kernels_writer(run_dir: Path) -> CsvAppender:
    return CsvAppender(RunDir(run_dir).kernels, KERNEL_COLUMNS)


def anchor_writer(run_dir: Path) -> CsvAppender:
    return CsvAppender(RunDir(run_dir).anchor, ANCHOR_COLUMNS)


def read_results(path: Path) -> pd.DataFrame:
    """results.csv (or its run folder) as a typed frame; blank cells stay missing. A column
    the file was written without is added: a later key column with the value older rows
    meant (``LATER_KEYS``), a metric added since blank (a run made before the speed anchor
    has no ``speed_compute``); only a missing key or status column stays missing, for
    ``load_run`` to name."""
    path = Path(path)
    if path.is_dir():
        path = RunDir(path).results
    text = path.read_text(encoding="utf-8")
    if not text.endswith("\n"):  # a torn last line (a write cut off by a kill) is no row
        text = text[: text.rfind("\n") + 1]
    df = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False, na_values=[""])
    for name, (dtype, _) in COLUMNS.items():
        if name not in df and (name in LATER_KEYS or name not in (*REQUIRED, *MEASURED)):
            df[name] = LATER_KEYS.get(name) or pd.NA  # rows written before the column existed
        if name not in df:
            continue
        if dtype == "boolean":
            df[name] = df[name].map({"True": True, "False": False}).astype("boolean")
        elif dtype in ("Int64", "Float64"):
            df[name] = pd.to_numeric(df[name]).astype(dtype)
        else:
            df[name] = df[name].astype(dtype)
    return df


class RunError(UsageError):
    """The run folder cannot be reported on; the message says how to fix it."""


def load_run(run_dir: Path) -> tuple[pd.DataFrame, dict]:
    """results.csv as a typed frame and env.json (empty dict when absent), or RunError."""
    run = RunDir(run_dir)
    if not run.path.is_dir():
        raise RunError(
            f"run folder {run.path} does not exist; pass a folder written by a "
            f"sweep, e.g. results/<run-id>"
        )
    csv_path = run.results
    if not csv_path.is_file():
        raise RunError(
            f"{csv_path} not found; pass the folder of a sweep run that wrote {run.RESULTS}"
        )
    try:
        df = read_results(csv_path)
    except (ValueError, TypeError, pd.errors.ParserError) as exc:
        raise RunError(
            f"{csv_path} cannot be read as attnbench results ({exc}); regenerate it with a sweep"
        ) from exc
    missing = [c for c in (*REQUIRED, *MEASURED) if c not in df.columns]
    if missing:
        raise RunError(
            f"{csv_path} lacks columns {', '.join(missing)}; it was not written by "
            f"attnbench.store.results (regenerate it with a sweep)"
        )
    if df.empty:
        raise RunError(
            f"{csv_path} has no rows, only its header: the sweep finished none; run it "
            f"again, or continue it with --resume"
        )
    env = {}
    if run.env.is_file():
        try:
            env = json.loads(run.env.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise RunError(
                f"{run.env} is not valid JSON ({exc}); delete it to report "
                f"without environment details"
            ) from exc
    return df, env
