"""Which impl to use per model preset, phase and workload (rows from --model only).

One pick per phase hides losses: in decode, one new token against a long cache and four new
tokens at batch 1 favour different kernels by up to 5x. So decode is split by new tokens
(``seq_q``) always (one new token is plain decoding, several are speculative decoding), and
each part is split further where the best pick changes: a group keeps one pick only while
that pick is within the tolerance (``TOLERANCE``, 1.10x: ``--tolerance``) of the fastest
agreeing kernel in *every* case of the group; otherwise it is split by the workload dimension
(new tokens, batch, cache length, ...) that needs the fewest groups. Each pick states its
worst loss and where, the kernel it ran, its time and decode bandwidth per case (ranges: the
cases are unlike), its compile time and its failures in or next to its group."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from attnbench.dims import DIM
from attnbench.models import ATTN_IMPLEMENTATIONS
from attnbench.report.analyse.derived import CASE_COLUMNS, agreeing, kv_cache_mib
from attnbench.report.analyse.reasons import short_reason
from attnbench.report.analyse.rounds import Rounds
from attnbench.report.decide.contestants import kernel_of
from attnbench.report.decide.verdicts import fastest_agreeing, seq_spans

TOLERANCE = 1.10  # a pick may be at most this much slower than the best in any case of its group
DECODE = "decode"
# the dimensions a group is split along, first tried first; any other varying one after
SPLIT_ORDER = ("seq_q", "batch", "seq_kv")
COLUMNS = [
    "model",
    "phase",
    "part",
    "workload",
    "where",
    "cases",
    "impl",
    "kernel",
    "same_kernel",
    "wins",
    "worst_loss",
    "worst_at",
    "margin",
    "runner_up",
    "time_ms_min",
    "time_ms_max",
    "gbps_min",
    "gbps_max",
    "peak_mem_mib_min",
    "peak_mem_mib_max",
    "kv_mib_min",
    "kv_mib_max",
    "compile_ms",
    "failures",
    "attn_implementation",
    "attn_worst_loss",
    "ties",
    "marks",
    "single",
    "single_loss",
    "not_run",
]


@dataclass(frozen=True)
class Pick:
    impl: str | None  # None: no impl agrees in some case of the group
    worst: float  # the pick's largest time / best time over the group's cases
    worst_at: int | None  # the case id where that loss is


def recommendations(
    df: pd.DataFrame, rounds: Rounds | None = None, tolerance: float = TOLERANCE
) -> pd.DataFrame:
    """One row per (model, phase, workload group): the pick, its worst loss in the group and
    where (``worst_loss``, ``worst_at``), the kernel it ran, the cases where it (or an impl
    that ran its kernel) is the fastest, its median margin over the fastest *other kernel*
    and which one that is, its time, bandwidth and peak memory over the cases (min and max),
    its compile time, its failures in or next to the group, the transformers
    ``attn_implementation`` picked the same way among the hf_* rows, the one pick for the
    whole part (``single``, ``single_loss``) and (per model and phase) the impls that failed
    or disagreed somewhere."""
    rows_of_models = df[df["model"].fillna("").astype(str) != ""]
    out = []
    for (model, phase), g in rows_of_models.groupby(["model", "phase"], dropna=False, sort=False):
        g = g.assign(_case=g.groupby(list(CASE_COLUMNS), dropna=False, sort=True).ngroup())
        phase = phase if isinstance(phase, str) else ""
        out += _phase_rows(g, model, phase, rounds, tolerance)
    return pd.DataFrame(out, columns=COLUMNS)


@dataclass(frozen=True)
class _Phase:
    """One phase's cases and its agreeing rows as case × impl tables."""

    g: pd.DataFrame  # its rows, with _case
    cases: pd.DataFrame  # case id -> CASE_COLUMNS
    times: pd.DataFrame  # case × impl: time_ms of agreeing rows
    kernels: pd.DataFrame  # case × impl: the kernel the row ran (contestants.kernel_of)
    vary: list  # the dimensions whose values differ between cases
    named: list  # the dimensions a workload is named by: new tokens, batch, cache, and vary
    tolerance: float


def _phase(g: pd.DataFrame, tolerance: float) -> _Phase:
    cases = g.drop_duplicates("_case").set_index("_case").sort_index()[list(CASE_COLUMNS)]
    good = g[agreeing(g) & (g["time_ms"] > 0).fillna(False).astype(bool)]
    times = good.pivot_table(index="_case", columns="impl", values="time_ms", aggfunc="min")
    times = times.reindex(cases.index)
    kernels = good.assign(_k=kernel_of(good)).pivot_table(
        index="_case", columns="impl", values="_k", aggfunc="first"
    )
    kernels = kernels.reindex(index=cases.index, columns=times.columns)
    vary = [c for c in SPLIT_ORDER if cases[c].nunique() > 1]
    vary += [c for c in CASE_COLUMNS if c not in vary and cases[c].nunique(dropna=False) > 1]
    named = [*SPLIT_ORDER, *(c for c in vary if c not in SPLIT_ORDER)]
    if cases["seq_kv"].eq(cases["seq_q"]).all():  # self-attention: Skv says nothing more
        vary = [c for c in vary if c != "seq_kv"]
        named = [c for c in named if c != "seq_kv"]
    return _Phase(g, cases, times, kernels, vary, named, tolerance)


def _parts(p: _Phase, phase: str) -> list[tuple[str, list]]:
    """A phase's parts, each named: decode by new tokens ('1-token decode'), else whole."""
    if phase != DECODE:
        return [(phase, list(p.cases.index))]
    by_sq = p.cases.groupby("seq_q", sort=True)
    return [(f"{int(sq)}-token {phase}", list(part.index)) for sq, part in by_sq]


def _phase_rows(g: pd.DataFrame, model, phase: str, rounds, tolerance: float) -> list[dict]:
    p = _phase(g, tolerance)
    winners = fastest_agreeing(g.drop(columns="_case"), rounds)  # in case id order
    hf = [c for c in p.times.columns if c in ATTN_IMPLEMENTATIONS]
    rows = []
    for part, ids in _parts(p, phase):
        single = _pick(p.times.loc[ids], p.kernels.loc[ids])
        for idx in _groups(p, ids):
            sub = p.times.loc[idx]
            pick = _pick(sub, p.kernels.loc[idx])
            row = {"model": model, "phase": phase, "part": part, "cases": len(idx)}
            row["workload"] = _workload(p.cases, idx, p.named)
            row["where"] = _where(p.cases, idx, ids, p.vary)
            row.update(single=single.impl, single_loss=single.worst)
            if pick.impl is not None:
                row.update(_about(pick, p, idx, winners.iloc[idx]))
            attn = _pick(sub[hf], p.kernels.loc[idx, hf]) if hf else None
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


def _groups(p: _Phase, idx: list) -> list[list]:
    """The workload groups of ``idx``: itself when one pick is within the tolerance
    everywhere, else the split (along one varying dimension, recursively) with the fewest
    groups."""
    pick = _pick(p.times.loc[idx], p.kernels.loc[idx])
    here = [d for d in p.vary if p.cases.loc[idx, d].nunique(dropna=False) > 1]
    if pick.worst <= p.tolerance or not here:
        return [idx]
    best = None
    for d in here:
        parts = []
        for _, part in p.cases.loc[idx].groupby(d, dropna=False, sort=True):
            parts.append(_groups(p, list(part.index)))
        split = _merge_neighbours(p, parts)
        if best is None or len(split) < len(best):
            best = split
    return best


def _merge_neighbours(p: _Phase, parts: list[list[list]]) -> list[list]:
    """Flatten the groups of each value of a split, merging neighbouring values that were not
    split further when one pick still holds over both."""
    out: list[list] = []
    for groups in parts:
        both = out[-1] + groups[0] if out else []
        if (
            out
            and len(groups) == 1
            and _pick(p.times.loc[both], p.kernels.loc[both]).worst <= p.tolerance
        ):
            out[-1] = out[-1] + groups[0]
        else:
            out += groups
    return out


def _same_kernel(kernels: pd.DataFrame, impl: str) -> list[str]:
    """The impls that ran ``impl``'s kernel wherever both ran (and ran together somewhere)."""
    mine, ran = kernels[impl], kernels.notna()
    return [
        c
        for c in kernels.columns
        if c != impl
        and (ran[c] & ran[impl]).any()
        and kernels[c].eq(mine).where(ran[c] & ran[impl], True).astype(bool).all()
    ]


def _runner_up(others: pd.DataFrame, mine: pd.Series) -> str | None:
    """The other kernel closest to the pick: the smallest median time / the pick's time over
    the cases both ran, among those that ran in the most cases (never a tie broken by name
    while the times differ)."""
    ratio = others.div(mine, axis=0)
    counts = ratio.notna().sum()
    if counts.empty or counts.max() == 0:
        return None
    full = ratio.loc[:, counts == counts.max()]
    order = pd.DataFrame({"median": full.median(), "name": full.columns})
    return str(order.sort_values(["median", "name"]).index[0])


def _about(pick: Pick, p: _Phase, idx: list, winners) -> dict:
    """What the table says of a group's pick (see recommendations)."""
    times, kernels = p.times.loc[idx], p.kernels.loc[idx]
    same = _same_kernel(kernels, pick.impl)
    others = times.drop(columns=[pick.impl, *same])
    mine = times[pick.impl]
    runner = _runner_up(others, mine)
    ran = p.g[(p.g["impl"] == pick.impl) & p.g["_case"].isin(idx)]
    won = winners[winners["impl"].isin([pick.impl, *same])]
    ties = won["tie"].astype(bool)
    marks = {m for c in won.loc[~ties, "caveat"].fillna("") for m in str(c).split(", ") if m}
    low = int(ran["precision_low"].eq(True).sum()) if "precision_low" in ran else 0
    if low:  # wrong for training even where it agrees (docs/method.md: precision)
        marks.add(f"precision below fp32 accumulation in {low} case{'s' if low > 1 else ''}")
    margin = (others[runner] / mine).dropna() if runner else pd.Series(dtype=float)
    return {
        "impl": pick.impl,
        "kernel": _kernel_text(ran),
        "same_kernel": ", ".join(same),
        "wins": len(won),
        "worst_loss": pick.worst,
        "worst_at": _case_text(p.cases, pick.worst_at, p.named),
        "margin": float(margin.median()) if len(margin) else None,
        "runner_up": runner,
        **_spread(ran, "time_ms"),
        **_spread(ran, "gbps"),
        **_spread(ran, "peak_mem_mib"),
        **_spread(ran.assign(kv_mib=kv_cache_mib(ran)), "kv_mib"),
        "compile_ms": _median(ran, "compile_ms"),
        "failures": _failures_near(p, idx, pick.impl),
        "ties": int(ties.sum()),
        "marks": ", ".join(sorted(marks)),
    }


def _spread(rows: pd.DataFrame, column: str) -> dict:
    values = rows[column].dropna() if column in rows else pd.Series(dtype=float)
    lo, hi = (float(values.min()), float(values.max())) if len(values) else (None, None)
    return {f"{column}_min": lo, f"{column}_max": hi}


def _median(rows: pd.DataFrame, column: str) -> float | None:
    values = rows[column].dropna() if column in rows else pd.Series(dtype=float)
    return float(values.median()) if len(values) else None


def _kernel_text(rows: pd.DataFrame) -> str:
    """The backends the pick's rows ran ('cudnn', 'flash+cudnn'), '' for an impl's own code."""
    if "backend" not in rows:
        return ""
    found = rows["backend"].dropna().astype(str)
    return "+".join(sorted({b for b in found if b}))


def _failures_near(p: _Phase, idx: list, impl: str) -> tuple:
    """The pick's failed or disagreeing cases in its group or next to it (a case that differs
    from one of the group's in one varying dimension), each with its one-line cause."""
    g = p.g[(p.g["impl"] == impl) & ~agreeing(p.g)]
    mine = p.cases.loc[idx, p.vary]
    out = []
    for _, r in g.drop_duplicates("_case").iterrows():  # a few rows: the pick's failures
        case = p.cases.loc[r["_case"], p.vary]
        apart = mine.ne(case, axis=1).sum(axis=1)
        if (apart <= 1).any():
            status = r["status"] if r["status"] != "ok" else "disagrees"
            cause = short_reason(r["reason"]) or status
            out.append(f"{_case_text(p.cases, r['_case'], p.named)}: {status} ({cause})")
    return tuple(out)


def _text(d: str, values) -> str:
    """One dimension's values: 'Sq=1', 'B=1,32', 'Skv=4096–131072' (spans of the values)."""
    values = sorted({v for v in values if not pd.isna(v)})
    if values and all(isinstance(v, (int, np.integer)) for v in values):
        said = seq_spans(values, values).replace(", ", ",") if len(values) > 2 else None
        said = ",".join(map(str, values)) if said is None or "–" not in said else said
    else:
        said = ",".join(map(str, values))
    return f"{DIM[d].title_prefix}{said}"


def _workload(cases, idx: list, named: list) -> str:
    """A group's workload: the values it holds of new tokens, batch, cache length and any
    other dimension that varies in its phase ('Sq=1 B=32 Skv=4096,32768')."""
    return " ".join(_text(d, cases.loc[idx, d]) for d in named)


def _where(cases, idx: list, part: list, vary: list) -> str:
    """What sets a group apart within its part: the dimensions whose values it does not hold
    all of ('B=32'; '' for the whole part)."""
    held = [d for d in vary if cases.loc[idx, d].nunique() < cases.loc[part, d].nunique()]
    return " ".join(_text(d, cases.loc[idx, d]) for d in held)


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
