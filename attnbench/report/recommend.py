"""Which impl to use per model preset, phase and workload (rows from --model only).

One pick per phase hides losses: in decode, one new token against a long cache and four new
tokens at batch 1 favour different kernels by up to 5x. So a phase's cases are split where
the best pick changes: a group keeps one pick only while that pick is within ``TOLERANCE``
of the fastest agreeing impl in *every* case of the group; otherwise the group is split by
the workload dimension (new tokens, batch, cache length, ...) that needs the fewest groups.
Each pick states its worst loss in its group and where."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from attnbench.dims import DIM
from attnbench.models import ATTN_IMPLEMENTATIONS
from attnbench.report.contestants import kernel_of
from attnbench.report.reasons import short_reason
from attnbench.report.rounds import Rounds
from attnbench.report.rules import CASE_COLUMNS, agreeing
from attnbench.report.verdicts import fastest_agreeing, seq_spans

TOLERANCE = 1.25  # a pick may be at most this much slower than the best in any case of its group
# the dimensions a group is split along, first tried first; any other varying one after
SPLIT_ORDER = ("seq_q", "batch", "seq_kv")
COLUMNS = [
    "model",
    "phase",
    "workload",
    "cases",
    "impl",
    "same_kernel",
    "wins",
    "worst_loss",
    "worst_at",
    "margin",
    "runner_up",
    "time_ms",
    "peak_mem_mib",
    "attn_implementation",
    "attn_worst_loss",
    "ties",
    "marks",
    "not_run",
]


@dataclass(frozen=True)
class Pick:
    impl: str | None  # None: no impl agrees in some case of the group
    worst: float  # the pick's largest time / best time over the group's cases
    worst_at: int | None  # the case id where that loss is


def recommendations(df: pd.DataFrame, rounds: Rounds | None = None) -> pd.DataFrame:
    """One row per (model, phase, workload group): the pick, its worst loss in the group and
    where (``worst_loss``, ``worst_at``), the cases where it (or an impl that ran its kernel)
    is the fastest, its median margin over the fastest *other kernel* and which one that
    mostly is, its median time and peak memory, the transformers ``attn_implementation``
    picked the same way among the hf_* rows, and (per model and phase) the impls that failed
    or disagreed somewhere."""
    rows_of_models = df[df["model"].fillna("").astype(str) != ""]
    out = []
    for (model, phase), g in rows_of_models.groupby(["model", "phase"], dropna=False, sort=False):
        g = g.assign(_case=g.groupby(list(CASE_COLUMNS), dropna=False, sort=True).ngroup())
        phase = phase if isinstance(phase, str) else ""
        out += _phase_rows(g, model, phase, rounds)
    return pd.DataFrame(out, columns=COLUMNS)


def _phase_rows(g: pd.DataFrame, model, phase: str, rounds) -> list[dict]:
    cases = g.drop_duplicates("_case").set_index("_case").sort_index()[list(CASE_COLUMNS)]
    good = g[agreeing(g) & (g["time_ms"] > 0).fillna(False).astype(bool)]
    times = good.pivot_table(index="_case", columns="impl", values="time_ms", aggfunc="min")
    times = times.reindex(cases.index)
    kernels = good.assign(_k=kernel_of(good)).pivot_table(
        index="_case", columns="impl", values="_k", aggfunc="first"
    )
    winners = fastest_agreeing(g.drop(columns="_case"), rounds)  # in case id order
    hf = [c for c in times.columns if c in ATTN_IMPLEMENTATIONS]
    vary = [c for c in SPLIT_ORDER if cases[c].nunique() > 1]
    vary += [c for c in CASE_COLUMNS if c not in vary and cases[c].nunique(dropna=False) > 1]
    if cases["seq_kv"].eq(cases["seq_q"]).all():  # self-attention: Skv says nothing more
        vary = [c for c in vary if c != "seq_kv"]
    rows = []
    for idx in _groups(times, kernels, cases, list(cases.index), vary):
        sub = times.loc[idx]
        pick = _pick(sub, kernels.loc[idx])
        row = {
            "model": model,
            "phase": phase,
            "workload": _workload(cases, idx, vary),
            "cases": len(idx),
        }
        if pick.impl is not None:
            row.update(_about(pick, sub, kernels.loc[idx], g, winners.iloc[idx], cases, vary))
        attn = _pick(sub[hf], kernels.loc[idx, hf]) if hf else None
        if attn is not None and attn.impl is not None:
            row.update(
                attn_implementation=ATTN_IMPLEMENTATIONS[attn.impl], attn_worst_loss=attn.worst
            )
        rows.append(row)
    if rows:
        rows[0]["not_run"] = _not_run(g)
    return rows


def _losses(times: pd.DataFrame, kernels: pd.DataFrame) -> pd.DataFrame:
    """case × impl: the impl's time / the fastest time of itself and the impls that ran
    *another* kernel (an alias running the same kernel is noise, not a loss)."""
    out = {}
    for c in times.columns:
        other = kernels.ne(kernels[c], axis=0).fillna(True).astype(bool)
        other[c] = True
        out[c] = times[c] / times.where(other).min(axis=1)
    return pd.DataFrame(out, index=times.index)


def _pick(times: pd.DataFrame, kernels: pd.DataFrame) -> Pick:
    """The impl that runs (agreeing) in every case of ``times`` (case × impl) with the
    smallest worst loss; ties: the smaller median loss, then the name."""
    loss = _losses(times, kernels)
    full = loss.loc[:, loss.notna().all()]
    if full.empty or times.min(axis=1).isna().any():
        return Pick(None, np.inf, None)
    order = pd.DataFrame({"worst": full.max(), "median": full.median(), "name": full.columns})
    impl = order.sort_values(["worst", "median", "name"]).index[0]
    return Pick(str(impl), float(full[impl].max()), int(full[impl].idxmax()))


def _groups(times, kernels, cases, idx: list, vary: list) -> list[list]:
    """The workload groups of ``idx``: itself when one pick is within TOLERANCE everywhere,
    else the split (along one varying dimension, recursively) with the fewest groups."""
    pick = _pick(times.loc[idx], kernels.loc[idx])
    here = [d for d in vary if cases.loc[idx, d].nunique(dropna=False) > 1]
    if pick.worst <= TOLERANCE or not here:
        return [idx]
    best = None
    for d in here:
        parts = []
        for _, part in cases.loc[idx].groupby(d, dropna=False, sort=True):
            parts.append(_groups(times, kernels, cases, list(part.index), vary))
        split = _merge_neighbours(times, kernels, parts)
        if best is None or len(split) < len(best):
            best = split
    return best


def _merge_neighbours(times, kernels, parts: list[list[list]]) -> list[list]:
    """Flatten the groups of each value of a split, merging neighbouring values that were not
    split further when one pick still holds over both."""
    out: list[list] = []
    for groups in parts:
        both = out[-1] + groups[0] if out else []
        if (
            out
            and len(groups) == 1
            and _pick(times.loc[both], kernels.loc[both]).worst <= TOLERANCE
        ):
            out[-1] = out[-1] + groups[0]
        else:
            out += groups
    return out


def _about(pick: Pick, times, kernels, g, winners, cases, vary) -> dict:
    """What the table says of a group's pick (see recommendations)."""
    mine = kernels[pick.impl]
    ran = kernels.notna()
    same = [  # the impls that ran the pick's kernel wherever both ran
        c
        for c in kernels.columns
        if c != pick.impl
        and (ran[c] & ran[pick.impl]).any()
        and kernels[c].eq(mine).where(ran[c] & ran[pick.impl], True).astype(bool).all()
    ]
    others = times.drop(columns=[pick.impl, *same])
    other_best = others.min(axis=1)
    ran = g[(g["impl"] == pick.impl) & g["_case"].isin(times.index)]
    won = winners[winners["impl"].isin([pick.impl, *same])]
    ties = won["tie"].astype(bool)
    marks = {p for c in won.loc[~ties, "caveat"].fillna("") for p in str(c).split(", ") if p}
    low = int(ran["precision_low"].eq(True).sum()) if "precision_low" in ran else 0
    if low:  # wrong for training even where it agrees (docs/method.md: precision)
        marks.add(f"precision below fp32 accumulation in {low} case{'s' if low > 1 else ''}")
    margin = (other_best / times[pick.impl]).dropna()
    return {
        "impl": pick.impl,
        "same_kernel": ", ".join(same),
        "wins": len(won),
        "worst_loss": pick.worst,
        "worst_at": _case_text(cases, pick.worst_at, vary),
        "margin": float(margin.median()) if len(margin) else None,
        # the other kernel fastest in most cases, over the cases where another one ran
        "runner_up": others.dropna(how="all").idxmin(axis=1).mode().iloc[0]
        if len(margin)
        else None,
        "time_ms": float(times[pick.impl].median()),
        "peak_mem_mib": float(ran["peak_mem_mib"].median())
        if ran["peak_mem_mib"].notna().any()
        else None,
        "ties": int(ties.sum()),
        "marks": ", ".join(sorted(marks)),
    }


def _text(d: str, values) -> str:
    """One dimension's values: 'Sq=1', 'B=1,32', 'Skv=4096–131072' (spans of the values)."""
    values = sorted({v for v in values if not pd.isna(v)})
    if values and all(isinstance(v, (int, np.integer)) for v in values):
        said = seq_spans(values, values).replace(", ", ",") if len(values) > 2 else None
        said = ",".join(map(str, values)) if said is None or "–" not in said else said
    else:
        said = ",".join(map(str, values))
    return f"{DIM[d].title_prefix}{said}"


def _workload(cases, idx: list, vary: list) -> str:
    """A group's workload: the values of each varying dimension that the group holds, for the
    dimensions where it does not hold them all ('all' when it holds every case)."""
    parts = [
        _text(d, cases.loc[idx, d])
        for d in vary
        if cases.loc[idx, d].nunique(dropna=False) < cases[d].nunique(dropna=False)
    ]
    return " ".join(parts) or "all"


def _case_text(cases, case_id, vary: list) -> str:
    """One case by its varying dimensions: 'Sq=1 B=1 Skv=131072'."""
    if case_id is None:
        return ""
    return " ".join(_text(d, [cases.loc[case_id, d]]) for d in vary)


def _not_run(g: pd.DataFrame) -> str:
    """Impls with a row that is not ok or disagrees, each with its first reason."""
    bad = g[~agreeing(g)]
    parts = []
    for impl, rows in bad.groupby("impl", sort=True):
        first = rows.iloc[0]
        status = first["status"] if first["status"] != "ok" else "disagrees"
        reason = short_reason(first["reason"])
        n = f" in {len(rows)}/{len(g[g['impl'] == impl])} cases"
        parts.append(f"{impl}: {status}{n}" + (f" ({reason})" if reason else ""))
    return "; ".join(parts)
