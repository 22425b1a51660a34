"""The sweep's one writer: each row's samples, then its kernels, then the row (the row is the
commit point), each flushed and fsynced; a case's drawn data before its first row; a failed
row's full error to the errors log; the progress bar or --row-lines."""

from __future__ import annotations

import json
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

from tqdm import tqdm

from attnbench.case import Case
from attnbench.registry import Impl
from attnbench.run.failed import Measured
from attnbench.run.inputs import draws
from attnbench.store.results import (
    AnchorLog,
    kernels_writer,
    row_writer,
    samples_writer,
)
from attnbench.store.rundir import RunDir, append_line

REASON_CHARS = 160  # --row-lines: a failed row's reason, shortened between words


class Writer:
    """The one writer: samples, then kernels, then the row (the row is the commit point)."""

    def __init__(
        self,
        run_dir: Path,
        run_id: str,
        seed: int,
        total: int,
        progress: bool,
        row_lines: bool = False,
        lanes: int = 1,
    ):
        self.run_dir, self.run_id, self.seed = run_dir, run_id, seed
        self.total, self.row_lines, self.lanes = total, row_lines, lanes
        self.rows: list[dict] = []
        self.per_device: Counter[tuple[str, str]] = Counter()
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._bar = tqdm(total=total, disable=not progress, unit="row", dynamic_ncols=True)
        self._last_row = time.perf_counter()

    def __enter__(self) -> Writer:
        self._out = row_writer(self.run_dir)
        self._samples = samples_writer(self.run_dir)
        self._kernels = kernels_writer(self.run_dir)
        self._anchor = AnchorLog(self.run_dir)
        self._drawn = set(RunDir(self.run_dir).read_draws())  # a resumed run's cases keep theirs
        return self

    def draws(self, case: Case, impls: list[Impl]) -> None:
        """The case's drawn data to the draws file, once per case (before its first row)."""
        if case.label() in self._drawn:
            return
        paged = any(i.paged and not i.reasons(case) for i in impls)
        record = draws(case, self.seed, paged=paged)
        with self._lock:
            if record is not None and case.label() not in self._drawn:
                append_line(RunDir(self.run_dir).draws, json.dumps(record) + "\n")
            self._drawn.add(case.label())

    def write(self, measured: Measured, label: str) -> None:
        row, times, kernels = measured.row, measured.times, measured.kernels
        row.update(run_id=self.run_id, seed=self.seed)
        with self._lock:
            if measured.error:  # before the row, which names the file
                append_line(
                    RunDir(self.run_dir).errors,
                    f"== {label} ({row['status']}) ==\n{measured.error.rstrip()}\n\n",
                )
            if row["status"] == "ok" and measured.anchor:
                row.update(self._anchor.speeds(row, measured.anchor))
            self._samples.write(
                [
                    {**row, "sample": i, "round": r, "time_ms": t}
                    for i, (t, r) in enumerate(zip(times, measured.rounds))
                ]
            )
            self._kernels.write([{**row, **k} for k in kernels])
            self._out.write(row)
            self.rows.append(row)
            self.per_device[(row["device_name"], row["host"])] += 1
            self._bar.set_postfix_str(self._postfix(label), refresh=False)
            self._bar.update()
            if self.row_lines:  # with the seconds since the last row (its whole cost)
                now = time.perf_counter()
                print(
                    f"[{len(self.rows)}/{self.total}] {label}: {_outcome(row)} "
                    f"({now - self._last_row:.1f} s)",
                    flush=True,
                )
                self._last_row = now

    def note(self, line: str) -> None:
        """A line for the terminal now (an executor lost, its replacement), above the
        progress bar, on stderr."""
        with self._lock:
            self._bar.write(line, file=sys.stderr)

    def _postfix(self, label: str) -> str:
        """The last row; with several executors, also the rows per device and host."""
        if self.lanes < 2:
            return label
        counts = ", ".join(f"{_short(d)}@{h} {n}" for (d, h), n in sorted(self.per_device.items()))
        return f"{counts} | {label}"

    def __exit__(self, *exc) -> None:
        self._bar.close()
        for appender in (self._out, self._samples, self._kernels, self._anchor):
            appender.close()


def _short(name: str, chars: int = 20) -> str:
    return name if len(name) <= chars else name[: chars - 1] + "…"


def _outcome(row: dict) -> str:
    if row["status"] != "ok":  # a long reason shortened between words (the CSV has it whole)
        reason = textwrap.shorten(row["reason"] or "", REASON_CHARS, placeholder=" ...")
        return f"{row['status']} ({reason})"
    agrees = {True: "agrees", False: "DISAGREES", None: "not checked"}[row["agrees"]]
    return f"ok {row['time_ms']:.4g} ms, {agrees}"
