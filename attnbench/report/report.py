"""report.md (plus its figures) for one run, from its results.csv and env.json alone: the
run is analysed once (analysis.py), then each section and figure renders that analysis."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from attnbench.report.analyse.rounds import AnchorRounds, Rounds
from attnbench.report.analysis import DeviceAnalysis, RunAnalysis, analyse
from attnbench.report.decide.tolerance import TOLERANCE
from attnbench.report.plot.drawing import Job, draw_all
from attnbench.report.plot.figures import FIGURES, RUN_FIGURES
from attnbench.report.render import checks, sections
from attnbench.report.render.header import borrowed_lines, counts_line, header_lines
from attnbench.report.render.markdown import wrapped
from attnbench.report.render.opening import first_screen
from attnbench.report.render.patterns import sections as pattern_sections
from attnbench.store.atomic import atomic_dir
from attnbench.store.results import load_run
from attnbench.store.rundir import RunDir


def render(run: RunAnalysis, out_dir: Path, svg: bool = False) -> str:
    """Write the run's figures into out_dir and return the markdown text: every section and
    figure renders the run's analysis (analysis.py), computed once. The figures are drawn
    together at the end (drawing.draw_all), and the text names those that drew."""
    jobs: list[Job] = []
    lines = first_screen(run)
    lines += header_lines(run)
    lines += ["## Summary", "", counts_line(run), ""]
    lines += borrowed_lines(run)
    if len(run.devices) == 1:
        lines += _device_part(run.devices[0], out_dir, svg, "##", jobs)
    else:
        lines += checks.across_devices_section(run)
        for part in run.devices:
            lines += [f"## Device: {part.name}", ""]
            lines += _device_part(part, out_dir, svg, "###", jobs)
    speed = [Job(fig, run, out_dir / fig.stem, svg, optional=True) for fig in RUN_FIGURES]
    drawn = draw_all(jobs + speed)[len(jobs) :]
    lines += _speed_part(speed, drawn)
    lines += _closing(run)
    return "\n".join(wrapped(lines)).rstrip() + "\n"


def _closing(run: RunAnalysis) -> list[str]:
    lines = checks.checks_section(run)
    lines += checks.kernels_section(run.top_kernels)
    return lines + checks.failures_section(run)


def _speed_part(jobs: list[Job], drawn: list[bool]) -> list[str]:
    """The machine's speed over the run (the run's figures: RUN_FIGURES), where it drew."""
    lines = []
    for job, done in zip(jobs, drawn):
        fig = job.figure
        if done:
            lines += [f"## {fig.heading}", "", fig.caption, ""]
            lines += [f"![{fig.heading}]({fig.stem}.png)", ""]
    return lines


def _device_part(
    a: DeviceAnalysis, out_dir: Path, svg: bool, level: str, jobs: list[Job]
) -> list[str]:
    """Winners, speedups, scaling exponents, disagreements and figures of one device's rows
    (figure files named <figure><suffix>.png, appended to ``jobs`` to be drawn)."""
    lines = sections.winners_section(a)
    lines += sections.speedup_section(a)
    lines += sections.exponents_section(a.exponents)
    lines += sections.score_memory_lines(a)
    lines += pattern_sections(a, level)
    lines += sections.disagreement_section(a)
    lines += [f"{level} Plots", ""]
    n = a.figures.one_n
    figures = [
        f
        for f in FIGURES
        if (a.baseline or not f.needs_baseline) and (f.applies is None or f.applies(a))
    ]
    if n is not None:
        against = ", ".join(f.heading.lower() for f in figures if f.over_n)
        why = "need two or more lengths; the tables above hold this run's numbers."
        lines += [f"Every ok row has N = {n}: the figures against N ({against}) {why}", ""]
    for fig in figures:
        if fig.over_n and n is not None:
            continue
        stem = f"{fig.stem}{a.suffix}"
        jobs.append(Job(fig, a, out_dir / stem, svg))
        lines += [f"{level}# {fig.heading}", "", fig.caption, "", f"![{fig.heading}]({stem}.png)"]
        lines += [""]
    return lines


def write_report(
    run_dir,
    reports_dir,
    baseline: str | None = None,
    svg: bool = False,
    tolerance: float = TOLERANCE,
) -> Path:
    """Write <reports_dir>/<run-id>/report.md and its figures; return the report's path.

    Everything is written into a temporary folder beside the target and renamed into place,
    so a reader never sees half a report."""
    run_dir = Path(run_dir)
    df, env = load_run(run_dir)
    run = RunDir(run_dir)
    kernels = pd.read_csv(run.kernels) if run.kernels.exists() else None
    with atomic_dir(run.report_dir(reports_dir)) as tmp:
        analysed = analyse(
            df,
            env,
            run.run_id,
            baseline,
            kernels,
            Rounds.read(run_dir),
            AnchorRounds.read(run_dir),
            tolerance,
        )
        text = render(analysed, tmp, svg)
        (tmp / RunDir.REPORT).write_text(text, encoding="utf-8")
    return run.report(reports_dir)
