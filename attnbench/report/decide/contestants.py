"""Which kernel a row ran: two impls that ran the same kernel are one contestant.

``sdpa`` lets PyTorch pick a backend; on an H100 it picks cuDNN, so its rows and
``sdpa_cudnn``'s time the same kernel and differ only by noise. A winner's margin is over
the best *different* kernel; the alias is named beside it ("same kernel as"), never raced
against it. The ``backend`` column says which kernel ran (the SDPA impls: flash, efficient,
cudnn, math; xformers without its own kernels: pytorch:flash, ...); a row without one ran
its impl's own code, a kernel of its own."""

from __future__ import annotations

import pandas as pd

from attnbench.measure.backends import PYTORCH_PREFIX


def kernel_of(df: pd.DataFrame) -> pd.Series:
    """The kernel each row ran: its backend (PyTorch's kernels under one name whoever called
    them: ``pytorch:flash`` is ``flash``), else its impl."""
    if "backend" not in df:
        return df["impl"].astype("string")
    backend = df["backend"].astype("string").str.removeprefix(PYTORCH_PREFIX)
    return backend.where(backend.fillna("").str.len() > 0, df["impl"].astype("string"))


def contestants(cand: pd.DataFrame, kernels: pd.Series) -> tuple[pd.DataFrame, dict]:
    """One row per kernel of one case's agreeing rows (``cand``, sorted fastest first;
    ``kernels``: kernel_of its rows): the kernel's fastest row, so that a kernel competes
    with the best time any impl got from it, and per kept impl the other impls that ran its
    kernel."""
    names: dict[str, list] = {}
    for i, impl, kernel in zip(cand.index, cand["impl"].astype(str), kernels.loc[cand.index]):
        names.setdefault(kernel, []).append((impl, i))
    kept = [pairs[0][1] for pairs in names.values()]  # cand is fastest first
    aliases = {p[0][0]: sorted(n for n, _ in p[1:]) for p in names.values()}
    return cand.loc[kept].sort_values(["time_ms", "impl"]), aliases
