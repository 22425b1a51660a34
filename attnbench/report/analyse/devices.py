"""The same cases across the kinds of device of one run (a Ray run that mixed them)."""

from __future__ import annotations

import pandas as pd

from attnbench.report.analyse import derived


def across_devices(ok: pd.DataFrame, names: list[str]) -> pd.DataFrame:
    """Median time_ms of each (case, impl) of a run's ok rows on each device name of
    ``names`` (a column each, in that order; NA: not run there, or not ok); empty for fewer
    than two names or without ok rows."""
    if len(names) < 2 or ok.empty:
        return pd.DataFrame()
    ok = ok.assign(case=ok.apply(derived.case_label, axis=1))
    wide = ok.pivot_table(
        index=["case", "impl"], columns="device_name", values="time_ms", aggfunc="median"
    )
    return wide.reindex(columns=names).reset_index()
