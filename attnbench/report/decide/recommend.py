"""Which impl to use per model preset, phase and workload (rows from --model only).

One pick per phase hides losses: in decode, one new token against a long cache and four new
tokens at batch 1 favour different kernels by up to 5x. So decode is split by new tokens
(``seq_q``) always (one new token is plain decoding, several are speculative decoding), and
each part is split further where the best pick changes: a group keeps one pick only while
that pick is within the tolerance of the fastest agreeing kernel in *every* case of the group
(in each case the run's noise there, at most 1.10x: tolerance.py, ``--tolerance`` the cap);
otherwise it is split by the workload dimension (new tokens, batch, cache length, ...) that
needs the fewest groups. Each pick states its worst loss and where, the kernel it ran, its
time and decode bandwidth per case (ranges: the cases are unlike), its compile time, its
failures in or next to its group, the tolerance it was held to, and in how many cases its
deciding rows (its own, and the fastest other kernel's it is measured against) were contended:
the report then doubts the pick rather than stating it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from attnbench.models import ATTN_IMPLEMENTATIONS
from attnbench.report.analyse.derived import CASE_COLUMNS, agreeing, contended, kv_cache_mib
from attnbench.report.analyse.reasons import short_reason
from attnbench.report.analyse.rounds import Rounds
from attnbench.report.decide.contestants import kernel_of
from attnbench.report.decide.tolerance import TOLERANCE, case_tolerance
from attnbench.report.decide.verdicts import fastest_agreeing
from attnbench.report.decide.workloads import case_text, where, workload

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
    "contended",
    "tolerance_min",
    "tolerance_max",
    "single",
    "single_loss",
    "not_run",
]


@dataclass(frozen=True)
class Pick:
    impl: str | None  # None: no impl agrees in some case of the group
    worst: float  # the pick's largest time / best time over the group's cases
    worst_at: int | None  # the case id where that loss is
    fits: bool  # within the tolerance of every case (always, without tolerances)


def recommendations(
    df: pd.DataFrame,
    rounds: Rounds | None = None,
    tolerance: float = TOLERANCE,
    winners: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per (model, phase, workload group): the pick, its worst loss in the group and
    where (``worst_loss``, ``worst_at``), the kernel it ran, the cases where it (or an impl
    that ran its kernel) is the fastest, its median margin over the fastest *other kernel*
    and which one that is, its time, bandwidth and peak memory over the cases (min and max),
    its compile time, its failures in or next to the group, the transformers
    ``attn_implementation`` picked the same way among the hf_* rows, the one pick for the
    whole part (``single``, ``single_loss``) and (per model and phase) the impls that failed
    or disagreed somewhere.

    ``tolerance`` caps what a pick may lose in a case (tolerance.case_tolerance: the case's
    noise, at most the cap); ``winners``: verdicts.fastest_agreeing of ``df`` with ``rounds``
    (the analysis computes it once), else computed here for the rows of models."""
    if winners is None:
        df = df[_of_models(df)]
        winners = fastest_agreeing(df, rounds)
    df = df.assign(_case=df.groupby(list(CASE_COLUMNS), dropna=False, sort=True).ngroup())
    if len(winners) != df["_case"].nunique():  # fastest_agreeing gives one row per case
        raise ValueError("winners are not those of these rows (one per case, in case order)")
    allowed = case_tolerance(winners, tolerance)  # case id -> the most a pick may lose there
    out = []
    by_phase = df[_of_models(df)].groupby(["model", "phase"], dropna=False, sort=False)
    for (model, phase), g in by_phase:
        phase = phase if isinstance(phase, str) else ""
        out += _phase_rows(g, model, phase, winners, allowed)
    return pd.DataFrame(out, columns=COLUMNS)


def _of_models(df: pd.DataFrame) -> pd.Series:
    return df["model"].fillna("").astype(str) != ""


@dataclass(frozen=True)
class _Phase:
    """One phase's cases and its agreeing rows as case × impl tables."""

    g: pd.DataFrame  # its rows, with _case
    cases: pd.DataFrame  # case id -> CASE_COLUMNS
    times: pd.DataFrame  # case × impl: time_ms of agreeing rows
    kernels: pd.DataFrame  # case × impl: the kernel the row ran (contestants.kernel_of)
    vary: list  # the dimensions whose values differ between cases
    named: list  # the dimensions a workload is named by: new tokens, batch, cache, and vary
    allowed: pd.Series  # case id -> the most a pick may lose there (tolerance.py)
    busy: pd.DataFrame  # case × impl: its agreeing row was contended


def _phase(g: pd.DataFrame, allowed: pd.Series) -> _Phase:
    cases = g.drop_duplicates("_case").set_index("_case").sort_index()[list(CASE_COLUMNS)]
    good = g[agreeing(g) & (g["time_ms"] > 0).fillna(False).astype(bool)]
    times = good.pivot_table(index="_case", columns="impl", values="time_ms", aggfunc="min")
    times = times.reindex(cases.index)
    kernels = good.assign(_k=kernel_of(good)).pivot_table(
        index="_case", columns="impl", values="_k", aggfunc="first"
    )
    kernels = kernels.reindex(index=cases.index, columns=times.columns)
    busy = good.assign(_c=contended(good).astype(int)).pivot_table(
        index="_case", columns="impl", values="_c", aggfunc="max"
    )
    busy = busy.reindex(index=cases.index, columns=times.columns).fillna(0).astype(bool)
    vary = [c for c in SPLIT_ORDER if cases[c].nunique() > 1]
    vary += [c for c in CASE_COLUMNS if c not in vary and cases[c].nunique(dropna=False) > 1]
    named = [*SPLIT_ORDER, *(c for c in vary if c not in SPLIT_ORDER)]
    if cases["seq_kv"].eq(cases["seq_q"]).all():  # self-attention: Skv says nothing more
        vary = [c for c in vary if c != "seq_kv"]
        named = [c for c in named if c != "seq_kv"]
    return _Phase(g, cases, times, kernels, vary, named, allowed.loc[cases.index], busy)


def _parts(p: _Phase, phase: str) -> list[tuple[str, list]]:
    """A phase's parts, each named: decode by new tokens ('1-token decode'), else whole."""
    if phase != DECODE:
        return [(phase, list(p.cases.index))]
    by_sq = p.cases.groupby("seq_q", sort=True)
    return [(f"{int(sq)}-token {phase}", list(part.index)) for sq, part in by_sq]


def _phase_rows(g: pd.DataFrame, model, phase: str, winners, allowed) -> list[dict]:
    p = _phase(g, allowed)
    hf = [c for c in p.times.columns if c in ATTN_IMPLEMENTATIONS]
    rows = []
    for part, ids in _parts(p, phase):
        single = _pick(p.times.loc[ids], p.kernels.loc[ids])
        for idx in _groups(p, ids):
            sub = p.times.loc[idx]
            pick = _pick(sub, p.kernels.loc[idx], p.allowed.loc[idx])
            row = {"model": model, "phase": phase, "part": part, "cases": len(idx)}
            row["workload"] = workload(p.cases, idx, p.named)
            row["where"] = where(p.cases, idx, ids, p.vary)
            row.update(single=single.impl, single_loss=single.worst)
            held = p.allowed.loc[idx]  # the tolerance of each of its cases
            row.update(tolerance_min=float(held.min()), tolerance_max=float(held.max()))
            if pick.impl is not None:
                row.update(_about(pick, p, idx, winners.loc[idx]))
            attn = _pick(sub[hf], p.kernels.loc[idx, hf]) if hf else None
            if attn is not None and attn.impl is not None:
                row.update(
                    attn_implementation=ATTN_IMPLEMENTATIONS[attn.impl], attn_worst_loss=attn.worst
                )
            rows.append(row)
    if rows:
        rows[0]["not_run"] = _not_run(g)
    return rows


def _losses(times: pd.DataFrame, kernels: pd.DataFrame) -> np.ndarray:
    """case × impl: the impl's time / the fastest time of itself and the impls that ran
    *another* kernel (an alias running the same kernel is noise, not a loss); NaN where it
    did not run. In arrays [case, impl, impl]: a pick is weighed some fifty times while a
    phase is split."""
    t = times.to_numpy(dtype=float, na_value=np.nan)
    ran = kernels.to_numpy(dtype=object, na_value=None)
    code = pd.factorize(ran.ravel())[0].reshape(ran.shape)  # a missing kernel: -1
    alias = (code[:, :, None] == code[:, None, :]) & (code[:, :, None] >= 0)  # [case, j, c]
    alias[:, np.arange(t.shape[1]), np.arange(t.shape[1])] = False  # an impl races itself
    rivals = np.where(alias, np.inf, np.where(np.isnan(t), np.inf, t)[:, :, None])
    best = rivals.min(axis=1)  # case × c: the fastest of c and the other kernels
    return t / np.where(np.isinf(best), np.nan, best)


def _pick(times: pd.DataFrame, kernels: pd.DataFrame, allowed: pd.Series | None = None) -> Pick:
    """The impl that runs (agreeing) in every case of ``times`` (case × impl) with the
    smallest worst loss, each case's loss counted against what it ``allowed`` (the case's
    tolerance: a loss of 1.05x weighs more where the noise is 1% than where it is 8%); ties:
    the smaller median loss, then the name."""
    loss = _losses(times, kernels)
    full = np.flatnonzero(~np.isnan(loss).any(axis=0))  # the impls that ran in every case
    if (
        not len(full)
        or not len(loss)
        or np.isnan(times.to_numpy(float, na_value=np.nan)).all(1).any()
    ):
        return Pick(None, np.inf, None, False)
    held = None if allowed is None else allowed.to_numpy(dtype=float)
    over = loss if held is None else loss / held[:, None]
    names = list(times.columns)
    _, _, _, c = min((over[:, c].max(), np.median(loss[:, c]), names[c], c) for c in full)
    fits = held is None or bool((loss[:, c] <= held).all())
    return Pick(str(names[c]), float(loss[:, c].max()), int(times.index[loss[:, c].argmax()]), fits)


def _groups(p: _Phase, idx: list) -> list[list]:
    """The workload groups of ``idx``: itself when one pick is within the tolerance
    everywhere, else the split (along one varying dimension, recursively) with the fewest
    groups."""
    pick = _pick(p.times.loc[idx], p.kernels.loc[idx], p.allowed.loc[idx])
    here = [d for d in p.vary if p.cases.loc[idx, d].nunique(dropna=False) > 1]
    if pick.fits or not here:
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
            and _pick(p.times.loc[both], p.kernels.loc[both], p.allowed.loc[both]).fits
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
    said = won.loc[~ties, "caveat"].fillna("")  # contended is counted apart (_contended)
    marks = {m for c in said for m in str(c).split(", ") if m and m != "contended"}
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
        "worst_at": case_text(p.cases, pick.worst_at, p.named),
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
        "contended": _contended(p.busy.loc[idx], [pick.impl, *same], others),
    }


def _contended(busy: pd.DataFrame, mine: list, others: pd.DataFrame) -> int:
    """In how many cases the pick's deciding rows were contended: its own (or an impl's that
    ran its kernel) and the fastest other kernel's, which its loss or lead there is against."""
    n = 0
    for case, times in others.iterrows():
        ran = times.dropna()
        rival = bool(busy.loc[case, ran.idxmin()]) if len(ran) else False
        n += int(rival or bool(busy.loc[case, mine].any()))
    return n


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
            out.append(f"{case_text(p.cases, r['_case'], p.named)}: {status} ({cause})")
    return tuple(out)


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
