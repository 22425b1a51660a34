"""The sweep's one writer: each row's samples, then its kernels, then the row (the row is the
commit point), each flushed and fsynced; a case's speed-anchor samples with its first row; a
case's drawn data before its first row; a failed row's full error to the errors log. The rows
and the drawn data come complete (run/complete.py), the lines of each file are the store's
(store/results.py): the writer only writes. The progress display is run/progress.py."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from attnbench.run.measuring.failed import Measured
from attnbench.run.progress import Progress
from attnbench.store.results import (
    anchor_writer,
    kernel_lines,
    kernels_writer,
    row_writer,
    sample_lines,
    samples_writer,
)
from attnbench.store.rundir import RunDir, append_line


class Writer:
    """The one writer: samples, then kernels, then the row (the row is the commit point)."""

    def __init__(self, run_dir: Path, progress: Progress):
        self.run_dir, self.progress = run_dir, progress
        self.rows: list[dict] = []
        self.error: BaseException | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> Writer:
        self._out = row_writer(self.run_dir)
        self._samples = samples_writer(self.run_dir)
        self._kernels = kernels_writer(self.run_dir)
        self._anchor = anchor_writer(self.run_dir)
        return self

    def draws(self, record: dict | None) -> None:
        """A case's drawn data (Completer.draws: None when it has none to write) to the draws
        file, before its first row."""
        if record is not None:
            with self._lock:
                append_line(RunDir(self.run_dir).draws, json.dumps(record) + "\n")

    def write(self, measured: Measured, label: str, anchor: list[dict] = ()) -> None:
        """A complete row with its samples, kernels and error, and its case's ``anchor``
        samples when it is the case's first row to carry them."""
        row, times, kernels = measured.row, measured.times, measured.kernels
        with self._lock:
            if measured.error:  # before the row, which names the file
                append_line(
                    RunDir(self.run_dir).errors,
                    f"== {label} ({row['status']}) ==\n{measured.error.rstrip()}\n\n",
                )
            self._anchor.write(list(anchor))
            self._samples.write(sample_lines(row, times, measured.rounds))
            self._kernels.write(kernel_lines(row, kernels))
            self._out.write(row)
            self.rows.append(row)
            self.progress.row(row, label)

    def note(self, line: str) -> None:
        """A line for the terminal now (an executor lost, its replacement), above the
        progress bar, on stderr."""
        with self._lock:
            self.progress.note(line)

    def __exit__(self, *exc) -> None:
        self.progress.close()
        for appender in (self._out, self._samples, self._kernels, self._anchor):
            try:
                appender.close()
            except OSError:  # its unwritten tail (a full disk): the first error is the one
                if self.error is None and exc[0] is None:
                    raise
