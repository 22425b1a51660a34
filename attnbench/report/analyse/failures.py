"""A run's non-ok rows as its report lists them: one line per impl, status and cause (the
row's reason cut to its cause, reasons.short_reason) with the cases it struck, the failures
apart from the capability gaps (``unsupported``: not run, not broken)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from attnbench.report.analyse import derived
from attnbench.report.analyse.reasons import short_reason

# the order causes are listed in: what broke the harness first, capability gaps last
FAILURE_ORDER = {
    s: i for i, s in enumerate(("crash", "lost", "error", "timeout", "oom", "unsupported"))
}
CAUSE_COLUMNS = ["impl", "status", "cause", "rows", "cases"]


@dataclass(frozen=True)
class Failures:
    """Every non-ok row of a run, by cause."""

    rows: int  # non-ok rows (a blank status too)
    failed: pd.DataFrame  # by_cause of the rows that failed (every status but unsupported)
    failed_rows: int
    unsupported: pd.DataFrame  # by_cause of the unsupported rows
    unsupported_rows: int


def by_cause(bad: pd.DataFrame) -> pd.DataFrame:
    """One row per (impl, status, cause), in FAILURE_ORDER then by name: its row count
    (``rows``) and its cases' labels (``cases``, a tuple, derived.case_labels)."""
    if bad.empty:
        return pd.DataFrame(columns=CAUSE_COLUMNS)
    bad = bad.assign(
        cause=bad["reason"].map(short_reason),
        case=derived.case_labels(bad),
        _o=bad["status"].map(lambda s: FAILURE_ORDER.get(s, -1)),
    )
    rows = [
        {"impl": impl, "status": status, "cause": cause, "rows": len(g), "cases": tuple(g["case"])}
        for (_, impl, status, cause), g in bad.groupby(
            ["_o", "impl", "status", "cause"], sort=True, dropna=False
        )
    ]
    return pd.DataFrame(rows, columns=CAUSE_COLUMNS)


def failures(df: pd.DataFrame) -> Failures:
    """The non-ok rows of ``df`` (every row of a run), failures apart from capability gaps."""
    bad = derived.failures(df)
    gaps = bad["status"].eq("unsupported").fillna(False).astype(bool)
    return Failures(
        rows=len(bad),
        failed=by_cause(bad[~gaps]),
        failed_rows=int((~gaps).sum()),
        unsupported=by_cause(bad[gaps]),
        unsupported_rows=int(gaps.sum()),
    )
