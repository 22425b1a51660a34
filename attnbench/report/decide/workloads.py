"""How a group of cases is named in the picks: the values it holds of each dimension
('Sq=1 B=32 Skv=4096–131072'), what sets it apart within its part ('B=32'), one case
('Sq=1 B=1 Skv=131072'). ``cases``: case id -> the case's columns."""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnbench.dims import DIM
from attnbench.report.decide.verdicts import seq_spans


def dim_values(d: str, values) -> str:
    """One dimension's values: 'Sq=1', 'B=1,32', 'Skv=4096–131072' (spans of the values)."""
    values = sorted({v for v in values if not pd.isna(v)})
    if values and all(isinstance(v, (int, np.integer)) for v in values):
        said = seq_spans(values, values).replace(", ", ",") if len(values) > 2 else None
        said = ",".join(map(str, values)) if said is None or "–" not in said else said
    else:
        said = ",".join(map(str, values))
    return f"{DIM[d].title_prefix}{said}"


def workload(cases, idx: list, named: list) -> str:
    """A group's workload: the values it holds of new tokens, batch, cache length and any
    other dimension that varies in its phase ('Sq=1 B=32 Skv=4096,32768')."""
    return " ".join(dim_values(d, cases.loc[idx, d]) for d in named)


def where(cases, idx: list, part: list, vary: list) -> str:
    """What sets a group apart within its part: the dimensions whose values it does not hold
    all of ('B=32'; '' for the whole part)."""
    held = [d for d in vary if cases.loc[idx, d].nunique() < cases.loc[part, d].nunique()]
    return " ".join(dim_values(d, cases.loc[idx, d]) for d in held)


def case_text(cases, case_id, vary: list) -> str:
    """One case by its varying dimensions: 'Sq=1 B=1 Skv=131072'."""
    if case_id is None:
        return ""
    return " ".join(dim_values(d, [cases.loc[case_id, d]]) for d in vary)
