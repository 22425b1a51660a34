"""Run A vs run B: per-case time ratios, one-sided and not-ok cases, and a regression gate.

A case here is a full CASE_KEY (impl included). ``ratio_raw = time_ms_B / time_ms_A`` only
where the case is ok in both runs; above 1 means B is slower. Where both runs timed the case in
interleaved rounds (samples.csv ``round``), ``ratio`` is the ratio of the medians of the
per-round times, each round's time divided by the speed anchor's time in that round for the
resource the row is bound by (when both runs have anchor.csv: the machine's own change between
the runs cancels), with a bootstrap interval (``ratio_lo``, ``ratio_hi``). That interval
comes from the rounds of each run and cannot see how far the machine moves *between* runs,
which on a shared 2-core VM is 10-19% per case (a robust standard deviation) for identical
code, whole cases moving together. So the smallest change called is measured too: NOISE_Z
times the robust spread of the log ratios of all compared cases (``noise_pct``, from at least
NOISE_MIN_CASES cases), and at least MIN_EFFECT_PCT (``min_change_pct``). The verdict is
"slower" or "faster" when the interval excludes 1 and the change is at least that, "contended
(not judged)" when a run's row was contended, else "unchanged (within noise)". Runs without
rounds keep the older rule (``rule``): the ratio of the medians, judged by whether the two
runs' p20-p80 ranges overlap.

The gate fails when a compared case got slower, by that verdict, by more than the threshold,
and also when a case that was ok in A is not ok in B (a kernel that starts crashing or running
out of memory is a regression too). Cases present in one run only, or not ok in A, are listed
and do not fail the gate. Without a regression, a gate that could judge fewer than
JUDGED_MIN_SHARE of the compared cases (the rest contended) cannot pass: it says so in one
line (``cannot_judge``) and the command exits with a code of its own.

If a run folder holds several rows for one case (a resumed sweep), the last one wins.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from attnbench.report.analyse import derived
from attnbench.report.analyse.figure_data import ratio_lines
from attnbench.report.analyse.machine import busy_machine, device_title
from attnbench.report.analyse.rounds import RESOURCES, AnchorRounds, Rounds
from attnbench.report.compare.judge import (
    CONTENDED,
    MAX_MACHINE_CHANGE,
    MIN_EFFECT_PCT,
    NOISE_MIN_CASES,
    NOISE_Z,
    ROUND_RULES,
    RULE_OVERLAP,
    RULE_ROUNDS,
    RULE_WILD_ANCHOR,
    WITHIN_NOISE,
    judge_rounds,
    judge_rows,
)
from attnbench.report.plot import plots
from attnbench.report.render.markdown import MISSING, table
from attnbench.store.atomic import atomic_dir
from attnbench.store.env import COMPARE_FIELDS, code_version
from attnbench.store.schema import CASE_KEY

SHOWN_PER_OUTCOME = 5  # the terminal summary names this many cases per outcome; compare.md all
SIDE_COLUMNS = ("status", "reason", "time_ms", "time_ms_p20", "time_ms_p80", "bound", "contended")
OUTCOMES = ("compared", "not ok in B", "not ok in A", "not ok in both", "only in A", "only in B")


def compare_runs(
    a: pd.DataFrame,
    b: pd.DataFrame,
    rounds: tuple[Rounds | None, Rounds | None] = (None, None),
    anchors: tuple[AnchorRounds | None, AnchorRounds | None] = (None, None),
) -> pd.DataFrame:
    """One row per case in either run: CASE_KEY, <side column>_a/_b, outcome, ratio_raw,
    ratio with its interval (ratio_lo, ratio_hi), machine (the speed anchor's B/A time for
    the row's resource: above 1, the machine was slower in B), rule, overlap (the p20–p80
    ranges of A and B overlap) and verdict (module docstring)."""
    key = list(CASE_KEY)

    def side(df, suffix):
        df = df.reindex(columns=[*key, *SIDE_COLUMNS]).drop_duplicates(key, keep="last")
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
    na = pd.array([pd.NA] * len(out), dtype="Float64")
    out["ratio_raw"] = na.copy()
    out.loc[usable, "ratio_raw"] = out.loc[usable, "time_ms_b"] / out.loc[usable, "time_ms_a"]
    overlap = (out["time_ms_p20_b"] <= out["time_ms_p80_a"]) & (
        out["time_ms_p20_a"] <= out["time_ms_p80_b"]
    )
    out["overlap"] = overlap.where(usable).astype("boolean")
    out = out.drop(columns="_merge")
    out = judge_rows(out, usable, judge_rounds(out[usable], rounds, anchors))
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


JUDGED_MIN_SHARE = 0.5  # the gate judges when at least this share of compared cases got a verdict


def cannot_judge(cmp: pd.DataFrame) -> str | None:
    """Why the gate cannot judge, in one line, when fewer than JUDGED_MIN_SHARE of the
    compared cases got a verdict (the others contended: another process held a CPU while a
    run timed them); None when it can. A gate that judged too few cases must not pass."""
    compared = cmp["ratio"].notna()
    held = cmp["verdict"].eq(CONTENDED).fillna(False).astype(bool) & compared
    n, judged = int(compared.sum()), int((compared & ~held).sum())
    if n == 0 or judged >= JUDGED_MIN_SHARE * n:
        return None
    return (
        f"CANNOT JUDGE: only {judged} of {n} compared case(s) could be judged ({n - judged} "
        f"contended: another process held a CPU while a run timed them; at least "
        f"{JUDGED_MIN_SHARE:.0%} are needed); rerun both on an idle machine"
    )


def within_noise(cmp: pd.DataFrame, fail_above_pct: float) -> pd.DataFrame:
    """Compared rows past the threshold whose change is inside the noise, or not judged
    (contended): not counted."""
    past = (cmp["ratio"] - 1).abs() > fail_above_pct / 100
    quiet = cmp["verdict"].isin([WITHIN_NOISE, CONTENDED])
    return cmp[(past & quiet).fillna(False).astype(bool)]


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
    return f"{row['impl']}: {derived.case_label(row)}"


def render(
    cmp: pd.DataFrame,
    names: tuple[str, str],
    envs: tuple[dict, dict],
    frames: tuple[pd.DataFrame, pd.DataFrame],
    fail_above_pct: float | None,
) -> str:
    lines = _heading(cmp, names, envs, frames)
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


def _heading(cmp, names, envs, frames) -> list[str]:
    """Title, the two runs side by side, and warnings about their environments."""
    a_name, b_name = names
    lines = [
        f"# attnbench compare: `{a_name}` (A) vs `{b_name}` (B)",
        "",
        "ratio = time(B) / time(A) for cases ok in both runs; above 1: B is slower. Where "
        "both runs timed a case in interleaved rounds, ratio is the ratio of the medians of "
        "the per-round times, each divided by the speed anchor's time in its round (for the "
        "resource the row is bound by), so that the machine's own change cancels; its 95% "
        "bootstrap interval is beside it, and the verdict is 'slower' or 'faster' only "
        f"when the interval excludes 1 and the change is at least {MIN_EFFECT_PCT:g}%. "
        "raw: time_ms(B) / time_ms(A), undivided. Cases without rounds keep the older "
        "rule (rule column): 'unchanged (within noise)' when the two runs' p20–p80 ranges "
        "overlap, whatever the ratio.",
        "",
    ]
    heads = pd.DataFrame(
        [
            ("device", device_title(envs[0], frames[0]), device_title(envs[1], frames[1])),
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
    lines += [f"> {line[0].upper()}{line[1:]}." for line in machine_lines(cmp)]
    lines += [""] if machine_lines(cmp) else []
    busy = [n for n, e in zip(names, envs) if busy_machine(e)]
    if busy:
        lines += [
            f"> **Busy machine** when {' and '.join(f'`{n}`' for n in busy)} started "
            f"(1-minute load above half the cores): those times are inflated and noisy, "
            f"so ratios can move by far more than any code change.",
            "",
        ]
    return lines


def machine_lines(cmp: pd.DataFrame) -> list[str]:
    """How much the machine's speed differed between the runs (the speed anchor), and the
    cases judged by the older rule: said at the top of compare.md and of the terminal."""
    judged = cmp[cmp["rule"].notna()]
    lines = []
    speed = {res: 1 / judged[f"machine_{res}"].dropna().astype(float) for res in RESOURCES}
    wild = int(judged["rule"].eq(RULE_WILD_ANCHOR).sum())
    if wild:
        lines.append(
            f"the speed anchor's time changed more than {MAX_MACHINE_CHANGE:g}x between the "
            f"runs in {wild} of {len(judged)} compared case(s): that is not the machine's "
            "drift but contention or another device, so those ratios are not divided by it "
            "and the runs are as comparable as their raw times (re-run both on a quiet machine)"
        )
        speed = {
            res: v[judged.loc[v.index, "rule"].ne(RULE_WILD_ANCHOR)] for res, v in speed.items()
        }
    if any(len(v) for v in speed.values()):
        parts = [f"{res} {v.median():.3f}x" for res, v in speed.items() if len(v)]
        lines.append(
            "machine speed in B relative to A (the speed anchor, median over the compared "
            f"cases; below 1: slower in B): {', '.join(parts)}; every ratio is divided by "
            "its case's change"
        )
    elif judged["rule"].eq(RULE_ROUNDS).any():
        lines.append(
            "machine speed: not measured (a run has no anchor.csv), so the ratios include "
            "any change in the machine's speed between the runs"
        )
    lines += _noise_lines(cmp)
    old = int(judged["rule"].eq(RULE_OVERLAP).sum())
    if old:
        lines.append(
            f"{old} of {len(judged)} compared case(s) have no rounds in both runs: judged by "
            f"the older rule (p20–p80 overlap), which cannot see the machine drift between "
            f"runs"
        )
    return lines


def _noise_lines(cmp: pd.DataFrame) -> list[str]:
    """How far identical code could move between these runs, and so the smallest change the
    verdicts call; the cases left unjudged because a run's row was contended."""
    if "min_change_pct" not in cmp or not cmp["min_change_pct"].notna().any():
        return []
    floor = float(cmp["min_change_pct"].dropna().iloc[0])
    noise = cmp["noise_pct"].dropna()
    rounds = int(cmp["rule"].isin(ROUND_RULES).sum())
    if len(noise):
        lines = [
            f"run-to-run noise: the ratios of the {rounds} cases timed in rounds spread by "
            f"±{float(noise.iloc[0]):.1f}% (robust standard deviation), so a change is called "
            f"only past {floor:.1f}% ({NOISE_Z:g} x that, at least {MIN_EFFECT_PCT:g}%); for "
            f"smaller effects time both versions in one run (A/B, docs/reports.md)"
        ]
    else:
        timed = cmp["rule"].isin(ROUND_RULES)
        out = int((timed & cmp["verdict"].eq(CONTENDED)).sum())  # left out of the spread
        left = f", {out} of them contended in a run and left out, {rounds - out} left"
        left = left if out else ""
        lines = [
            f"run-to-run noise: not measured ({rounds} cases timed in rounds{left}; the spread "
            f"needs {NOISE_MIN_CASES}), so the verdicts rest on each case's interval within "
            f"its runs, which misses the machine's drift between runs"
        ]
    held = int(cmp["verdict"].eq(CONTENDED).sum())
    if held:
        lines.append(
            f"{held} case(s) contended in A or B (another process held a CPU): not judged; "
            f"rerun them on an idle machine"
        )
    return lines


def caveats(cmp: pd.DataFrame, envs: tuple[dict, dict]) -> pd.Series:
    """Per compared row, what its verdict rests on besides the code: a busy machine at a
    run's start, contended rows, a wide interval, the older rule ('' when nothing)."""
    busy = [side for side, e in zip("AB", envs) if busy_machine(e)]

    def one(r) -> str:
        if pd.isna(r["ratio"]):
            return ""
        parts = [f"busy machine at {' and '.join(busy)}'s start"] if busy else []
        held = [side for side in "AB" if r[f"contended_{side.lower()}"] is True]
        if held:
            parts.append(f"contended in {' and '.join(held)}")
        if derived.caveat(False, r["ratio_lo"], r["ratio_hi"]):
            parts.append("wide interval")
        if r["rule"] == RULE_OVERLAP:
            parts.append("no rounds: p20–p80 rule")
        return "; ".join(parts)

    return pd.Series([one(r) for _, r in cmp.iterrows()], index=cmp.index, dtype="string")


def _gate_lines(cmp: pd.DataFrame, fail_above_pct: float) -> list[str]:
    """The gate's verdict, the cases that fail it, and those past it within the noise."""
    reg = regressions(cmp, fail_above_pct)
    verdict = (
        f"**FAIL**: {len(reg)} case(s) slower, outside the noise, by more than "
        f"{fail_above_pct:g}% or newly failing"
        if len(reg)
        else f"**FAIL**: {NOTHING_COMPARED}"
        if gate_fails(cmp, fail_above_pct)
        else f"**{cannot_judge(cmp)}**"
        if cannot_judge(cmp)
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
            f"noise of the two runs, or were contended: not counted.",
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
    rows = rows.assign(
        case=[derived.case_label(r) for _, r in rows.iterrows()],
        interval=[_interval(r) for _, r in rows.iterrows()],
    )
    return table(
        rows,
        {
            "impl": "impl",
            "case": "case",
            "outcome": "outcome",
            "time_ms_a": "A time_ms",
            "time_ms_b": "B time_ms",
            "ratio": "ratio",
            "interval": "95% interval",
            "ratio_raw": "raw",
            "machine": "anchor B/A",
            "verdict": "verdict",
            "rule": "rule",
            "overlap": "overlap",
            "caveat": "rests on",
            "status_a": "A status",
            "status_b": "B status",
            "reason_b": "B reason",
        },
        formats={
            "ratio": ".3f",
            "ratio_raw": ".3f",
            "machine": ".3f",
            "time_ms_a": ".4g",
            "time_ms_b": ".4g",
        },
    )


def _interval(r) -> str:
    return "" if pd.isna(r["ratio_lo"]) else f"{r['ratio_lo']:.3f}–{r['ratio_hi']:.3f}"


def _said(r) -> str:
    """A verdict's interval and what it rests on, for the terminal: ' [0.98–1.05; contended
    in B]'."""
    parts = [p for p in (_interval(r), r.get("caveat") or "") if p and not pd.isna(p)]
    return f" [{'; '.join(parts)}]" if parts else ""


def summary_lines(cmp: pd.DataFrame, fail_above_pct: float | None) -> list[str]:
    """Plain-text lines for the terminal."""
    counts = cmp["outcome"].value_counts()
    lines = machine_lines(cmp)
    lines += ["cases: " + ", ".join(f"{counts[o]} {o}" for o in OUTCOMES if o in counts)]
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
                lines.append(
                    f"REGRESSION +{(r['ratio'] - 1) * 100:.1f}%: {describe_case(r)}{_said(r)}"
                )
            else:
                lines.append(f"REGRESSION now {r['status_b']}: {describe_case(r)}")
        for _, r in within_noise(cmp, fail_above_pct).iterrows():
            if r["verdict"] == CONTENDED:
                why = "contended"
            elif r["rule"] == RULE_OVERLAP:
                why = "p20-p80 ranges overlap"
            elif r["ratio_lo"] > 1 or r["ratio_hi"] < 1:
                why = f"below the smallest change called, {r['min_change_pct']:.0f}%"
            else:
                why = "not significant"
            lines.append(
                f"{r['verdict']} {(r['ratio'] - 1) * 100:+.1f}%: {describe_case(r)} "
                f"({why}; not counted){_said(r)}"
            )
        if not len(reg) and gate_fails(cmp, fail_above_pct):
            lines.append(f"gate: FAIL (--fail-above {fail_above_pct:g}%: {NOTHING_COMPARED})")
        elif not len(reg) and cannot_judge(cmp):
            lines.append(f"gate: {cannot_judge(cmp)}")
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
    run_dirs: tuple | None = None,
) -> tuple[pd.DataFrame, Path]:
    """Write compare.md, compare.csv and ratio_vs_seq.png(+svg) into out_dir atomically.
    ``run_dirs``: the two run folders, for their rounds and speed anchors (rounds.py)."""
    (a_name, a_df, a_env), (b_name, b_df, b_env) = run_a, run_b
    dirs = run_dirs or (None, None)
    cmp = compare_runs(
        a_df,
        b_df,
        tuple(Rounds.read(d) if d else None for d in dirs),
        tuple(AnchorRounds.read(d) if d else None for d in dirs),
    )
    cmp["caveat"] = caveats(cmp, (a_env, b_env))
    out_dir = Path(out_dir)
    with atomic_dir(out_dir) as tmp:
        lines = ratio_lines(
            cmp, fail_above_pct, f"{b_name} / {a_name} time ratio", device_title(b_env, b_df)
        )
        fig = plots.plot_ratio_vs_seq(
            lines,
            fail_above_pct=fail_above_pct,
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
