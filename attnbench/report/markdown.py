"""A small GitHub-markdown table writer (no tabulate dependency)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pandas as pd

MISSING = "–"


def cell(value, fmt: str = ".3g") -> str:
    """One cell: missing values become an en dash, never a number."""
    if value is None or value is pd.NA or value is pd.NaT:
        return MISSING
    if isinstance(value, float) and math.isnan(value):
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return format(value, fmt)
    text = str(value).replace("|", "\\|").replace("\n", " ").replace("\r", " ")
    return text


def table(
    df: pd.DataFrame,
    columns: dict[str, str] | None = None,
    formats: dict[str, str | Callable] | None = None,
    default_fmt: str = ".3g",
) -> str:
    """``df`` as a markdown table. ``columns`` maps column -> header (and picks/orders them);
    ``formats`` maps column -> a format spec or a function of the value."""
    columns = columns or {c: c for c in df.columns}
    formats = formats or {}
    head = "| " + " | ".join(columns.values()) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    lines = [head, rule]
    for _, row in df.iterrows():
        cells = []
        for c in columns:
            fmt = formats.get(c, default_fmt)
            value = row[c]
            if callable(fmt):
                text = MISSING if _missing(value) else cell(fmt(value))
            else:
                text = cell(_plain(value), fmt)
            cells.append(text)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _missing(value) -> bool:
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def _plain(value):
    """numpy scalars -> Python scalars so cell() formats them."""
    if _missing(value):
        return None
    if hasattr(value, "item"):
        return value.item()
    return value
