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


def contestants(impls: list[str], kernels: list[str]) -> tuple[list[int], dict]:
    """One contestant per kernel among one case's agreeing rows (``impls`` and the
    ``kernels`` they ran, fastest first): the positions of the rows kept, each kernel's
    fastest, so that a kernel competes with the best time any impl got from it, and per kept
    impl the other impls that ran its kernel (sorted)."""
    names: dict[str, list] = {}
    for i, (impl, kernel) in enumerate(zip(impls, kernels)):
        names.setdefault(kernel, []).append((impl, i))
    kept = [pairs[0][1] for pairs in names.values()]  # in order: fastest first
    aliases = {p[0][0]: sorted(n for n, _ in p[1:]) for p in names.values()}
    return sorted(kept), aliases
