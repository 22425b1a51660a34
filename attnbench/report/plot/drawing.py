"""Drawing a report's figures, one figure per process where the machine has cores to spare:
matplotlib draws on one core, and a report's seven figures per device are independent. The
processes are forked, so each one reads the analysis it inherits; nothing is pickled but a
job's index and whether it drew."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path
from typing import NamedTuple

from attnbench.report.plot import plots


class Job(NamedTuple):
    figure: object  # figures.Figure
    subject: object  # what its draw takes: a DeviceAnalysis or the RunAnalysis
    path: Path  # file stem: <path>.png (and .svg)
    svg: bool
    optional: bool = False  # a run figure, whose draw gives None where it has no data


_JOBS: list[Job] = []  # the jobs of the current draw_all, inherited by its forked processes


def _draw(i: int) -> bool:
    """Draw and save job ``i``; False where an optional figure has nothing to draw."""
    job = _JOBS[i]
    fig = job.figure.draw(job.subject)
    if fig is None and job.optional:
        return False
    plots.save_figure(fig, job.path, svg=job.svg, crop=job.figure.crop)
    return True


def draw_all(jobs: list[Job]) -> list[bool]:
    """Each job drawn and saved (in parallel processes where fork exists and there are two
    or more cores), and per job whether it drew."""
    global _JOBS
    _JOBS = list(jobs)
    try:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        methods = multiprocessing.get_all_start_methods()
        if len(jobs) < 2 or cores < 2 or "fork" not in methods:
            return [_draw(i) for i in range(len(jobs))]
        with multiprocessing.get_context("fork").Pool(min(cores, len(jobs))) as pool:
            return pool.map(_draw, range(len(jobs)), chunksize=1)
    finally:
        _JOBS = []
