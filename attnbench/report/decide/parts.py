"""The picks per part of a phase (prefill, 1-token decode, ...), as its verdict line says
them: the part's name, its picks in order, and whether an impl agrees in every case."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd


@dataclass(frozen=True)
class PartVerdict:
    label: str  # the part as its verdict names it: 'prefill' ('llama3-8b prefill' with models)
    picks: pd.DataFrame  # its rows of recommend.recommendations, one per workload group
    agreed: bool  # every group has an impl that agrees in all its cases


def part_verdicts(rec: pd.DataFrame) -> tuple[PartVerdict, ...]:
    """One per (model, part) of the recommendations, in their order."""
    models = rec["model"].nunique() > 1
    return tuple(
        PartVerdict(
            label=f"{model} {part}" if models else str(part),
            picks=g.reset_index(drop=True),
            agreed=bool(g["impl"].notna().all()),
        )
        for (model, part), g in rec.groupby(["model", "part"], sort=False)
    )
