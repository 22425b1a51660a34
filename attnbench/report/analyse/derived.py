"""The rules a report reads rows by: which rows are ok and agree, what a series and a case
family are (the unit a scaling fit runs over, scaling.py), how cases and series are
labelled; pandas in, pandas out. The run's analysis (analysis.py) applies them once;
sections and figures render it.

Only rows with ``status == "ok"`` ever become numbers; failed rows keep their blank (NA)
metrics and are only counted, so a failure can never pass for a measurement.

Series
------
A *series* is one impl with everything in the case key fixed except the sequence lengths.
N is ``seq_q``, and ``seq_kv`` either follows it (``Skv=Sq``, or ``Skv=r*Sq`` for a constant
ratio r) or is held fixed (``Skv=<value>``); or, in a decode series (a few new queries
against a growing KV cache), ``seq_q`` is held fixed (``Sq=<value>``) and N is ``seq_kv``.
That relation is part of the series key (column ``seq_kv_rule``; ``with_series`` adds it
and ``seq_n``, the N of each row), so series of different relations are never mixed in one
fit. Batch is fixed in a series too, except in a grid of fixed token count (batch × N the
same at every length, as the race preset sweeps): there ``batch_rule`` is ``B·N=<tokens>``
and the series runs over N, its time growing ~N^1 where full attention's grows ~N^2 at a
fixed batch.

The fit over each series is fits.py's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnbench.case import DTYPE_BYTES, MODES, Case, CaseError
from attnbench.dims import DIM, FAMILY_PARTS, LABEL_PARTS, LEGEND_PARTS
from attnbench.store.schema import CASE_KEY

SEQ_COLUMNS = ("seq_q", "seq_kv")
CASE_COLUMNS = tuple(c for c in CASE_KEY if c != "impl")  # a case: everything but the impl
# a series: a case's key less its lengths and batch, plus how batch (``batch_rule``) and seq_kv
# (``seq_kv_rule``, last) relate to the length N the series varies (``with_series``)
SERIES_KEY = (
    *("batch_rule" if c == "batch" else c for c in CASE_KEY if c not in SEQ_COLUMNS),
    "seq_kv_rule",
)
WIDE_INTERVAL = 1.2  # a 95% interval whose hi / lo exceeds this is too wide to state as a fact


def flag(value) -> bool:
    """A nullable boolean cell as a plain bool: NA counts as False."""
    return value is not pd.NA and value is not None and bool(value)


def is_ok(df: pd.DataFrame) -> pd.Series:
    """Plain bool mask of rows with status ok (NA status is not ok)."""
    return df["status"].eq("ok").fillna(False).astype(bool)


def ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    return df[is_ok(df)]


def noisy(df: pd.DataFrame) -> pd.Series:
    """Ok rows whose timing samples spread too far to trust the median (measure.timing)."""
    from attnbench.measure.flags import NOISY_SPREAD

    if not {"time_ms_p20", "time_ms_p80"} <= set(df.columns):  # a table without the spread
        return pd.Series(False, index=df.index)
    spread = (df["time_ms_p80"] - df["time_ms_p20"]) / df["time_ms"]
    return (is_ok(df) & (spread > NOISY_SPREAD).fillna(False)).astype(bool)


def agreeing(df: pd.DataFrame) -> pd.Series:
    """Plain bool mask: ok and agrees is True (unknown agreement does not count)."""
    return is_ok(df) & df["agrees"].eq(True).fillna(False).astype(bool)


def seq_kv_rule(df: pd.DataFrame) -> pd.Series:
    """How seq_kv relates to seq_q within each set of cases that differ only in length.

    Rows with seq_kv == seq_q get ``Skv=Sq``. The others, per group, are labelled by the
    relation that yields the fewest series: a constant ratio (``Skv=2*Sq``), a fixed seq_kv
    (``Skv=512``), or a fixed seq_q (``Sq=1``: the series varies the keys). Decode rows
    (phase decode: a few new queries against a growing cache) always take the fixed seq_q."""
    rule = pd.Series("Skv=Sq", index=df.index, dtype="string")
    cross = df[(df["seq_kv"] != df["seq_q"]).fillna(True).astype(bool)]
    if cross.empty:
        return rule
    group_cols = [c for c in CASE_COLUMNS if c not in SEQ_COLUMNS]
    for _, g in cross.groupby(group_cols, dropna=False, sort=False):
        ratio = g["seq_kv"].astype("Float64") / g["seq_q"].astype("Float64")
        by_ratio = ratio.nunique() < g["seq_kv"].nunique()
        fewest = min(ratio.nunique(), g["seq_kv"].nunique())
        if str(g["phase"].iloc[0]) == "decode" or g["seq_q"].nunique() < fewest:
            rule.loc[g.index] = [f"Sq={v}" for v in g["seq_q"]]
        elif by_ratio:
            rule.loc[g.index] = [f"Skv={r:g}*Sq" for r in ratio]
        else:
            rule.loc[g.index] = [f"Skv={v}" for v in g["seq_kv"]]
    return rule


def batch_rule(df: pd.DataFrame) -> pd.Series:
    """How batch relates to N within each set of cases that differ only in batch and length
    (df has seq_kv_rule and seq_n): ``B·N=16384`` where every length has one batch, batch
    varies and batch × N is the same for all (a fixed token count, as the race preset
    sweeps), else ``B=<batch>`` per row, so a fixed-token grid gives one series over N
    rather than one point per batch."""
    rule = "B=" + df["batch"].astype("string")
    group_cols = [c for c in CASE_COLUMNS if c not in ("batch", *SEQ_COLUMNS)] + ["seq_kv_rule"]
    for _, g in df.groupby(group_cols, dropna=False, sort=False):
        pairs = g[["batch", "seq_n"]].drop_duplicates()
        tokens = (pairs["batch"] * pairs["seq_n"]).unique()
        one_batch_per_n = not pairs["seq_n"].duplicated().any()
        if len(pairs) > 1 and pairs["batch"].nunique() > 1 and one_batch_per_n and len(tokens) == 1:
            rule.loc[g.index] = f"B·N={tokens[0]}"
    return rule


def length_axis(rule) -> str:
    """The length a series varies: seq_kv for a fixed-query rule (``Sq=1``), else seq_q."""
    return "seq_kv" if str(rule).startswith("Sq=") else "seq_q"


def with_series(df: pd.DataFrame) -> pd.DataFrame:
    """df with ``seq_kv_rule`` (the series key's length relation) and ``seq_n``, the length
    the row's series varies (seq_q, or seq_kv for a fixed-query series); a frame that has
    them already comes back as it is, so a series is defined once per analysis."""
    if {"seq_kv_rule", "seq_n", "batch_rule"} <= set(df.columns):
        return df
    out = df.copy()
    out["seq_kv_rule"] = seq_kv_rule(out)
    axis = out["seq_kv_rule"].map(length_axis)
    out["seq_n"] = out["seq_kv"].where(axis == "seq_kv", out["seq_q"])
    out["batch_rule"] = batch_rule(out)
    return out


def groups(df: pd.DataFrame, key) -> list[tuple[tuple, np.ndarray]]:
    """The groups of ``df`` by the columns ``key`` (blanks a value of their own, sorted as
    groupby sorts them): each group's key values and its rows' positions. The key columns
    alone are grouped, so no frame is copied per group (a results row has some 80 columns)."""
    by = df[list(key)].groupby(list(key), dropna=False, sort=True)
    ids = by.ngroup().to_numpy()
    order = np.argsort(ids, kind="stable")
    cuts = np.flatnonzero(np.diff(ids[order])) + 1
    keys = [k if isinstance(k, tuple) else (k,) for k in by.size().index]
    return list(zip(keys, np.split(order, cuts))) if len(ids) else []


def _label_parts(r, shown: set[str]) -> list[str]:
    """A series' legend: each dimension's legend part (dims.py: those said always, and the
    others where they vary between the series), then its length relation."""
    parts = [d.legend.text(r) for d in LEGEND_PARTS if d.legend.always or d.name in shown]
    return [str(p) for p in (*parts, r["seq_kv_rule"]) if not pd.isna(p) and str(p)]


def series_labels(series: pd.DataFrame, always=()) -> pd.Series:
    """A label per series (rows carrying SERIES_KEY): mode, causal, dtype, B, H, D and the
    length relation, plus every other key column that varies between the rows (mask, its
    spec, model, phase, ...) and those in ``always``, so that no two series of one impl
    share a label."""
    if series.empty:
        return pd.Series([], index=series.index, dtype="string")
    key = [c for c in SERIES_KEY if c != "impl" and c in series]
    shown = {c for c in key if series[c].nunique(dropna=False) > 1} | set(always)
    labels = pd.Series(
        [" ".join(_label_parts(r, shown)) for _, r in series.iterrows()], index=series.index
    )
    ident = ["|".join(map(str, t)) for t in series[key].itertuples(index=False)]  # per series
    named = pd.DataFrame({"impl": series.get("impl", ""), "label": labels, "ident": ident})
    clash = named.groupby(["impl", "label"])["ident"].transform("nunique") > 1
    if clash.any():  # a format that hides a difference: spell the key out
        labels[clash] = [" ".join(f"{c}={r[c]}" for c in key) for _, r in series[clash].iterrows()]
    return labels.astype("string")


# the case dimensions in the case label's order, then those without a part of their own
LABEL_ORDER = tuple(dict.fromkeys([*(d.name for d in LABEL_PARTS), *CASE_COLUMNS]))


def dim_text(name: str, value) -> str:
    """One dimension's value in a table: 'B=4', 'Skv=4096', 'bfloat16', 'causal=True'."""
    return f"{DIM[name].title_prefix}{value}" if name in DIM else f"{name}={value}"


def case_labels(df: pd.DataFrame) -> pd.Series:
    """Each row's case by the case dimensions that vary among the rows of ``df`` (the cases
    one table lists), e.g. 'B=1 Sq=4 Skv=4096': two cases of one table never share a label,
    and what every row shares is left to the table's heading."""
    vary = [c for c in LABEL_ORDER if c in df and df[c].nunique(dropna=False) > 1]
    if {"seq_q", "seq_kv"} <= set(df) and df["seq_kv"].eq(df["seq_q"]).all():
        vary = [c for c in vary if c != "seq_kv"]  # self-attention: Skv says nothing more
    parts = [[dim_text(c, v) for v in df[c]] for c in vary]  # per column: no row objects
    labels = [" ".join(p) for p in zip(*parts)] if vary else [""] * len(df)
    return pd.Series(labels, index=df.index, dtype="string")


def case_label(row) -> str:
    """One row's whole case ('llama3-8b decode B1 H32/8 S1x4096 D128 bfloat16 causal fwd'), or
    its case columns as they are where they do not make a case."""
    try:
        return Case.from_row(row).label()
    except (CaseError, TypeError, ValueError, KeyError):
        return " ".join(f"{k}={row[k]}" for k in CASE_COLUMNS)


def per_case(df: pd.DataFrame, fn) -> list:
    """``fn(row)`` for each row of ``df``, computed once per case (the rows that share every
    case column; ``fn`` reads only those) from its first row: a case's impls share it."""
    if df.empty:
        return []
    key = [c for c in CASE_COLUMNS if c in df]
    case = df[key].groupby(key, dropna=False, sort=False).ngroup().to_numpy()
    first = np.unique(case, return_index=True)[1]  # per case id, its first row
    values = [fn(r) for _, r in df.iloc[first].iterrows()]
    return [values[c] for c in case]


def case_family(df: pd.DataFrame) -> pd.Series:
    """A readable family label per row: each dimension's family part (dims.py: mode, dtype,
    causal/full, head dim, the mask, gqa and cross when they apply, the device where the
    frame has several); batch, heads and lengths vary inside a family."""
    if "family" in df:  # added once by the run's analysis
        return df["family"]
    if df.empty:
        return pd.Series([], index=df.index, dtype="string")
    said = [
        d
        for d in FAMILY_PARTS
        if d.family.always or df[d.name].nunique() > 1  # e.g. the device, when several
    ]
    labels = per_case(df, lambda r: " ".join(p for p in (d.family.text(r) for d in said) if p))
    return pd.Series(labels, index=df.index, dtype="string")


def mode_rank(mode) -> int:
    """Position of a mode in MODES (fwd, bwd, fwd_bwd); unknown modes last."""
    return MODES.index(mode) if mode in MODES else len(MODES)


def family_order(df: pd.DataFrame) -> list[str]:
    """The case families of df, fwd before bwd before fwd_bwd, then by name."""
    if df.empty:
        return []
    fams = pd.DataFrame({"family": case_family(df), "rank": df["mode"].map(mode_rank)})
    fams = fams.drop_duplicates("family").sort_values(["rank", "family"])
    return list(fams["family"])


def kv_cache_mib(df: pd.DataFrame) -> pd.Series:
    """Each row's K and V as the case holds them: B·Hkv·Skv·D elements each, in MiB."""
    elements = df["batch"] * df["kv_heads"] * df["seq_kv"] * df["head_dim"] * 2
    return elements * df["dtype"].map(DTYPE_BYTES).fillna(4) / 2**20


def contended(df: pd.DataFrame) -> pd.Series:
    """Plain bool mask of rows whose threads waited for a CPU while timed (``contended``)."""
    if "contended" not in df:
        return pd.Series(False, index=df.index)
    return df["contended"].eq(True).fillna(False).astype(bool)


def caveat(contended_rows: bool, lo=None, hi=None, noisy_rows: bool = False) -> str:
    """What a stated number rests on, in words ('' when nothing): contended rows, a paired
    interval wider than WIDE_INTERVAL, or (without an interval) noisy rows."""
    parts = ["contended"] if contended_rows else []
    if lo is not None and hi is not None and not pd.isna(lo) and not pd.isna(hi) and lo > 0:
        if hi / lo > WIDE_INTERVAL:
            parts.append("wide interval")
    elif noisy_rows:
        parts.append("noisy")
    return ", ".join(parts)


def support_counts(df: pd.DataFrame) -> pd.DataFrame:
    """Rows per (impl, family, status); a missing status counts as ``missing``."""
    if df.empty:
        return pd.DataFrame(columns=["impl", "family", "status", "count"])
    out = df.assign(family=case_family(df), status=df["status"].fillna("missing"))
    return out.groupby(["impl", "family", "status"]).size().rename("count").reset_index()


def disagreements(df: pd.DataFrame) -> pd.DataFrame:
    """Ok rows whose agreement is False or unknown, with their error, bound and reason."""
    ok = ok_rows(df)
    bad = ok[~ok["agrees"].eq(True).fillna(False).astype(bool)]
    return bad.sort_values(["impl", *CASE_COLUMNS]).reset_index(drop=True)


def failures(df: pd.DataFrame) -> pd.DataFrame:
    """Every non-ok row (status missing included)."""
    return df[~is_ok(df)].sort_values(["impl", *CASE_COLUMNS]).reset_index(drop=True)


def min_bytes(df: pd.DataFrame) -> pd.Series:
    """The fewest bytes each row's timed work can move (Case.bytes_moved, the denominator of
    ``gbps``); NA for a row that is not a valid case."""

    def one(r):
        try:
            return Case.from_row(r).bytes_moved()
        except (CaseError, TypeError, ValueError, KeyError):
            return pd.NA

    return pd.Series(per_case(df, one), index=df.index, dtype="Float64")


def arithmetic_intensity(df: pd.DataFrame) -> pd.Series:
    """FLOPs per byte of the least traffic (``min_bytes``): x axis of the roofline."""
    return (df["flops"] / min_bytes(df)).astype("Float64")


def kernel_table(kernels: pd.DataFrame, top: int = 8) -> pd.DataFrame:
    """Per impl, its kernels (GPU) or ops (CPU) over every profiled case: calls, total time
    and share of the impl's profiled time; the ``top`` largest of each impl."""
    if kernels.empty:
        return kernels
    agg = kernels.groupby(["impl", "kernel"], as_index=False).agg(
        calls=("calls", "sum"), total_us=("total_us", "sum")
    )
    agg["share"] = agg["total_us"] / agg.groupby("impl")["total_us"].transform("sum")
    agg = agg.sort_values(["impl", "total_us"], ascending=[True, False])
    return agg.groupby("impl", as_index=False).head(top).reset_index(drop=True)
