"""Paired comparisons over interleaved rounds: the impls of a case are timed in the same rounds,
so a round's ratio of two impls sees the machine at one speed, and the machine's drift
cancels. A ratio is the median of the per-round ratios, with a bootstrap interval over rounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

CONFIDENCE = 0.95  # of every interval this module gives
BOOTSTRAP_DRAWS = 2000
MIN_ROUNDS = 3  # fewer rounds than this give no interval


class Ratio(NamedTuple):
    value: float  # median of the per-round ratios
    lo: float | None  # the interval's bounds (None with fewer than MIN_ROUNDS rounds)
    hi: float | None

    @property
    def tie(self) -> bool:
        """The interval contains 1: the data cannot tell the two apart."""
        return self.lo is None or self.lo <= 1.0 <= self.hi


def round_medians(samples_ms: Sequence[float], rounds: Sequence[int]) -> dict[int, float]:
    """round -> the median of that round's samples."""
    samples, index = np.asarray(samples_ms, dtype=float), np.asarray(rounds)
    return {int(r): float(np.median(samples[index == r])) for r in np.unique(index)}


def ratio(
    numerator: dict[int, float], denominator: dict[int, float], seed: int = 0
) -> Ratio | None:
    """numerator / denominator paired by round (e.g. baseline time / impl time: the impl's
    speedup), over the rounds both have; None when they share no round."""
    shared = sorted(set(numerator) & set(denominator))
    if not shared:
        return None
    per_round = np.array([numerator[r] / denominator[r] for r in shared])
    value = float(np.median(per_round))
    if len(per_round) < MIN_ROUNDS:
        return Ratio(value, None, None)
    lo, hi = bootstrap_interval(per_round, seed)
    return Ratio(value, lo, hi)


def bootstrap_interval(values: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """The percentile bootstrap interval of the median of ``values`` (resampled with
    replacement; a fixed seed, so the same data give the same interval)."""
    rng = np.random.default_rng(seed)
    draws = rng.choice(values, size=(BOOTSTRAP_DRAWS, len(values)), replace=True)
    medians = np.median(draws, axis=1)
    tail = (1 - CONFIDENCE) / 2 * 100
    return float(np.percentile(medians, tail)), float(np.percentile(medians, 100 - tail))
