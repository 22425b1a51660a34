"""The table a sweep prints at its end: one cell per case (rows) and impl (columns), over
the run's rows as they stand (a resumed run's too), its latest row per case and impl."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from attnbench.report.analyse import derived
from attnbench.store.schema import CASE_KEY


@dataclass(frozen=True)
class Summary:
    """The sweep's summary table: its cells, and the impls it leaves out."""

    cells: pd.DataFrame  # index: case label, in run order; columns: impls; '' where none
    never: list  # impls unsupported in every case (named, not tabulated)


def cell(row, contended: bool, noisy: bool) -> str:
    """A row's cell: its status where it has no time, else its median time_ms (3 figures)
    with '!' when it disagrees with the reference, 'c' when timed while contended, '~' when
    noisy or its paired speedup's interval is wide (derived.caveat)."""
    if row["status"] != "ok":
        return row["status"]
    note = derived.caveat(False, row.get("speedup_lo"), row.get("speedup_hi"), noisy)
    return (
        f"{row['time_ms']:.3g}"
        + ("" if row["agrees"] is not False else " !")
        + (" c" if contended else "")
        + (" ~" if note else "")
    )


def summary(df: pd.DataFrame, impls: list[str] | None = None) -> Summary:
    """``df``'s cells, the impls in the order of ``impls`` (those with rows; default: their
    order in ``df``) and the cases in the order they were run."""
    rows = df.drop_duplicates([c for c in CASE_KEY if c in df], keep="last")
    busy, shaky = derived.contended(rows), derived.noisy(rows)
    cells = pd.DataFrame(
        {
            "case": [derived.case_label(r) for _, r in rows.iterrows()],
            "impl": rows["impl"].to_numpy(),
            "cell": [cell(r, bool(busy[i]), bool(shaky[i])) for i, r in rows.iterrows()],
        }
    )
    wide = cells.pivot(index="case", columns="impl", values="cell").fillna("")
    order = [i for i in (impls or []) if i in wide.columns] or list(dict.fromkeys(cells["impl"]))
    wide = wide.loc[list(dict.fromkeys(cells["case"])), order]
    never = [c for c in wide.columns if (wide[c] == "unsupported").all()]
    return Summary(cells=wide.drop(columns=never), never=never)
