"""The rows the numerical-agreement section names: ok rows that disagree with the float64
reference or were not checked, and half-precision rows whose error is over what a kernel
that accumulates in float32 gets (``precision_low``), each with its case label."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from attnbench.report.analyse.derived import case_label, disagreements, ok_rows, per_case


@dataclass(frozen=True)
class Agreement:
    n_ok: int  # ok rows
    disagreeing: pd.DataFrame  # derived.disagreements, with ``case`` and ``verdict``
    precision_low: pd.DataFrame  # ok rows with precision_low, with ``case`` (empty: none)


def agreement(frame: pd.DataFrame) -> Agreement:
    ok = ok_rows(frame)
    bad = disagreements(frame)
    bad = bad.assign(
        case=per_case(bad, case_label),
        verdict=bad["agrees"].map({False: "disagrees"}).fillna("not checked"),
    )
    low = ok.iloc[:0]
    if "precision_low" in frame:  # runs made before the column existed have none
        low = ok[ok["precision_low"].eq(True).fillna(False).astype(bool)]
    low = low.assign(case=per_case(low, case_label))
    return Agreement(len(ok), bad, low)
