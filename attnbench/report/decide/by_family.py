"""The verdicts summed per case family, as the report's tables show them: who wins where
(one FamilyWins per family) and the speedups against the baseline (SpeedupTable)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from attnbench.report.analyse.derived import CASE_COLUMNS, case_labels

# what a speedup table says of each case besides its label: its N, speedup with its interval,
# the caveat; and whether it is paired and its family, per impl and family
CASE_SAID = ("family", "seq_n", "speedup", "speedup_lo", "speedup_hi", "caveat", "paired")


@dataclass(frozen=True)
class FamilyWins:
    family: str
    wins: pd.DataFrame  # its rows of verdicts.wins_by_family (most wins first), with borrowed
    cases: int  # the family's cases
    no_agreeing: int  # cases where no impl is ok and agrees
    margin: float | None  # the top winner's median margin over the runner-up


def who_wins(
    winners: pd.DataFrame, wins: pd.DataFrame, families: list, borrowed: set
) -> tuple[FamilyWins, ...]:
    """Per family of ``winners`` (verdicts.fastest_agreeing), in ``families`` order: its wins
    (verdicts.wins_by_family), each winner marked ``borrowed`` when it is in ``borrowed``
    (impls that ran PyTorch's kernels), and the top winner's median margin."""
    order = {f: i for i, f in enumerate(families)}
    out = []
    for fam, g in sorted(winners.groupby("family"), key=lambda t: order.get(t[0], 0)):
        w = wins[wins["family"] == fam].reset_index(drop=True)
        w = w.assign(borrowed=w["impl"].isin(borrowed))
        top = w["impl"].iloc[0] if len(w) else None
        margin = g.loc[g["impl"] == top, "margin"].dropna()
        out.append(
            FamilyWins(
                family=fam,
                wins=w,
                cases=len(g),
                no_agreeing=int(g["impl"].isna().sum()),
                margin=float(margin.median()) if len(margin) else None,
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class SpeedupTable:
    summary: pd.DataFrame  # per impl and family: size, median, min, max, ties, marked
    # per summary row, its cases in order of N: their case columns, CASE_SAID and ``label``
    # (what varies among them)
    cases: tuple
    paired: bool  # some speedup is paired per round (else ratios of medians)
    impls: tuple  # the run's impls, named where the baseline has no ok rows


def speedup_table(
    speedups: pd.DataFrame | None, baseline: str | None, families: list, impls: tuple
) -> SpeedupTable:
    """verdicts.speedups of every impl but the baseline, summed per impl and family (in
    ``families`` order): how many cases, the median, min and max speedup, the ties (a paired
    interval containing 1) and the marked cases (a caveat)."""
    if speedups is None:
        return SpeedupTable(pd.DataFrame(), (), False, impls)
    sp = speedups[(speedups["impl"] != baseline) & speedups["speedup"].notna()]
    sp = sp[[c for c in ("impl", *CASE_COLUMNS, *CASE_SAID) if c in sp]]  # what is said
    if sp.empty:
        return SpeedupTable(pd.DataFrame(), (), False, impls)
    groups = dict(list(sp.groupby(["impl", "family"], sort=True)))
    summary = (
        sp.groupby(["impl", "family"], sort=True)["speedup"]
        .agg(["size", "median", "min", "max"])
        .reset_index()
    )
    keys = list(zip(summary["impl"], summary["family"]))
    summary["ties"] = [int(_ties(groups[k]).sum()) for k in keys]
    summary["marked"] = [int(groups[k]["caveat"].fillna("").astype(bool).sum()) for k in keys]
    order = {f: i for i, f in enumerate(families)}
    summary = summary.sort_values(
        ["impl", "family"], key=lambda c: c.map(order) if c.name == "family" else c
    )
    cases = tuple(_labelled(groups[k]) for k in zip(summary["impl"], summary["family"]))
    return SpeedupTable(summary, cases, bool(sp["paired"].eq(True).any()), impls)


def _ties(sp: pd.DataFrame) -> pd.Series:
    """Speedups whose paired interval contains 1."""
    return (sp["speedup_lo"].le(1) & sp["speedup_hi"].ge(1)).fillna(False).astype(bool)


def _labelled(sp: pd.DataFrame) -> pd.DataFrame:
    """One (impl, family)'s cases in order of N, each labelled by what varies among them."""
    sp = sp.sort_values("seq_n")
    return sp.assign(label=case_labels(sp))
