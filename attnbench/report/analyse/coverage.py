"""What a run's rows cover, as its opening, header and summary say it: rows per status and
how many ok rows agree, the impls it did not run, the phases it has no rows of, whether it
has precision columns and rounds, and the impls whose rows ran PyTorch's own kernels."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from attnbench.measure.backends import PYTORCH_PREFIX
from attnbench.report.analyse.machine import device_title
from attnbench.store.schema import STATUSES

PHASES = ("prefill", "decode", "train")  # a model run's phases, in the order they are named


@dataclass(frozen=True)
class Coverage:
    """The facts a report's first screen, header and summary state about its rows."""

    device: str  # the device's title over every row (machine.device_title)
    rows: int  # every row
    statuses: tuple  # (status, rows) in STATUSES order, a blank status as 'missing' last
    ok: int  # ok rows
    disagreeing: int  # ok rows whose agreement is False or unknown
    other_run_ids: tuple  # run ids in results.csv besides the run's own
    not_installed: tuple  # impls env.json's not_run says are not installed
    not_run: tuple  # impls not run for another reason (this device, this grid)
    lacking_phases: tuple  # a model run's phases without a row
    precision: bool  # whether the rows have precision columns
    rounds: tuple | None  # (fewest, most) rounds per row; None: no rounds
    failed: tuple  # (status, rows) of every status but ok, most rows first
    borrowed: pd.DataFrame  # borrowed_impls: impls whose ok rows ran PyTorch's kernels


def borrowed_kernels(df: pd.DataFrame) -> pd.Series:
    """Rows whose backend is one of PyTorch's own (pytorch:*, e.g. xformers without its
    C++/CUDA extension)."""
    return df["backend"].fillna("").astype(str).str.startswith(PYTORCH_PREFIX)


def borrowed_impls(ok: pd.DataFrame) -> pd.DataFrame:
    """Per impl (by name) with ok rows that ran PyTorch's own kernels: how many (``rows``), of
    how many ok rows (``of``), and which backends (``backends``, sorted)."""
    borrowed = ok[borrowed_kernels(ok)]
    rows = [
        {
            "impl": impl,
            "rows": len(g),
            "of": int((ok["impl"] == impl).sum()),
            "backends": tuple(sorted(set(g["backend"]))),
        }
        for impl, g in borrowed.groupby("impl", sort=True)
    ]
    return pd.DataFrame(rows, columns=["impl", "rows", "of", "backends"])


def coverage(df: pd.DataFrame, ok: pd.DataFrame, env: dict, run_id: str) -> Coverage:
    """What ``df`` (every row of run ``run_id``; ``ok``: its ok rows; ``env``: its env.json)
    covers."""
    counts = df["status"].fillna("missing").value_counts()
    order = {s: i for i, s in enumerate((*STATUSES, "missing"))}
    not_run = env.get("not_run") or {}
    not_run = not_run if isinstance(not_run, dict) else {}
    missing = sorted(i for i, why in not_run.items() if "not installed" in str(why))
    rounds = df["rounds"].dropna() if "rounds" in df else pd.Series(dtype=float)
    return Coverage(
        device=device_title(env, df),
        rows=len(df),
        statuses=tuple(
            (s, int(counts[s])) for s in sorted(counts.index, key=lambda s: order.get(s, 99))
        ),
        ok=len(ok),
        disagreeing=int((~ok["agrees"].eq(True).fillna(False)).sum()),
        other_run_ids=tuple(sorted(set(df.get("run_id", pd.Series()).dropna()) - {run_id})),
        not_installed=tuple(missing),
        not_run=tuple(sorted(i for i in not_run if i not in missing)),
        lacking_phases=_lacking_phases(df),
        precision="precision_low" in df,
        rounds=None if rounds.empty else (int(rounds.min()), int(rounds.max())),
        failed=tuple((s, int(n)) for s, n in df["status"].value_counts().items() if s != "ok"),
        borrowed=borrowed_impls(ok),
    )


def _lacking_phases(df: pd.DataFrame) -> tuple:
    """A model run's phases (PHASES) without a row; none for a run without model rows."""
    if "model" not in df:
        return ()
    models = df["model"].fillna("").astype(str) != ""
    if not models.any():
        return ()
    phases = set(df.loc[models, "phase"].dropna())
    return tuple(p for p in PHASES if p not in phases)
