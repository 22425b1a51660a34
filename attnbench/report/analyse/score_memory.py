"""How many score matrices a series' peak memory holds at its largest N: B·Hq·Sq·Skv
elements of the case's dtype. Only series whose queries grow with N count: a decode series
(N the cache, Sq fixed) holds an O(N) score row, and what else its peak holds (a
GQA-expanded K/V copy) is not scores."""

from __future__ import annotations

import pandas as pd

from attnbench.report.analyse.derived import DTYPE_BYTES, SERIES_KEY, ok_rows, series_labels


def score_peaks(frame: pd.DataFrame) -> pd.DataFrame:
    """Per series of op rows with Sq = N (a with_series frame) whose peak at its largest N
    is a score matrix or more: impl, its label (``series``), ``seq_n`` and ``ratio``, the
    peak in score matrices; sorted by impl and label (empty when none)."""
    ok = ok_rows(frame).dropna(subset=["peak_mem_mib"])
    ok = ok[(ok["level"] == "op") & (ok["seq_q"] == ok["seq_n"])]
    if ok.empty:
        return pd.DataFrame(columns=["impl", "series", "seq_n", "ratio"])
    top = ok.loc[ok.groupby(list(SERIES_KEY), dropna=False)["seq_n"].idxmax()]
    elements = top["batch"] * top["heads"] * top["seq_q"] * top["seq_kv"]
    ratio = top["peak_mem_mib"] * 2**20 / (elements * top["dtype"].map(DTYPE_BYTES).fillna(4))
    top = top.assign(ratio=ratio, series=series_labels(top))[ratio >= 1]
    return top.sort_values(["impl", "series"])[["impl", "series", "seq_n", "ratio"]]
