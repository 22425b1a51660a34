"""The tables of figures: each figure of a report declared once (file stem, heading,
caption, the plots.py function that draws it and what it draws): FIGURES from one device's
analysis (analysis.DeviceAnalysis, whose ``figures`` hold what each one draws), RUN_FIGURES
from the whole run's (analysis.RunAnalysis). A figure's arguments are picked from the
analysis where it was made and handed, pickled, to the process that draws it (drawing.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple


class Figure(NamedTuple):
    stem: str  # file name without suffix: <stem><device suffix>.png
    heading: str
    caption: str
    plot: str  # the function of plots.py that draws it: plots.<plot>(**args(analysis))
    # analysis -> that function's keyword arguments (what the figure draws, picklable);
    # None where the analysis holds nothing to draw
    args: Callable
    needs_baseline: bool = False  # left out of a run without a baseline impl
    over_n: bool = False  # drawn against N: left out where the ok rows have one N (one_n)
    # cropped to its contents when saved (one more drawing: for one-panel figures whose labels
    # and legend may be wider than grid's slot)
    crop: bool = False
    applies: Callable | None = None  # DeviceAnalysis -> bool; left out where False

    def draw(self, analysis):
        """This figure drawn in this process: a matplotlib Figure, None where the analysis
        holds nothing to draw."""
        from attnbench.report.plot import plots  # pyplot: where figures are drawn

        args = self.args(analysis)
        return None if args is None else getattr(plots, self.plot)(**args)


def _lines(name: str) -> Callable:
    """A line figure's arguments: the analysis' lines for it (DeviceFigures.<name>) and the
    run's impl colours."""
    return lambda a: {"data": getattr(a.figures, name), "colors": a.colors}


FIGURES = (
    Figure(
        "time_vs_seq",
        "Time per call",
        "Median time per call vs N (seq_q; the cache length seq_kv in a decode series) on "
        "log-log axes; the band is the p20–p80 range of the samples. The legend gives the "
        "fitted exponent (≥: overhead-limited, a lower bound).",
        "plot_time_vs_seq",
        _lines("time"),
        over_n=True,
    ),
    Figure(
        "memory_vs_seq",
        "Peak memory",
        "Peak memory above what was allocated before the call. "
        "An impl that materialises the score matrix grows ~N^2, a tiled one ~N.",
        "plot_memory_vs_seq",
        _lines("memory"),
        over_n=True,
    ),
    Figure(
        "tflops_vs_seq",
        "Throughput",
        "Matmul FLOPs of the unmasked (query, key) pairs divided by the median time.",
        "plot_tflops_vs_seq",
        _lines("tflops"),
        over_n=True,
    ),
    Figure(
        "speedup_vs_seq",
        "Speedup vs baseline",
        "Baseline time / impl time, only where both are ok; above 1 is faster than the baseline. "
        "With rounds, paired per round, and the band is its 95% interval (a tie where the band "
        "crosses 1); ringed points rest on contended rows or a wide interval (or, without "
        "rounds, noisy rows).",
        "plot_speedup_vs_seq",
        lambda a: {"data": a.figures.speedup, "baseline": a.baseline, "colors": a.colors},
        needs_baseline=True,
        over_n=True,
    ),
    Figure(
        "decode_bandwidth",
        "Decode bandwidth",
        "Decode reads its KV cache once per step: GB/s (bytes the case must move / median time) "
        "vs the cache length, against the device's HBM: the published peak where known "
        "(dashed) and this run's measured copy speed (dotted).",
        "plot_bandwidth_vs_seq",
        _lines("bandwidth"),
        over_n=True,
        applies=lambda a: a.figures.bandwidth is not None,
    ),
    Figure(
        "error_vs_seq",
        "Numerical error",
        "Worst relative error against the float64 reference; "
        "the dashed line is the agreement bound each row was held to. Circled points disagree.",
        "plot_error_vs_seq",
        _lines("error"),
        over_n=True,
    ),
    Figure(
        "support_matrix",
        "Support matrix",
        "Rows per status for each impl and case family.",
        "plot_support_matrix",
        lambda a: {"grid": a.figures.support},
        crop=True,
    ),
    Figure(
        "roofline",
        "Roofline",
        "Achieved TFLOP/s against arithmetic intensity (FLOPs per byte "
        "of the least traffic: q, k, v read and out written once, plus dout and the gradients "
        "with backward), under the ceilings measured at the start of this run.",
        "plot_roofline",
        lambda a: {"data": a.figures.roofline, "colors": a.colors},
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
        "plot_speed_over_time",
        lambda run: (
            None
            if run.speed is None
            else {"series": run.speed, "device_name": ", ".join(d.name for d in run.devices)}
        ),
        crop=True,
    ),
)
