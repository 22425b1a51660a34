"""Run A vs run B: per-case time ratios, one-sided and not-ok cases, and a regression gate.

A case here is a full CASE_KEY (impl included). ``ratio = time_ms_B / time_ms_A`` only where
the case is ok in both runs; above 1 means B is slower. ``verdict`` says whether the change is
outside the noise of the two runs (docs/reports.md, "Noise": their p20-p80 ranges do not
overlap): "slower", "faster", or "unchanged (within noise)". The gate fails when a compared
case got slower, outside the noise, by more than the threshold, and also when a case that was
ok in A is not ok in B (a kernel that starts crashing or running out of memory is a regression
too). Cases present in one run only, or not ok in A, are listed and do not fail the gate.

If a run folder holds several rows for one case (a resumed sweep), the last one wins.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from attnbench.report import plots
from attnbench.report.header import busy_machine, case_label, device_name
from attnbench.report.markdown import MISSING, table
from attnbench.store.atomic import atomic_dir
from attnbench.store.env import COMPARE_FIELDS, code_version
from attnbench.store.schema import CASE_KEY

WITHIN_NOISE = "unchanged (within noise)"
SHOWN_PER_OUTCOME = 5  # the terminal summary names this many cases per outcome; compare.md all
SIDE_COLUMNS = ("status", "reason", "time_ms", "time_ms_p20", "time_ms_p80")
OUTCOMES = ("compared", "not ok in B", "not ok in A", "not ok in both", "only in A", "only in B")


def compare_runs(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """One row per case in either run: CASE_KEY, <side column>_a/_b, outcome, ratio and
    overlap (the p20–p80 ranges of A and B overlap: the change is within the spread)."""
    key = list(CASE_KEY)

    def side(df, suffix):
        df = df.drop_duplicates(key, keep="last")[[*key, *SIDE_COLUMNS]]
        return df.rename(columns={c: f"{c}_{suffix}" for c in SIDE_COLUMNS})

    out = side(a, "a").merge(side(b, "b"), on=key, how="outer", indicator=True)
    ok_a = out["status_a"].eq("ok").fillna(False).astype(bool)
    ok_b = out["status_b"].eq("ok").fillna(False).astype(bool)
    outcome = np.select(
        [
            out["_merge"].eq("left_only"),
            out["_merge"].eq("right_only"),
            ok_a & ok_b,
            ok_a & ~ok_b,
            ~ok_a & ok_b,
        ],
        ["only in A", "only in B", "compared", "not ok in B", "not ok in A"],
        default="not ok in both",
    )
    out["outcome"] = pd.array(outcome, dtype="string")
    usable = (
        (out["outcome"] == "compared")
        & (out["time_ms_a"] > 0).fillna(False)
        & out["time_ms_b"].notna()
    ).astype(bool)
    out["ratio"] = pd.array([pd.NA] * len(out), dtype="Float64")
    out.loc[usable, "ratio"] = out.loc[usable, "time_ms_b"] / out.loc[usable, "time_ms_a"]
    overlap = (out["time_ms_p20_b"] <= out["time_ms_p80_a"]) & (
        out["time_ms_p20_a"] <= out["time_ms_p80_b"]
    )
    out["overlap"] = overlap.where(usable).astype("boolean")
    # no p20/p80 (an older CSV): no noise to judge by, the ratio alone decides
    noisy = out["overlap"].fillna(False).astype(bool)
    ratio = out["ratio"].astype(float)
    verdict = np.select(
        [~usable, noisy, ratio > 1, ratio < 1],
        ["", WITHIN_NOISE, "slower", "faster"],
        default=WITHIN_NOISE,
    )
    out["verdict"] = pd.Series(verdict, index=out.index, dtype="string").replace("", pd.NA)
    out = out.drop(columns="_merge")
    order = {o: i for i, o in enumerate(OUTCOMES)}
    out = out.assign(_o=out["outcome"].map(order)).sort_values(["_o", *key], kind="stable")
    return out.drop(columns="_o").reset_index(drop=True)


def regressions(cmp: pd.DataFrame, fail_above_pct: float) -> pd.DataFrame:
    """Rows that fail the gate: compared and slower, outside the noise, by more than the
    threshold, or ok in A and not ok in B."""
    slower = (
        ((cmp["ratio"] > 1 + fail_above_pct / 100) & cmp["verdict"].eq("slower"))
        .fillna(False)
        .astype(bool)
    )
    broke = cmp["outcome"].eq("not ok in B").fillna(False).astype(bool)
    return cmp[slower | broke]


NOTHING_COMPARED = (
    "no case is ok in both runs, so nothing was compared (A and B must share cases: the same "
    "grid, impls and device)"
)


def gate_fails(cmp: pd.DataFrame, fail_above_pct: float) -> bool:
    """The gate fails on a regression, and when it compared nothing: a gate that checked no
    case cannot pass."""
    return bool(len(regressions(cmp, fail_above_pct))) or not cmp["ratio"].notna().any()


def within_noise(cmp: pd.DataFrame, fail_above_pct: float) -> pd.DataFrame:
    """Compared rows past the threshold whose change is inside the noise (not counted)."""
    past = (cmp["ratio"] - 1).abs() > fail_above_pct / 100
    return cmp[(past & cmp["verdict"].eq(WITHIN_NOISE)).fillna(False).astype(bool)]


def geomean_by_impl(cmp: pd.DataFrame) -> pd.DataFrame:
    """Per impl over compared cases: count, geometric-mean ratio, min and max."""
    both = cmp[cmp["ratio"].notna()]
    if both.empty:
        return pd.DataFrame(columns=["impl", "cases", "geomean", "min", "max"])
    g = both.groupby("impl")["ratio"]
    out = pd.DataFrame(
        {
            "cases": g.size(),
            "geomean": g.apply(lambda r: math.exp(np.log(r.astype(float)).mean())),
            "min": g.min(),
            "max": g.max(),
        }
    )
    return out.reset_index()


def env_differences(env_a: dict, env_b: dict) -> list[tuple[str, str, str]]:
    return [
        (k, str(env_a.get(k)), str(env_b.get(k)))
        for k in COMPARE_FIELDS
        if env_a.get(k) != env_b.get(k) and k != "command"
    ]


def describe_case(row) -> str:
    return f"{row['impl']}: {case_label(row)}"


def render(
    cmp: pd.DataFrame,
    names: tuple[str, str],
    envs: tuple[dict, dict],
    frames: tuple[pd.DataFrame, pd.DataFrame],
    fail_above_pct: float | None,
) -> str:
    lines = _heading(names, envs, frames)
    counts = cmp["outcome"].value_counts()
    lines += [
        "## Summary",
        "",
        ", ".join(f"{counts[o]} {o}" for o in OUTCOMES if o in counts) + ".",
        "",
    ]
    if fail_above_pct is not None:
        lines += _gate_lines(cmp, fail_above_pct)
    return "\n".join(lines + _tables(cmp, names)).rstrip() + "\n"


def _heading(names, envs, frames) -> list[str]:
    """Title, the two runs side by side, and warnings about their environments."""
    a_name, b_name = names
    lines = [
        f"# attnbench compare: `{a_name}` (A) vs `{b_name}` (B)",
        "",
        "ratio = time_ms(B) / time_ms(A) for cases ok in both runs; above 1: B is "
        "slower. overlap: the p20–p80 ranges of the two runs overlap, so the change is "
        "within the spread of the samples and the verdict is 'unchanged (within noise)' "
        "whatever the ratio; 'slower' and 'faster' are changes outside the noise.",
        "",
    ]
    heads = pd.DataFrame(
        [
            ("device", device_name(envs[0], frames[0]), device_name(envs[1], frames[1])),
            ("date (UTC)", envs[0].get("time_utc"), envs[1].get("time_utc")),
            (
                "git",
                *(code_version(e) or MISSING for e in envs),
            ),
            ("torch", envs[0].get("torch"), envs[1].get("torch")),
            ("command", f"`{envs[0].get('command')}`", f"`{envs[1].get('command')}`"),
        ],
        columns=["field", "A", "B"],
    )
    lines.append(table(heads))
    diffs = [d for d in env_differences(*envs) if d[0] not in ("git_sha", "git_dirty")]
    if diffs:
        lines += [
            "> **The environments differ** ("
            + "; ".join(f"{k}: {a} → {b}" for k, a, b in diffs)
            + "): ratios mix the change under test with these.",
            "",
        ]
    busy = [n for n, e in zip(names, envs) if busy_machine(e)]
    if busy:
        lines += [
            f"> **Busy machine** when {' and '.join(f'`{n}`' for n in busy)} started "
            f"(1-minute load above half the cores): those times are inflated and noisy, "
            f"so ratios can move by far more than any code change.",
            "",
        ]
    return lines


def _gate_lines(cmp: pd.DataFrame, fail_above_pct: float) -> list[str]:
    """The gate's verdict, the cases that fail it, and those past it within the noise."""
    reg = regressions(cmp, fail_above_pct)
    verdict = (
        f"**FAIL**: {len(reg)} case(s) slower, outside the noise, by more than "
        f"{fail_above_pct:g}% or newly failing"
        if len(reg)
        else f"**FAIL**: {NOTHING_COMPARED}"
        if gate_fails(cmp, fail_above_pct)
        else f"PASS: no case slower, outside the noise, by more than {fail_above_pct:g}%, "
        f"none newly failing"
    )
    lines = [f"Gate: {verdict}.", ""]
    if len(reg):
        lines.append(_case_table(reg))
    quiet = within_noise(cmp, fail_above_pct)
    if len(quiet):
        lines += [
            f"{len(quiet)} case(s) moved by more than {fail_above_pct:g}% but within the "
            f"noise of the two runs (their p20–p80 ranges overlap): not counted.",
            "",
            _case_table(quiet),
        ]
    return lines


def _tables(cmp: pd.DataFrame, names: tuple[str, str]) -> list[str]:
    """Per impl geomeans, the compared cases, and every case not compared, by outcome."""
    a_name, b_name = names
    lines = []
    gm = geomean_by_impl(cmp)
    if len(gm):
        lines += ["### Per impl", ""]
        lines.append(
            table(
                gm,
                {
                    "impl": "impl",
                    "cases": "cases",
                    "geomean": "geomean ratio",
                    "min": "min",
                    "max": "max",
                },
                formats={"geomean": ".3f", "min": ".3f", "max": ".3f"},
            )
        )
    lines += ["## Compared cases (slowest in B first)", ""]
    both = cmp[cmp["ratio"].notna()].sort_values("ratio", ascending=False)
    lines.append(_case_table(both) if len(both) else "None.\n")
    lines += ["![ratio vs sequence length](ratio_vs_seq.png)", ""]
    for outcome, title in (
        ("not ok in B", "Ok in A, not ok in B"),
        ("not ok in A", "Not ok in A, ok in B"),
        ("not ok in both", "Not ok in either run"),
        ("only in A", f"Only in A ({a_name})"),
        ("only in B", f"Only in B ({b_name})"),
    ):
        rows = cmp[cmp["outcome"] == outcome]
        lines += [f"## {title} ({len(rows)})", ""]
        lines.append(_case_table(rows) if len(rows) else "None.\n")
    return lines


def _case_table(rows: pd.DataFrame) -> str:
    rows = rows.assign(case=[case_label(r) for _, r in rows.iterrows()])
    return table(
        rows,
        {
            "impl": "impl",
            "case": "case",
            "outcome": "outcome",
            "time_ms_a": "A time_ms",
            "time_ms_b": "B time_ms",
            "ratio": "ratio",
            "verdict": "verdict",
            "overlap": "overlap",
            "status_a": "A status",
            "status_b": "B status",
            "reason_b": "B reason",
        },
        formats={"ratio": ".3f", "time_ms_a": ".4g", "time_ms_b": ".4g"},
    )


def summary_lines(cmp: pd.DataFrame, fail_above_pct: float | None) -> list[str]:
    """Plain-text lines for the terminal."""
    counts = cmp["outcome"].value_counts()
    lines = ["cases: " + ", ".join(f"{counts[o]} {o}" for o in OUTCOMES if o in counts)]
    for r in geomean_by_impl(cmp).itertuples():
        lines.append(
            f"  {r.impl}: geomean B/A {r.geomean:.3f} over {r.cases} cases "
            f"(min {r.min:.3f}, max {r.max:.3f})"
        )
    for outcome in ("not ok in B", "not ok in A", "only in A", "only in B"):
        rows = cmp[cmp["outcome"] == outcome]
        for _, r in rows.head(SHOWN_PER_OUTCOME).iterrows():
            status = (
                f" [A {r['status_a'] if pd.notna(r['status_a']) else MISSING}, "
                f"B {r['status_b'] if pd.notna(r['status_b']) else MISSING}]"
            )
            lines.append(f"  {outcome}: {describe_case(r)}{status}")
        if len(rows) > SHOWN_PER_OUTCOME:
            lines.append(
                f"  ... and {len(rows) - SHOWN_PER_OUTCOME} more {outcome} "
                f"(compare.md lists every case)"
            )
    if fail_above_pct is not None:
        reg = regressions(cmp, fail_above_pct)
        for _, r in reg.iterrows():
            if r["outcome"] == "compared":
                lines.append(f"REGRESSION +{(r['ratio'] - 1) * 100:.1f}%: {describe_case(r)}")
            else:
                lines.append(f"REGRESSION now {r['status_b']}: {describe_case(r)}")
        for _, r in within_noise(cmp, fail_above_pct).iterrows():
            lines.append(
                f"unchanged (within noise) {(r['ratio'] - 1) * 100:+.1f}%: {describe_case(r)} "
                f"(p20-p80 ranges overlap; not counted)"
            )
        if not len(reg) and gate_fails(cmp, fail_above_pct):
            lines.append(f"gate: FAIL (--fail-above {fail_above_pct:g}%: {NOTHING_COMPARED})")
        else:
            lines.append(
                f"gate: {'FAIL' if len(reg) else 'PASS'} (--fail-above "
                f"{fail_above_pct:g}%: {len(reg)} case(s) slower, outside the noise, by more, "
                f"or newly failing)"
            )
    return lines


def write_compare(
    run_a: tuple[str, pd.DataFrame, dict],
    run_b: tuple[str, pd.DataFrame, dict],
    out_dir,
    fail_above_pct: float | None = None,
) -> tuple[pd.DataFrame, Path]:
    """Write compare.md, compare.csv and ratio_vs_seq.png(+svg) into out_dir atomically."""
    (a_name, a_df, a_env), (b_name, b_df, b_env) = run_a, run_b
    cmp = compare_runs(a_df, b_df)
    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        fig = plots.plot_ratio_vs_seq(
            cmp,
            fail_above_pct=fail_above_pct,
            title=f"{b_name} / {a_name} time ratio",
            device_name=device_name(b_env, b_df),
            colors=plots.run_colors(
                {"impls": {**(a_env.get("impls") or {}), **(b_env.get("impls") or {})}},
                cmp["impl"].dropna().unique(),
            ),
        )
        plots.save_figure(fig, tmp / "ratio_vs_seq")
        cmp.to_csv(tmp / "compare.csv", index=False)
        text = render(cmp, (a_name, b_name), (a_env, b_env), (a_df, b_df), fail_above_pct)
        (tmp / "compare.md").write_text(text, encoding="utf-8")
    return cmp, out_dir / "compare.md"
