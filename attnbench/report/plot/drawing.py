"""Drawing a report's figures in processes of their own, started before the run is analysed.

matplotlib draws on one core, and a report's figures are independent of one another and of
its text. So ``Drawing`` imports pyplot, then forks its processes (one per core, at most one
per figure a report draws): they share that one import (each importing it itself cost twice
the CPU, on the cores the analysis runs on). Each figure is then handed over once the run is
analysed (a ``Job``: the plots.py function and its arguments, pickled), drawn while the text
is rendered, and waited for last.

A figure that fails, or whose process dies, leaves no file and gives a one-line reason
(``Drawn.reason``) instead: the report is still written, and says why the figure is not
there. Where there is one core, or no fork, the figures are drawn here, one after another."""

from __future__ import annotations

import gc
import multiprocessing
import os
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import NamedTuple

from attnbench.report.plot.figures import FIGURES, RUN_FIGURES

MAX_PROCESSES = len(FIGURES) + len(RUN_FIGURES)  # the most figures a one-device report draws
REASON_CHARS = 200  # a failed figure's reason is cut here: it is said on one line


class Job(NamedTuple):
    plot: str  # the function of plots.py that draws the figure
    args: dict  # its keyword arguments: what the figure draws (figures.Figure.args)
    path: Path  # file stem: <path>.png (and .svg)
    svg: bool
    crop: bool  # cropped to its contents (figures.Figure.crop)

    def files(self) -> list[Path]:
        return [self.path.with_suffix(".png")] + ([self.path.with_suffix(".svg")] * self.svg)


def _start() -> None:
    """A drawing process' first step: every object it has (the report process' heap, pyplot
    with it) frozen out of the garbage collector's view. Drawing makes enough objects for the
    collector's full pass to run (twice for the default sweep's figures), and each one walked
    that whole heap, copying every page it touched: 0.4 s of 4 with torch imported, 0.1 s
    frozen."""
    gc.freeze()


def _draw(job: Job) -> None:
    from attnbench.report.plot import plots

    fig = getattr(plots, job.plot)(**job.args)
    plots.save_figure(fig, job.path, svg=job.svg, crop=job.crop)


class Drawn(NamedTuple):
    """A figure handed to ``Drawing``, drawn or on its way."""

    job: Job
    future: Future

    def reason(self) -> str | None:
        """None once the figure is drawn and saved (waiting for it), else why it is not:
        its error in one line, its files removed."""
        error = self.future.exception()
        if error is None:
            return None
        for path in self.job.files():
            path.unlink(missing_ok=True)
        text = " ".join(str(error).split()) or "no message"
        return f"{type(error).__name__}: {text}"[:REASON_CHARS]


def processes() -> int:
    """How many drawing processes: one per core this process may run on, none (drawn here)
    where that is one or fork does not exist."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    if cores < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return 0
    return min(cores, MAX_PROCESSES)


class Drawing:
    """The figures of one report, drawn in forked processes (``processes``) from the moment
    it is entered; on leaving, every figure handed over has been drawn or has failed."""

    def __init__(self):
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> Drawing:
        if n := processes():
            from attnbench.report.plot import plots  # noqa: F401  (pyplot, for every process)

            self._pool = ProcessPoolExecutor(
                n, mp_context=multiprocessing.get_context("fork"), initializer=_start
            )
            self._pool.submit(int)  # forks every process now (fork starts them all at once)
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def draw(self, job: Job) -> Drawn:
        """Hand ``job`` over: drawn in a drawing process, or here and now without one (or
        once one has died: the pool is broken then)."""
        if self._pool is not None:
            try:
                return Drawn(job, self._pool.submit(_draw, job))
            except BrokenProcessPool:  # a process died: the figures left are drawn here
                self._pool.shutdown()
                self._pool = None
        future = Future()
        try:
            _draw(job)
            future.set_result(None)
        except Exception as error:  # noqa: BLE001 - any failure is the figure's reason
            future.set_exception(error)
        return Drawn(job, future)
