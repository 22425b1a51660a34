"""The scaling exponents as the report lists them: per series its fits of each metric
(scaling.scaling_exponents), ordered by impl then mode, and the series without any fit
counted per reason rather than listed one by one."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from attnbench.report.analyse.derived import SERIES_KEY, mode_rank


@dataclass(frozen=True)
class SeriesFits:
    impl: str
    series: str  # its label (derived.series_labels)
    fits: dict  # metric -> its fit row, for the metrics of the series
    n_contended: int  # the most contended points one of its fits used
    failed: str | None  # its failed rows, as scaling_exponents says them


@dataclass(frozen=True)
class Unfitted:
    reason: str  # why (the first metric's reason), 'no fit' without one
    series: int  # how many series
    impls: tuple  # their impls, sorted
    failed: int  # their failed rows
    relations: tuple  # their length relations (seq_kv_rule), sorted


@dataclass(frozen=True)
class Exponents:
    fitted: tuple  # SeriesFits of the series with a fit of some metric
    unfitted: tuple  # Unfitted per reason, for the series with none
    any_ok: bool  # some series has ok rows (the others are left out)
    fixed_tokens: bool  # a series runs at a fixed token count (B·N=...: the race grid)


def exponent_table(fits: pd.DataFrame) -> Exponents:
    """From a DeviceAnalysis's fits (scaling_exponents with a ``series`` label column)."""
    fits = fits[fits["n_ok"] > 0]
    fixed = bool(fits["batch_rule"].astype(str).str.startswith("B·N=").any())
    groups = fits.groupby(list(SERIES_KEY), dropna=False, sort=True)
    groups = sorted(groups, key=lambda t: (t[1]["impl"].iloc[0], mode_rank(t[1]["mode"].iloc[0])))
    fitted, unfit = [], []
    for _key, g in groups:
        if g["slope"].isna().all():
            unfit.append(g)
            continue
        first = g.iloc[0]
        busy = g["n_contended"].fillna(0) if "n_contended" in g else pd.Series(0)
        fitted.append(
            SeriesFits(
                impl=first["impl"],
                series=first["series"],
                fits={r["metric"]: r for _, r in g.iterrows()},
                n_contended=int(busy.max()),
                failed=None if pd.isna(first["failed"]) else str(first["failed"]),
            )
        )
    return Exponents(tuple(fitted), _unfitted(unfit), not fits.empty, fixed)


def _unfitted(unfit: list) -> tuple:
    """The series without any fit, one Unfitted per reason."""
    why: dict[str, list] = {}
    for g in unfit:
        reason = g["reason"].dropna()
        why.setdefault(str(reason.iloc[0]) if len(reason) else "no fit", []).append(g)
    return tuple(
        Unfitted(
            reason=reason,
            series=len(groups),
            impls=tuple(sorted({str(g["impl"].iloc[0]) for g in groups})),
            failed=sum(int(g["n_failed"].iloc[0]) for g in groups),
            relations=tuple(sorted({str(g["seq_kv_rule"].iloc[0]) for g in groups})),
        )
        for reason, groups in why.items()
    )
