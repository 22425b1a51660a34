"""The tables of figures: each figure of a report declared once (file stem, heading,
caption, and how it is drawn): FIGURES from one device's analysis (analysis.DeviceAnalysis,
whose ``figures`` hold what each one draws), RUN_FIGURES from the whole run's
(analysis.RunAnalysis; None where the run has no data for it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from attnbench.report.plot import plots


class Figure(NamedTuple):
    stem: str  # file name without suffix: <stem><device suffix>.png
    heading: str
    caption: str
    draw: Callable  # DeviceAnalysis -> matplotlib Figure (plots.plot_*, looked up when drawn)
    needs_baseline: bool = False  # left out of a run without a baseline impl
    over_n: bool = False  # drawn against N: left out where the ok rows have one N (one_n)
    # cropped to its contents when saved (one more drawing: for one-panel figures whose labels
    # and legend may be wider than grid's slot)
    crop: bool = False
    applies: Callable | None = None  # DeviceAnalysis -> bool; left out where False


FIGURES = (
    Figure(
        "time_vs_seq",
        "Time per call",
        "Median time per call vs N (seq_q; the cache length seq_kv in a decode series) on "
        "log-log axes; the band is the p20–p80 range of the samples. The legend gives the "
        "fitted exponent (≥: overhead-limited, a lower bound).",
        lambda a: plots.plot_time_vs_seq(a.figures.time, colors=a.colors),
        over_n=True,
    ),
    Figure(
        "memory_vs_seq",
        "Peak memory",
        "Peak memory above what was allocated before the call. "
        "An impl that materialises the score matrix grows ~N^2, a tiled one ~N.",
        lambda a: plots.plot_memory_vs_seq(a.figures.memory, colors=a.colors),
        over_n=True,
    ),
    Figure(
        "tflops_vs_seq",
        "Throughput",
        "Matmul FLOPs of the unmasked (query, key) pairs divided by the median time.",
        lambda a: plots.plot_tflops_vs_seq(a.figures.tflops, colors=a.colors),
        over_n=True,
    ),
    Figure(
        "speedup_vs_seq",
        "Speedup vs baseline",
        "Baseline time / impl time, only where both are ok; above 1 is faster than the baseline. "
        "With rounds, paired per round, and the band is its 95% interval (a tie where the band "
        "crosses 1); ringed points rest on contended rows or a wide interval (or, without "
        "rounds, noisy rows).",
        lambda a: plots.plot_speedup_vs_seq(a.figures.speedup, a.baseline, colors=a.colors),
        needs_baseline=True,
        over_n=True,
    ),
    Figure(
        "decode_bandwidth",
        "Decode bandwidth",
        "Decode reads its KV cache once per step: GB/s (bytes the case must move / median time) "
        "vs the cache length, against the device's HBM: the published peak where known "
        "(dashed) and this run's measured copy speed (dotted).",
        lambda a: plots.plot_bandwidth_vs_seq(a.figures.bandwidth, colors=a.colors),
        over_n=True,
        applies=lambda a: a.figures.bandwidth is not None,
    ),
    Figure(
        "error_vs_seq",
        "Numerical error",
        "Worst relative error against the float64 reference; "
        "the dashed line is the agreement bound each row was held to. Circled points disagree.",
        lambda a: plots.plot_error_vs_seq(a.figures.error, colors=a.colors),
        over_n=True,
    ),
    Figure(
        "support_matrix",
        "Support matrix",
        "Rows per status for each impl and case family.",
        lambda a: plots.plot_support_matrix(a.figures.support),
        crop=True,
    ),
    Figure(
        "roofline",
        "Roofline",
        "Achieved TFLOP/s against arithmetic intensity (FLOPs per byte "
        "of the least traffic: q, k, v read and out written once, plus dout and the gradients "
        "with backward), under the ceilings measured at the start of this run.",
        lambda a: plots.plot_roofline(a.figures.roofline, colors=a.colors),
        crop=True,
    ),
)


RUN_FIGURES = (
    Figure(
        "speed_over_time",
        "Machine speed over the run",
        "The speed anchor (a fixed matmul: compute; a copy: memory), timed in every case's "
        "rounds, as the machine's speed relative to the run's first case, over the run's "
        "time; the line is a running median. A throttle or a noisy neighbour shows as a dip.",
        lambda run: (
            None
            if run.speed is None
            else plots.plot_speed_over_time(
                run.speed, device_name=", ".join(d.name for d in run.devices)
            )
        ),
        crop=True,
    ),
)
