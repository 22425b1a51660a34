"""How much a pick may lose in a case: what the run's noise there cannot tell from no loss, and
never more than the cap (``TOLERANCE``, 1.10x; ``--tolerance`` sets another cap).

The noise of a case is read from the paired per-round interval of its winner's margin (the
runner-up's time over the winner's, verdicts.fastest_agreeing): a ratio measured as r with the
95% interval [lo, hi] is known to within a factor ``sqrt(hi / lo)`` either way, the interval's
half-width. A loss L measured that precisely has an interval reaching down to about
L / sqrt(hi / lo), which contains 1 (no loss) while L <= sqrt(hi / lo). So in a case with 1%
noise a pick may lose 1%, in one with 8% noise 8%, and in none more than the cap: a pick never
hides a loss the run could tell apart, nor one that is too large to matter however noisy the
run. A case without a paired interval (a run without rounds, fewer rounds than an interval
needs, a single agreeing kernel) gets the cap: its noise is not measured, the rule it had
before rounds existed."""

from __future__ import annotations

import numpy as np
import pandas as pd

TOLERANCE = 1.10  # a pick may be at most this much slower than the best in any case of its group


def case_noise(winners: pd.DataFrame) -> pd.Series:
    """Per case (a row of verdicts.fastest_agreeing): the factor its paired interval leaves
    either way, sqrt(margin_hi / margin_lo); NA where there is no interval."""
    lo = pd.to_numeric(winners["margin_lo"], errors="coerce").astype(float)
    hi = pd.to_numeric(winners["margin_hi"], errors="coerce").astype(float)
    usable = (lo > 0) & (hi >= lo)
    return pd.Series(np.sqrt(hi / lo).where(usable), index=winners.index, dtype=float)


def case_tolerance(winners: pd.DataFrame, cap: float = TOLERANCE) -> pd.Series:
    """Per case: the most a pick may lose there, its noise (case_noise) up to ``cap``, and the
    cap where the noise is not measured."""
    return case_noise(winners).clip(upper=cap).fillna(cap)
