"""Which impl to use per model preset and phase (rows from --model only)."""

from __future__ import annotations

import pandas as pd

from attnbench.models import ATTN_IMPLEMENTATIONS
from attnbench.report.analysis import CASE_COLUMNS, agreeing
from attnbench.report.rounds import Rounds
from attnbench.report.verdicts import fastest_agreeing


def recommendations(df: pd.DataFrame, rounds: Rounds | None = None) -> pd.DataFrame:
    """Per (model, phase) of the rows from model presets: the impl that is fastest (and
    agrees with the reference) in the most cases, its wins, its median margin over the
    runner-up and median peak memory in the cases it won, and every other impl that was
    not ok or disagreed somewhere, with why. Ties in wins go to the lower median time.

    ``attn_implementation``: among the rows of transformers' attention functions (the hf_*
    impls, models.ATTN_IMPLEMENTATIONS), the transformers setting whose function wins the
    most cases by the same rule, and ``attn_wins`` its wins among them (NA without such
    rows)."""
    columns = [
        "model",
        "phase",
        "cases",
        "impl",
        "wins",
        "margin",
        "time_ms",
        "peak_mem_mib",
        "runner_up",
        "attn_implementation",
        "attn_wins",
        "attn_ties",
        "attn_marks",
        "ties",
        "marks",
        "not_run",
    ]
    rows_of_models = df[df["model"].fillna("").astype(str) != ""]
    if rows_of_models.empty:
        return pd.DataFrame(columns=columns)
    winners = fastest_agreeing(rows_of_models, rounds)
    hf_rows = rows_of_models[rows_of_models["impl"].isin(ATTN_IMPLEMENTATIONS)]
    hf_winners = fastest_agreeing(hf_rows, rounds)
    out = []
    for (model, phase), g in rows_of_models.groupby(["model", "phase"], dropna=False, sort=False):
        row = {"model": model, "phase": phase if isinstance(phase, str) else ""}
        row["cases"] = int(g[list(CASE_COLUMNS)].drop_duplicates().shape[0])
        hf_best, hf_counts = _most_wins(_of(hf_winners, model, phase))
        if hf_best is not None:
            row.update(
                attn_implementation=ATTN_IMPLEMENTATIONS[hf_best],
                attn_wins=int(hf_counts.loc[hf_best, "wins"]),
                **_evidence(_of(hf_winners, model, phase), hf_best, "attn_"),
            )
        w = _of(winners, model, phase)
        best, counts = _most_wins(w)
        if best is not None:
            won = w[w["impl"] == best]
            mem = g[(g["impl"] == best) & agreeing(g)]["peak_mem_mib"].dropna()
            row.update(
                impl=best,
                wins=int(counts.loc[best, "wins"]),
                margin=float(won["margin"].median()) if won["margin"].notna().any() else None,
                time_ms=float(won["time_ms"].median()),
                peak_mem_mib=float(mem.median()) if len(mem) else None,
                runner_up=won["runner_up"].dropna().mode().iloc[0]
                if won["runner_up"].notna().any()
                else None,
                **_evidence(w, best),
            )
        row["not_run"] = _not_run(g)
        out.append(row)
    return pd.DataFrame(out, columns=columns)


def _of(winners: pd.DataFrame, model, phase) -> pd.DataFrame:
    """The won cases (impl not NA) of one model and phase."""
    if winners.empty:
        return winners
    w = winners[(winners["model"] == model) & (winners["phase"].fillna("") == (phase or ""))]
    return w[w["impl"].notna()]


def _most_wins(w: pd.DataFrame) -> tuple[str | None, pd.DataFrame | None]:
    """The impl winning the most cases of ``w`` (ties: the lower median time), and the wins
    and median time of each impl."""
    if w.empty:
        return None, None
    counts = w.groupby("impl").agg(wins=("impl", "size"), time=("time_ms", "median"))
    return counts.sort_values(["wins", "time"], ascending=[False, True]).index[0], counts


def _evidence(won: pd.DataFrame, impl: str, prefix: str = "") -> dict:
    """How many of ``impl``'s wins are ties, and the caveats of the others."""
    mine = won[won["impl"] == impl]
    ties = mine["tie"].astype(bool)
    marks = {p for c in mine.loc[~ties, "caveat"].fillna("") for p in str(c).split(", ") if p}
    return {f"{prefix}ties": int(ties.sum()), f"{prefix}marks": ", ".join(sorted(marks))}


def _not_run(g: pd.DataFrame) -> str:
    """Impls with a row that is not ok or disagrees, each with its first reason."""
    bad = g[~agreeing(g)]
    parts = []
    for impl, rows in bad.groupby("impl", sort=True):
        first = rows.iloc[0]
        status = first["status"] if first["status"] != "ok" else "disagrees"
        reason = str(first["reason"]).split(";")[0] if not pd.isna(first["reason"]) else ""
        n = f" in {len(rows)}/{len(g[g['impl'] == impl])} cases"
        parts.append(f"{impl}: {status}{n}" + (f" ({reason})" if reason else ""))
    return "; ".join(parts)
