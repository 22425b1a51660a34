"""report.md (plus its figures) for one run, from its results.csv and env.json alone: the
run is analysed once (analysis.py), then each section and figure renders that analysis."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from attnbench.report.analyse.rounds import AnchorRounds, Rounds
from attnbench.report.analysis import DeviceAnalysis, FigureSubject, RunAnalysis, analyse
from attnbench.report.decide.tolerance import TOLERANCE
from attnbench.report.plot.drawing import Drawing, Drawn, Job
from attnbench.report.plot.figures import FIGURES, RUN_FIGURES, Figure
from attnbench.report.render import checks, sections
from attnbench.report.render.header import borrowed_lines, counts_line, header_lines
from attnbench.report.render.markdown import wrapped
from attnbench.report.render.opening import first_screen
from attnbench.report.render.patterns import sections as pattern_sections
from attnbench.store.atomic import atomic_dir
from attnbench.store.results import load_run
from attnbench.store.rundir import RunDir


def render(
    run: RunAnalysis, handed: list, out_dir: Path, drawing: Drawing, svg: bool = False
) -> str:
    """Write the run's figures into out_dir and return the markdown text: every section and
    figure renders the run's analysis (analysis.py), computed once. Each device's figures
    were handed to ``drawing`` as soon as their data existed (``handed``: one list per
    device, from ``_device_figures``), drawn while the analysis went on and the text is
    rendered, and are waited for last: the text shows each one that drew and says why any
    other did not."""
    devices = list(zip(run.devices, handed, strict=True))
    speed = [  # the run's figures where it has data for them
        (fig, drawing.draw(_job(fig, run, out_dir / fig.stem, svg)))
        for fig in RUN_FIGURES
        if fig.args(run) is not None
    ]
    lines = first_screen(run)
    lines += header_lines(run)
    lines += ["## Summary", "", counts_line(run), ""]
    lines += borrowed_lines(run)
    level = "##" if len(devices) == 1 else "###"
    parts = [(a, _device_sections(a, level), figures) for a, figures in devices]
    closing = _closing(run)
    if len(devices) > 1:
        lines += checks.across_devices_section(run)
    for a, sections_lines, figures in parts:  # the figures are waited for from here on
        lines += [f"## Device: {a.name}", ""] if len(devices) > 1 else []
        lines += sections_lines + _plots_part(a, figures, level)
    for fig, drawn in speed:
        lines += _figure_lines(fig, "##", drawn)
    lines += closing
    return "\n".join(wrapped(lines)).rstrip() + "\n"


def _closing(run: RunAnalysis) -> list[str]:
    lines = checks.checks_section(run)
    lines += checks.kernels_section(run.top_kernels)
    return lines + checks.failures_section(run)


def _device_sections(a: DeviceAnalysis, level: str) -> list[str]:
    """Winners, speedups, scaling exponents, disagreements of one device's rows."""
    lines = sections.winners_section(a)
    lines += sections.speedup_section(a)
    lines += sections.exponents_section(a.exponents)
    lines += sections.score_memory_lines(a)
    lines += pattern_sections(a, level)
    return lines + sections.disagreement_section(a)


def _applying(a: FigureSubject | DeviceAnalysis) -> list[Figure]:
    """The figures one device's rows have data for (a baseline's, decode rows)."""
    return [
        fig
        for fig in FIGURES
        if (a.baseline or not fig.needs_baseline) and (fig.applies is None or fig.applies(a))
    ]


def _device_figures(a: FigureSubject, out_dir: Path, svg: bool, drawing: Drawing) -> list:
    """One device's figures handed to ``drawing`` (files named <figure><suffix>.png), none
    against N where every ok row has one N."""
    one_n = a.figures.one_n is not None
    return [
        (fig, drawing.draw(_job(fig, a, out_dir / f"{fig.stem}{a.suffix}", svg)))
        for fig in _applying(a)
        if not (fig.over_n and one_n)
    ]


def _job(fig: Figure, subject, path: Path, svg: bool) -> Job:
    return Job(fig.plot, fig.args(subject), path, svg, fig.crop)


def _plots_part(a: DeviceAnalysis, figures: list, level: str) -> list[str]:
    """One device's plots, each waited for: its figure, or why it did not draw."""
    lines = [f"{level} Plots", ""]
    if (n := a.figures.one_n) is not None:
        against = ", ".join(f.heading.lower() for f in _applying(a) if f.over_n)
        why = "need two or more lengths; the tables above hold this run's numbers."
        lines += [f"Every ok row has N = {n}: the figures against N ({against}) {why}", ""]
    for fig, drawn in figures:
        lines += _figure_lines(fig, f"{level}#", drawn)
    return lines


def _figure_lines(fig: Figure, level: str, drawn: Drawn) -> list[str]:
    """A figure's heading, caption and image; where it did not draw, why instead."""
    lines = [f"{level} {fig.heading}", "", fig.caption, ""]
    stem = drawn.job.path.name
    if (reason := drawn.reason()) is None:
        return lines + [f"![{fig.heading}]({stem}.png)", ""]
    print(f"attnbench report: {stem}.png not drawn: {reason}", file=sys.stderr)
    return lines + [f"Not drawn: {reason}", ""]


def write_report(
    run_dir,
    reports_dir,
    baseline: str | None = None,
    svg: bool = False,
    tolerance: float = TOLERANCE,
) -> Path:
    """Write <reports_dir>/<run-id>/report.md and its figures; return the report's path.

    Everything is written into a temporary folder beside the target and renamed into place,
    so a reader never sees half a report. A figure that fails does not fail the report: its
    place says why (drawing.Drawn.reason), and so does a line on stderr."""
    run_dir = Path(run_dir)
    df, env = load_run(run_dir)
    run = RunDir(run_dir)
    kernels = pd.read_csv(run.kernels) if run.kernels.exists() else None
    # the drawing processes start first, and draw each device's figures once their data exist
    with atomic_dir(run.report_dir(reports_dir)) as tmp, Drawing() as drawing:
        handed = []  # per device, its figures handed to the drawing processes

        def hand_over(subject: FigureSubject) -> None:
            handed.append(_device_figures(subject, tmp, svg, drawing))

        analysed = analyse(
            df,
            env,
            run.run_id,
            baseline,
            kernels,
            Rounds.read(run_dir),
            AnchorRounds.read(run_dir),
            tolerance,
            hand_over,
        )
        text = render(analysed, handed, tmp, drawing, svg)
        (tmp / RunDir.REPORT).write_text(text, encoding="utf-8")
    return run.report(reports_dir)
