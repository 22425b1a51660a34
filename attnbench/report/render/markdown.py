"""A small GitHub-markdown table writer (no tabulate dependency)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import pandas as pd

MISSING = "–"
MAX_CELL = 160  # characters of one table cell; the rest is cut, so that no row runs on
MAX_LINE = 400  # a report line's characters; a longer paragraph is broken between sentences


def cell(value, fmt: str = ".3g", max_chars: int | None = MAX_CELL) -> str:
    """One cell: missing values become an en dash, never a number; text past ``max_chars``
    is cut."""
    if value is None or value is pd.NA or value is pd.NaT:
        return MISSING
    if isinstance(value, float) and math.isnan(value):
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return format(value, fmt)
    text = str(value).replace("\n", " ").replace("\r", " ")
    if max_chars and len(text) > max_chars:
        text = text[: max_chars - 1].rstrip() + "…"
    return text.replace("|", "\\|")


def table(
    df: pd.DataFrame,
    columns: dict[str, str] | None = None,
    formats: dict[str, str | Callable] | None = None,
    default_fmt: str = ".3g",
    max_cell: int | None = MAX_CELL,
) -> str:
    """``df`` as a markdown table. ``columns`` maps column -> header (and picks/orders them);
    ``formats`` maps column -> a format spec or a function of the value; ``max_cell``: the
    characters a cell keeps (None: all, for a cell that must be whole, as a command)."""
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
                text = MISSING if _missing(value) else cell(fmt(value), max_chars=max_cell)
            else:
                text = cell(_plain(value), fmt, max_cell)
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


def folded(summary: str, lines: list[str]) -> list[str]:
    """``lines`` folded under ``summary`` (an HTML <details> block, closed by default): long
    tables and per-case lists below the first screen, so that a reader opens what they need."""
    if not lines:
        return []
    return ["<details>", f"<summary>{summary}</summary>", "", *lines, "", "</details>", ""]


FOLD_ROWS = 20  # a table longer than this is folded: it would push what follows off the screen


def fold_long(summary: str, lines: list[str], n_rows: int) -> list[str]:
    """``lines`` (a table of ``n_rows`` rows) as they are, or folded under ``summary`` when
    longer than FOLD_ROWS rows."""
    if n_rows <= FOLD_ROWS:
        return [*lines, ""]
    return folded(f"{summary} ({n_rows} rows)", lines)


def wrapped(lines: list[str]) -> list[str]:
    """The report's lines with every paragraph over MAX_LINE characters broken between its
    sentences (or clauses) into lines of at most MAX_LINE where it can: markdown renders
    them the same, and a reader of the text file meets no line of thousands of characters.
    Tables, headings, HTML and images stay as they are."""
    out = []
    for line in lines:
        if len(line) <= MAX_LINE or line.startswith(("|", "#", "<", "!")):
            out.append(line)
            continue
        indent = "  " if line.startswith(("- ", "  ")) else ""
        indent = "> " if line.startswith("> ") else indent
        pieces = re.split(r"(?<=[.;:)]) (?=[A-Z(`*])", line)
        if max(map(len, pieces)) > MAX_LINE:  # a long clause: break between its clauses
            pieces = [p for piece in pieces for p in re.split(r"(?<=[;,]) ", piece)]
        said = pieces[0]
        for piece in pieces[1:]:
            if len(said) + 1 + len(piece) > MAX_LINE:
                out.append(said)
                said = indent + piece
            else:
                said += " " + piece
        out.append(said)
    return out
