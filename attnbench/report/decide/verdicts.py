"""Verdicts from a results frame: speedups against a baseline and who wins each case, each
with how sure it is. With the run's rounds (rounds.Rounds) both are paired per round, with a
95% interval; without, they are ratios of medians judged by the p20-p80 ranges. Only ok rows
become numbers (analysis.py)."""

from __future__ import annotations

import math
from collections import Counter

import pandas as pd

from attnbench.report.analyse.derived import (
    CASE_COLUMNS,
    agreeing,
    case_family,
    caveat,
    contended,
    groups,
    is_ok,
    noisy,
    ok_rows,
)
from attnbench.report.analyse.rounds import Rounds
from attnbench.report.decide.contestants import contestants, kernel_of
from attnbench.store.schema import CASE_KEY


def speedups(
    df: pd.DataFrame, baseline: str, rounds: Rounds | None = None, recorded: bool = False
) -> pd.DataFrame:
    """Every row of df with baseline_time_ms, speedup = baseline time / impl time, its 95%
    interval (speedup_lo, speedup_hi), ``paired`` and ``caveat`` (what it rests on).

    speedup is NA unless both the row and the baseline's row for the same case are ok with
    a positive time; the baseline's own ok rows get exactly 1. It is paired by round
    (measure/paired.py) where the run's samples have rounds (any baseline); else the row's
    own speedup columns where they are relative to this baseline (``recorded``); else the
    ratio of the two medians, without an interval."""
    base = ok_rows(df[df["impl"] == baseline])
    base = base.assign(_bc=contended(base), _bn=noisy(base))
    base = base[[*CASE_COLUMNS, "time_ms", "_bc", "_bn"]].drop_duplicates(list(CASE_COLUMNS))
    out = df.merge(
        base.rename(columns={"time_ms": "baseline_time_ms"}), on=list(CASE_COLUMNS), how="left"
    )
    usable = (
        is_ok(out)
        & (out["time_ms"] > 0).fillna(False)
        & (out["baseline_time_ms"] > 0).fillna(False)
    )
    values = {c: [None] * len(out) for c in ("speedup", "speedup_lo", "speedup_hi")}
    is_paired, notes = [False] * len(out), [""] * len(out)
    doubt = (contended(out) | out["_bc"].eq(True).fillna(False).astype(bool)).to_numpy()
    shaky = (noisy(out) | out["_bn"].eq(True).fillna(False).astype(bool)).to_numpy()
    read = [*CASE_KEY, "time_ms", "baseline_time_ms", "speedup", "speedup_lo", "speedup_hi"]
    at = usable.to_numpy().nonzero()[0]  # the usable rows, as records: no row objects
    for i, r in zip(at, out.iloc[at][[c for c in read if c in out]].to_dict("records")):
        value, lo, hi = float(r["baseline_time_ms"] / r["time_ms"]), None, None
        ratio = rounds.speedup_over(r, baseline) if rounds and r["impl"] != baseline else None
        if r["impl"] == baseline:
            value = 1.0
        elif ratio is not None:
            value, lo, hi = ratio
        elif recorded and not pd.isna(r.get("speedup", pd.NA)):
            value = float(r["speedup"])
            lo, hi = (None if pd.isna(r[c]) else float(r[c]) for c in ("speedup_lo", "speedup_hi"))
        is_paired[i] = lo is not None
        for c, v in zip(values, (value, lo, hi)):
            values[c][i] = v
        if r["impl"] != baseline:
            notes[i] = caveat(bool(doubt[i]), lo, hi, bool(shaky[i]))
    for c, v in values.items():
        out[c] = pd.array(v, dtype="Float64")
    return out.drop(columns=["_bc", "_bn"]).assign(
        paired=pd.array(is_paired, dtype="boolean"), caveat=pd.array(notes, dtype="string")
    )


WIN_COLUMNS = [
    *CASE_COLUMNS,
    "family",
    "impl",
    "time_ms",
    "runner_up",
    "runner_up_time_ms",
    "margin",
    "margin_lo",
    "margin_hi",
    "tie",
    "paired",
    "caveat",
    "n_agreeing",
    "n_rows",
    "reason",
    "same_kernel",
]


def fastest_agreeing(df: pd.DataFrame, rounds: Rounds | None = None) -> pd.DataFrame:
    """One row per case: the fastest impl among ok rows that agree with the reference, its
    time, the runner-up and how much slower it is (``margin``: runner-up time / its time,
    margin_lo and margin_hi its interval where paired), ``tie`` (the win is within the
    noise), ``paired`` and ``caveat`` (what the win rests on: ``caveat``).

    With rounds (the run's samples), the margin is paired by round and the win is a tie when
    its interval contains 1; without, when the two rows' p20-p80 ranges overlap (equal
    medians for rows without them). Cases where no impl agrees are kept with impl NA and a
    reason. A kernel is one contestant (contestants.py): impls that ran the winner's kernel
    are its ``same_kernel``, and the runner-up is the best *different* kernel.

    The rows are read once as columns (_Rows) and split by case once: a results row has some
    80 columns, and a frame per case would copy each of them."""
    if df.empty:
        return pd.DataFrame(columns=WIN_COLUMNS)
    r = _Rows(df)
    rows = []
    for key, pos in groups(df, CASE_COLUMNS):
        cand = sorted((i for i in pos if r.good[i]), key=lambda i: (r.time[i], r.impl[i]))
        row = {
            **dict(zip(CASE_COLUMNS, key)),
            "family": r.family[pos[0]],
            "n_agreeing": len(cand),
            "n_rows": len(pos),
            "impl": pd.NA,
            "time_ms": math.nan,
            "runner_up": pd.NA,
            "runner_up_time_ms": math.nan,
            "margin": math.nan,
            "margin_lo": math.nan,
            "margin_hi": math.nan,
            "tie": False,
            "paired": False,
            "caveat": "",
            "reason": pd.NA,
            "same_kernel": "",
        }
        if not cand:
            row["reason"] = "no impl is ok and agrees"
        else:
            kept, aliases = contestants([r.impl[i] for i in cand], [r.kernel[i] for i in cand])
            row.update(_win([cand[k] for k in kept], r, rounds))
            row["same_kernel"] = ", ".join(aliases[row["impl"]])
        rows.append(row)
    out = pd.DataFrame(rows, columns=WIN_COLUMNS)
    for c in ("time_ms", "runner_up_time_ms", "margin", "margin_lo", "margin_hi"):
        out[c] = out[c].astype("Float64")
    return out


class _Rows:
    """The columns a case's winner is decided by, as arrays read once (positions: rows of
    the frame)."""

    def __init__(self, df: pd.DataFrame):
        self.df = df
        self.impl = df["impl"].to_numpy(dtype=object)
        self.family = case_family(df).to_numpy(dtype=object)
        self.time = df["time_ms"].to_numpy(dtype=float, na_value=math.nan)
        good = agreeing(df) & (df["time_ms"] > 0).fillna(False).astype(bool)
        self.good = good.to_numpy(dtype=bool)
        self.kernel = kernel_of(df).to_numpy(dtype=object)
        self.contended = contended(df).to_numpy(dtype=bool)
        self.noisy = noisy(df).to_numpy(dtype=bool)
        p20, p80 = (df.get(c) for c in ("time_ms_p20", "time_ms_p80"))
        self.p20 = None if p20 is None else p20.to_numpy(dtype=object, na_value=None)
        self.p80 = None if p80 is None else p80.to_numpy(dtype=object, na_value=None)

    def key_row(self, i: int) -> dict:
        """Row ``i``'s identity, as rounds.key reads it."""
        return {c: self.df[c].iat[i] for c in CASE_KEY}


def _win(kept: list[int], r: _Rows, rounds: Rounds | None) -> dict:
    """The winner among a case's contestants (positions, fastest median first) and how sure
    it is."""
    winner = kept[0]
    if len(kept) < 2:
        return {
            "impl": r.impl[winner],
            "time_ms": float(r.time[winner]),
            "caveat": caveat(bool(r.contended[winner])),
        }
    runner = kept[1]
    ratio = rounds.speedup_over(r.key_row(winner), r.impl[runner]) if rounds else None
    if ratio is not None and ratio.hi is not None and ratio.hi < 1:  # paired, the other wins
        winner, runner = runner, winner
        ratio = rounds.speedup_over(r.key_row(winner), r.impl[runner])
    if ratio is not None and ratio.lo is None:
        ratio = None  # too few rounds for an interval: the older rule
    pair = [winner, runner]
    margin = ratio or (float(r.time[runner] / r.time[winner]), math.nan, math.nan)
    return {
        "impl": r.impl[winner],
        "time_ms": float(r.time[winner]),
        "runner_up": r.impl[runner],
        "runner_up_time_ms": float(r.time[runner]),
        "margin": margin[0],
        "margin_lo": margin[1],
        "margin_hi": margin[2],
        "tie": ratio.tie if ratio else _within_noise(r, winner, runner),
        "paired": ratio is not None,
        "caveat": caveat(
            bool(r.contended[pair].any()),
            ratio.lo if ratio else None,
            ratio.hi if ratio else None,
            bool(r.noisy[pair].any()),
        ),
    }


def _within_noise(r: _Rows, winner: int, runner_up: int) -> bool:
    lo = None if r.p20 is None else r.p20[runner_up]
    hi = None if r.p80 is None else r.p80[winner]
    if pd.isna(lo) or pd.isna(hi):
        return bool(r.time[runner_up] <= r.time[winner])
    return bool(lo <= hi)


def seq_spans(won, lengths) -> str:
    """The lengths won as spans of consecutive lengths of the family: '128–512, 2048'."""
    order = sorted({int(n) for n in lengths})
    won = {int(n) for n in won}
    spans, start = [], None
    for i, n in enumerate(order):
        if n in won and start is None:
            start = n
        if n in won and (i + 1 == len(order) or order[i + 1] not in won):
            spans.append(str(n) if n == start else f"{start}–{n}")
            start = None
    return ", ".join(spans)


AXIS_NAME = {"seq_q": "N", "seq_kv": "Skv"}  # a length as the report's tables name it


def _family_axis(family: pd.DataFrame) -> str:
    """The length a family's wins are told by, as the scaling exponents and the figures name
    it: the cache (seq_kv) in a decode family (its few new queries against a growing cache)
    or one whose queries are fixed while the keys vary, else N (seq_q)."""
    decode = "phase" in family and family["phase"].eq("decode").all()
    fixed_q = family["seq_q"].nunique() == 1 and family["seq_kv"].nunique() > 1
    return "seq_kv" if decode or fixed_q else "seq_q"


def _spans(won: pd.DataFrame, family: pd.DataFrame) -> str:
    """The cache lengths won, per number of new queries where the family has several:
    '4096–131072 at Sq=1, 4096 at Sq=4' (one new token and four are unlike workloads)."""
    if family["seq_q"].nunique() == 1:
        return seq_spans(won["seq_kv"], family["seq_kv"])
    return ", ".join(
        f"{seq_spans(w['seq_kv'], family.loc[family['seq_q'] == sq, 'seq_kv'])} at Sq={sq}"
        for sq, w in won.groupby("seq_q", sort=True)
    )


def _one_name_per_kernel(won: pd.DataFrame) -> pd.DataFrame:
    """Each win under one name per kernel and family: of the impls that ran it (``impl`` and
    its ``same_kernel``), the one that won the most of the family's cases (then the first by
    name), the others its ``same_kernel``. A kernel's win goes to whichever alias was fastest
    in that case (contestants.py), so without this one kernel's wins in a family would be
    split between its names (sdpa 4/5; sdpa_flash 1/5)."""
    groups = [
        frozenset({i, *(a for a in str(s).split(", ") if a)})
        for i, s in zip(won["impl"], won["same_kernel"].fillna(""))
    ]
    keys = list(zip(won["family"], groups))
    counts = Counter(zip(keys, won["impl"]))
    name = {
        k: min(k[1], key=lambda i, k=k: (-counts.get((k, i), 0), i)) for k in dict.fromkeys(keys)
    }
    return won.assign(
        impl=[name[k] for k in keys],
        same_kernel=[", ".join(sorted(k[1] - {name[k]})) for k in keys],
    )


def wins_by_family(winners: pd.DataFrame) -> pd.DataFrame:
    """From fastest_agreeing: per family and winning impl, the cases won, the family's case
    count, the seq_q range of the wins, the lengths won as spans of the family's lengths
    (``spans``), how many of the wins are ties (within the noise of the runner-up), and how
    many that are not rest on doubtful evidence (``marked``, and their caveats, ``marks``)."""
    columns = ["family", "impl", "wins", "cases", "seq_min", "seq_max", "spans", "ties"]
    columns += ["marked", "marks", "same_kernel", "axis"]
    if winners.empty:
        return pd.DataFrame(columns=columns)
    cases = winners.groupby("family").size().rename("cases")
    won = _one_name_per_kernel(winners.dropna(subset=["impl"]).astype({"tie": bool}))
    won = won.assign(_marked=~won["tie"] & won["caveat"].fillna("").astype(bool))
    agg = (
        won.groupby(["family", "impl"])
        .agg(
            wins=("seq_q", "size"),
            seq_min=("seq_q", "min"),
            seq_max=("seq_q", "max"),
            ties=("tie", "sum"),
            marked=("_marked", "sum"),
        )
        .reset_index()
    )
    agg["marks"] = [
        ", ".join(
            sorted(
                {
                    p
                    for c in won.loc[
                        (won["family"] == f) & (won["impl"] == i) & won["_marked"], "caveat"
                    ]
                    for p in str(c).split(", ")
                }
            )
        )
        for f, i in zip(agg["family"], agg["impl"])
    ]
    agg["same_kernel"] = [
        ", ".join(
            sorted(
                {
                    a
                    for c in won.loc[(won["family"] == f) & (won["impl"] == i), "same_kernel"]
                    for a in str(c).split(", ")
                    if a
                }
            )
        )
        for f, i in zip(agg["family"], agg["impl"])
    ]
    axis = {f: _family_axis(g) for f, g in winners.groupby("family")}
    agg["axis"] = [AXIS_NAME[axis[f]] for f in agg["family"]]
    agg["spans"] = [
        _spans(won[(won["family"] == f) & (won["impl"] == i)], winners[winners["family"] == f])
        if axis[f] == "seq_kv"
        else seq_spans(
            won.loc[(won["family"] == f) & (won["impl"] == i), "seq_q"],
            winners.loc[winners["family"] == f, "seq_q"],
        )
        for f, i in zip(agg["family"], agg["impl"])
    ]
    agg = agg.merge(cases.reset_index(), on="family")
    agg = agg.sort_values(["family", "wins", "impl"], ascending=[True, False, True])
    return agg[columns].reset_index(drop=True)
