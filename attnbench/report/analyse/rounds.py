"""A run's per-round timing, read once: each row's round medians (samples.csv) and the speed
anchor's (RunDir.ANCHOR: a fixed matmul and a copy timed in the same rounds as the case's impls).
Runs made before rounds existed have neither; every reader then answers None and its callers
keep the rule they had before (docs/reports.md, "Noise")."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from attnbench.measure import paired
from attnbench.measure.anchor import RESOURCES  # the anchor's workloads: a matmul and a copy
from attnbench.report.analyse.derived import CASE_COLUMNS
from attnbench.store.rundir import RunDir
from attnbench.store.schema import CASE_KEY, LATER_KEYS

RowKey = tuple  # a row's CASE_KEY values as text (``key``); a case's: CASE_COLUMNS
PerRound = dict  # round -> median time of that round, ms


def anchor_path(run_dir) -> Path:
    """The run's anchor file (store/rundir.RunDir names it)."""
    return RunDir(run_dir).path / RunDir.ANCHOR


def _text(value, column: str) -> str:
    """A key cell as samples.csv spells it; blank as the column's value in older rows."""
    blank = value is None or (not isinstance(value, str) and pd.isna(value))
    if blank:
        old = LATER_KEYS.get(column)
        return "" if old is None else str(old)
    return str(value)


def key(row, columns=CASE_KEY) -> RowKey:
    """The identity of a row (a typed frame row or a CSV record) as text."""
    return tuple(_text(row[c], c) for c in columns)


def _read_text(path: Path) -> pd.DataFrame | None:
    if not path.is_file():
        return None
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    for c, old in LATER_KEYS.items():  # files written before a later key column existed
        if c not in df:
            df[c] = "" if old is None else str(old)
    return df


def _per_round(df: pd.DataFrame, columns) -> dict[RowKey, PerRound]:
    """key -> {round: median time_ms of that round's lines}, over lines with a round; the
    medians in one grouped pass (paired.round_medians' rule: the median of a round's lines)."""
    df = df.assign(
        round=pd.to_numeric(df["round"], errors="coerce"),
        time_ms=pd.to_numeric(df["time_ms"], errors="coerce"),
    ).dropna(subset=["round", "time_ms"])
    medians = df.groupby([*columns, "round"], sort=False)["time_ms"].median()
    out: dict[RowKey, PerRound] = {}
    for (*k, r), t in medians.items():
        k = tuple(_text(v, c) for v, c in zip(k, columns))
        out.setdefault(k, {})[int(r)] = float(t)
    return {k: dict(sorted(rounds.items())) for k, rounds in out.items()}


class Rounds:
    """Each row's round medians, looked up by its key; the paired ratio of two rows."""

    def __init__(self, per_row: dict[RowKey, PerRound]):
        self.per_row = per_row

    @classmethod
    def read(cls, run_dir) -> Rounds | None:
        """From the run's samples.csv; None when it is missing or has no rounds."""
        df = _read_text(RunDir(run_dir).samples)
        if df is None or "round" not in df or not df["round"].str.strip().any():
            return None
        per_row = _per_round(df, CASE_KEY)
        return cls(per_row) if per_row else None

    def of(self, row) -> PerRound | None:
        return self.per_row.get(key(row))

    def speedup_over(self, row, impl: str) -> paired.Ratio | None:
        """``impl``'s time / the row's time in the row's case, paired by round (the row's
        speedup over ``impl``); None unless both have rounds in common."""
        k = key(row)  # CASE_KEY begins with the impl
        mine, theirs = self.per_row.get(k), self.per_row.get((impl, *k[1:]))
        return paired.ratio(theirs, mine) if mine and theirs else None


class AnchorRounds(NamedTuple):
    """The speed anchor of a run: per case and resource, its round medians, and every
    round's time with the seconds since the run's start (for the speed-over-time figure)."""

    per_case: dict[tuple[RowKey, str], PerRound]  # (case key, resource) -> rounds
    series: pd.DataFrame  # resource, t_s, time_ms, speed (relative to the run's first case)

    @classmethod
    def read(cls, run_dir) -> AnchorRounds | None:
        df = _read_text(anchor_path(run_dir))
        if df is None or df.empty or not {"resource", "round", "time_ms"} <= set(df):
            return None
        per_case = _per_round(df, (*CASE_COLUMNS, "resource"))
        per_case = {(k[:-1], k[-1]): v for k, v in per_case.items()}
        return cls(per_case, _speed_series(df)) if per_case else None

    def of(self, case_row, resource: str) -> PerRound | None:
        """The anchor's rounds in the row's case for ``resource``: compute or memory, or
        both (per round, the geometric mean of the two: a row bound by neither)."""
        if resource != "both":
            return self.per_case.get((key(case_row, CASE_COLUMNS), resource))
        parts = [self.of(case_row, r) or {} for r in RESOURCES]
        shared = set(parts[0]) & set(parts[1])
        return {k: float(np.sqrt(parts[0][k] * parts[1][k])) for k in sorted(shared)} or None


def _speed_series(df: pd.DataFrame) -> pd.DataFrame:
    """Every anchor time as a speed relative to the run's start: the median of the first
    case's times for that resource / this time (above 1: faster than at the start)."""
    out = pd.DataFrame(
        {
            "resource": df["resource"],
            "t_s": pd.to_numeric(df["t_s"], errors="coerce") if "t_s" in df else np.nan,
            "time_ms": pd.to_numeric(df["time_ms"], errors="coerce"),
            "case": list(zip(*(df[c] for c in CASE_COLUMNS))),  # text: the file's cells
        }
    ).dropna(subset=["t_s", "time_ms"])
    out = out[out["time_ms"] > 0].sort_values("t_s", kind="stable")
    speed = pd.Series(np.nan, index=out.index)
    for _, g in out.groupby("resource", sort=False):
        first = g[g["case"] == g["case"].iloc[0]]["time_ms"].median()
        speed[g.index] = first / g["time_ms"]
    return out.assign(speed=speed).drop(columns="case").reset_index(drop=True)
