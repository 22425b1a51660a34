"""The sweep's progress as rows are written: a progress bar (tqdm) with the last row (and, with
several executors, the rows per device and host), or with --row-lines one line per row."""

from __future__ import annotations

import sys
import textwrap
import time
from collections import Counter

from tqdm import tqdm

REASON_CHARS = 160  # --row-lines: a failed row's reason, shortened between words


class Progress:
    def __init__(self, total: int, progress: bool, row_lines: bool = False, lanes: int = 1):
        self.total, self.row_lines, self.lanes = total, row_lines, lanes
        self.written = 0
        self.per_device: Counter[tuple[str, str]] = Counter()
        self._bar = tqdm(total=total, disable=not progress, unit="row", dynamic_ncols=True)
        self._last_row = time.perf_counter()

    def row(self, row: dict, label: str) -> None:
        """A row was written."""
        self.written += 1
        self.per_device[(row["device_name"], row["host"])] += 1
        self._bar.set_postfix_str(self._postfix(label), refresh=False)
        self._bar.update()
        if self.row_lines:  # with the seconds since the last row (its whole cost)
            now = time.perf_counter()
            print(
                f"[{self.written}/{self.total}] {label}: {_outcome(row)} "
                f"({now - self._last_row:.1f} s)",
                flush=True,
            )
            self._last_row = now

    def _postfix(self, label: str) -> str:
        """The last row; with several executors, also the rows per device and host."""
        if self.lanes < 2:
            return label
        counts = ", ".join(f"{_short(d)}@{h} {n}" for (d, h), n in sorted(self.per_device.items()))
        return f"{counts} | {label}"

    def note(self, line: str) -> None:
        """A line on stderr now, above the progress bar."""
        self._bar.write(line, file=sys.stderr)

    def close(self) -> None:
        self._bar.close()


def _short(name: str, chars: int = 20) -> str:
    return name if len(name) <= chars else name[: chars - 1] + "…"


def _outcome(row: dict) -> str:
    if row["status"] != "ok":  # a long reason shortened between words (the CSV has it whole)
        reason = textwrap.shorten(row["reason"] or "", REASON_CHARS, placeholder=" ...")
        return f"{row['status']} ({reason})"
    agrees = {True: "agrees", False: "DISAGREES", None: "not checked"}[row["agrees"]]
    return f"ok {row['time_ms']:.4g} ms, {agrees}"
