"""A run's analysis, computed once and handed to every section and figure of its report:
series, fits, families, winners, speedups, recommendations; one part per kind of device."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import pandas as pd

from attnbench.report.analyse import derived, patterns, scaling
from attnbench.report.analyse.agreement import Agreement, agreement
from attnbench.report.analyse.coverage import Coverage, borrowed_kernels, coverage
from attnbench.report.analyse.devices import across_devices
from attnbench.report.analyse.exponents import Exponents, exponent_table
from attnbench.report.analyse.failures import Failures, failures
from attnbench.report.analyse.figure_data import (
    DeviceFigures,
    SpeedSeries,
    device_figures,
    speed_series,
)
from attnbench.report.analyse.machine import busy_machine, device_title
from attnbench.report.analyse.measurement import MeasurementChecks, measurement_checks
from attnbench.report.analyse.rounds import AnchorRounds, Rounds
from attnbench.report.analyse.score_memory import score_peaks
from attnbench.report.decide import verdicts
from attnbench.report.decide.by_family import SpeedupTable, speedup_table, who_wins
from attnbench.report.decide.parts import part_verdicts
from attnbench.report.decide.recommend import recommendations
from attnbench.report.decide.tolerance import TOLERANCE
from attnbench.report.plot.style import run_colors


@dataclass(frozen=True)
class DeviceAnalysis:
    """Everything the per-device sections and figures show, for one device's rows."""

    name: str  # the device as figures title it (a busy machine says so)
    suffix: str  # figure files are <stem><suffix>.png ("" for a run on one device)
    env: dict  # the run's env.json, with this device's ceilings
    baseline: str | None  # the impl speedups are relative to
    frame: pd.DataFrame  # its rows, with seq_kv_rule, seq_n (derived.with_series), family
    colors: dict  # impl -> colour, alike in every figure of the run
    families: list  # case families, fwd before bwd, then by name
    fits: pd.DataFrame  # scaling.scaling_exponents, with each series' label (``series``)
    winners: pd.DataFrame  # verdicts.fastest_agreeing: one row per case
    wins: pd.DataFrame  # verdicts.wins_by_family
    speedups: pd.DataFrame | None  # verdicts.speedups; None without a baseline with ok rows
    rounds: Rounds | None  # the run's per-round medians (None: a run without rounds)
    waste: pd.DataFrame  # patterns.wasted_work (empty without pattern masks)
    sparsity: pd.DataFrame  # patterns.sparsity_fits, with each series' label
    # what the analysis sections (render/sections.py) show, each derived here once
    who_wins: tuple = ()  # by_family.FamilyWins per case family, in family order
    speedup_table: SpeedupTable | None = None  # by_family.speedup_table of speedups
    exponents: Exponents | None = None  # exponents.exponent_table of fits
    score_peaks: pd.DataFrame | None = None  # score_memory.score_peaks: N² buffers held
    agreement: Agreement | None = None  # agreement.agreement: rows that disagree, precision
    figures: DeviceFigures | None = None  # figure_data.device_figures: what each figure draws


@dataclass(frozen=True)
class RunAnalysis:
    run_id: str
    env: dict
    frame: pd.DataFrame  # every row of the run
    baseline: str | None
    recommendations: pd.DataFrame
    devices: tuple  # DeviceAnalysis per kind of device (one unless a Ray run mixed them)
    kernels: pd.DataFrame | None  # kernels.csv (--profile), or None
    anchor: AnchorRounds | None = None  # the speed anchor (anchor.csv), or None
    tolerance: float = TOLERANCE  # the cap on what a pick may lose in a case (tolerance.py)
    # the verdict lines: the recommendations per model and part (parts.part_verdicts)
    verdicts: tuple = ()
    # what the first screen, header, summary and closing sections state (analyse/coverage,
    # measurement, failures, devices); analyse() fills every one
    coverage: Coverage | None = None  # rows per status, impls and phases not run, rounds
    checks: MeasurementChecks | None = None  # the ok rows whose measurement is in doubt
    failures: Failures | None = None  # the non-ok rows by cause
    across_devices: pd.DataFrame | None = None  # median time per case, impl and device
    top_kernels: pd.DataFrame | None = None  # derived.kernel_table of kernels.csv (--profile)
    # the speed anchor's series per resource, as its figure draws them; None: no anchor
    speed: tuple[SpeedSeries, ...] | None = None


@dataclass(frozen=True)
class FigureSubject:
    """What one device's figures draw (plot/figures.py reads these fields, alike on a
    DeviceAnalysis), ready before the rest of its analysis: handed to ``analyse``'s
    ``on_figures`` so that the figures are drawn while the analysis goes on."""

    suffix: str
    baseline: str | None
    colors: dict
    figures: DeviceFigures


def analyse_device(
    df: pd.DataFrame,
    env: dict | None = None,
    baseline: str | None = None,
    name: str | None = None,
    suffix: str = "",
    rounds: Rounds | None = None,
    on_figures=None,
) -> DeviceAnalysis:
    """One device's analysis. Its figures' data come first, handed to ``on_figures`` (a
    callable taking a FigureSubject) where given, then the rest."""
    env = env or {}
    name = name or device_title(env, df)
    if busy_machine(env):
        name += f" · BUSY machine: load {env['load_avg_1m']} on {env['cpu_count']} cores"
    frame = derived.with_series(df)
    frame = frame.assign(family=derived.case_family(frame))
    fits = scaling.scaling_exponents(frame)
    fits = fits.assign(series=derived.series_labels(fits))
    has_base = baseline and derived.ok_rows(frame[frame["impl"] == baseline]).shape[0]
    recorded = baseline == env.get("baseline")  # the rows' own speedups are against it
    speedups = verdicts.speedups(frame, baseline, rounds, recorded) if has_base else None
    colors = run_colors(env, frame["impl"].dropna().unique())
    figures = device_figures(frame, env, fits, speedups, baseline, name)
    if on_figures is not None:
        on_figures(FigureSubject(suffix, baseline, colors, figures))
    sparsity = patterns.sparsity_fits(frame)
    sparsity = sparsity.assign(series=derived.series_labels(sparsity, always=("mask", "pattern")))
    winners = verdicts.fastest_agreeing(frame, rounds)
    a = DeviceAnalysis(
        name=name,
        suffix=suffix,
        env=env,
        baseline=baseline,
        frame=frame,
        colors=colors,
        families=derived.family_order(frame),
        fits=fits,
        winners=winners,
        wins=verdicts.wins_by_family(winners),
        speedups=speedups,
        rounds=rounds,
        waste=patterns.wasted_work(frame),
        sparsity=sparsity,
        figures=figures,
    )
    return replace(a, **_shown(a))


def _shown(a: DeviceAnalysis) -> dict:
    """The fields of a DeviceAnalysis that its analysis sections (render/sections.py) show."""
    # impls that ran PyTorch's kernels, said where they win (a frame without backends: none)
    borrowed = (
        set(a.frame.loc[borrowed_kernels(a.frame), "impl"]) if "backend" in a.frame else set()
    )
    impls = tuple(sorted(a.frame["impl"].dropna().unique()))
    return {
        "who_wins": who_wins(a.winners, a.wins, a.families, borrowed),
        "speedup_table": speedup_table(a.speedups, a.baseline, a.families, impls),
        "exponents": exponent_table(a.fits),
        "score_peaks": score_peaks(a.frame),
        "agreement": agreement(a.frame),
    }


def device_names(df: pd.DataFrame) -> list[str]:
    if "device_name" not in df:
        return []
    return sorted(map(str, df["device_name"].dropna().unique()))


def analyse(
    df: pd.DataFrame,
    env: dict,
    run_id: str,
    baseline: str | None = None,
    kernels: pd.DataFrame | None = None,
    rounds: Rounds | None = None,
    anchor: AnchorRounds | None = None,
    tolerance: float = TOLERANCE,
    on_figures=None,
) -> RunAnalysis:
    """The whole run's derived. ``baseline``: the impl speedups are relative to (default:
    the one the run recorded); ``rounds`` and ``anchor``: the run's per-round times;
    ``on_figures``: called with each device's FigureSubject as soon as it exists."""
    baseline = baseline or env.get("baseline")
    names = device_names(df)
    if len(names) < 2:
        devices = (analyse_device(df, env, baseline, rounds=rounds, on_figures=on_figures),)
    else:  # several kinds of device (a Ray run): every analysis and figure per device
        devices = tuple(
            analyse_device(
                df[df["device_name"] == name],
                {**env, "ceilings": _ceilings(env, name)},
                baseline,
                name,
                "__" + re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_"),
                rounds,
                on_figures,
            )
            for name in names
        )
    # the picks decide from the winners computed once; a run mixing devices picks over all rows
    winners = devices[0].winners if len(devices) == 1 else None
    rec = recommendations(df, rounds, tolerance, winners)
    return RunAnalysis(
        run_id=run_id,
        env=env,
        frame=df,
        baseline=baseline,
        recommendations=rec,
        devices=devices,
        kernels=kernels,
        anchor=anchor,
        tolerance=tolerance,
        verdicts=part_verdicts(rec),
        **_stated(df, env, run_id, names, kernels),
        speed=None if anchor is None else speed_series(anchor.series),
    )


def _stated(df: pd.DataFrame, env: dict, run_id: str, names: list, kernels) -> dict:
    """RunAnalysis's fields that the first screen, header, summary and closing sections
    state, over every row of the run (its ok rows read once)."""
    ok = derived.ok_rows(df)
    return {
        "coverage": coverage(df, ok, env, run_id),
        "checks": measurement_checks(ok, env),
        "failures": failures(df),
        "across_devices": across_devices(ok, names),
        "top_kernels": None if kernels is None or kernels.empty else derived.kernel_table(kernels),
    }


def _ceilings(env: dict, name: str):
    return (env.get("devices") or {}).get(name, {}).get("ceilings") or env.get("ceilings")
