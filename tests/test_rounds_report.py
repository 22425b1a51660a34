"""Report and compare on runs timed in interleaved rounds (synthetic: tests/synth.py): paired
speedups and ties, the anchor's normalisation under a drifting machine, and verdicts marked
where they are stated."""

import shutil

import pandas as pd
import pytest
from synth import env, ok_row, smoke_rows, write_rounds_run, write_run

from attnbench.case import Case
from attnbench.cli import main
from attnbench.report.analyse.rounds import AnchorRounds, Rounds, anchor_path
from attnbench.report.compare.compare import compare_runs
from attnbench.report.compare.judge import (
    NOISE_MIN_CASES,
    RULE_ANCHOR,
    RULE_OVERLAP,
    RULE_ROUNDS,
    RULE_WILD_ANCHOR,
)
from attnbench.report.decide import verdicts
from attnbench.report.decide.recommend import recommendations
from attnbench.report.render.terminal import summary_table
from attnbench.store.results import read_results

SEQS = (256, 512, 1024)


def ramp(slowdown):
    """A machine that gets ``slowdown`` times slower from the run's start to its end."""
    return lambda t: 1 + (slowdown - 1) * t


def slow_down(rows, impl, factor):
    return [
        {**r, "time_ms": r["time_ms"] * factor} if r["impl"] == impl and r["status"] == "ok" else r
        for r in rows
    ]


def compared(a, b):
    return compare_runs(
        read_results(a),
        read_results(b),
        (Rounds.read(a), Rounds.read(b)),
        (AnchorRounds.read(a), AnchorRounds.read(b)),
    )


def test_paired_speedups_work_for_any_baseline_with_an_interval(tmp_path):
    run = write_rounds_run(tmp_path, "r", smoke_rows("r", seqs=SEQS))
    df, rounds = read_results(run), Rounds.read(run)
    sp = verdicts.speedups(df, "naive", rounds)  # not the run's recorded baseline
    sdpa = sp[(sp["impl"] == "sdpa") & sp["speedup"].notna()]
    assert len(sdpa) and sdpa["paired"].all()
    assert (sdpa["speedup_lo"] <= sdpa["speedup"]).all() and (
        sdpa["speedup"] <= sdpa["speedup_hi"]
    ).all()
    assert (sdpa["speedup_lo"] > 1).all()  # sdpa is about twice as fast as naive
    old = verdicts.speedups(
        read_results(write_run(tmp_path, "o", smoke_rows("o", seqs=SEQS))), "naive"
    )
    assert not old["paired"].any() and old["speedup_lo"].isna().all()  # no rounds: no interval


def test_a_tie_is_a_paired_interval_containing_one(tmp_path):
    rows = []
    for n in SEQS:
        case = Case(1, 4, 4, n, n, 64)
        rows += [ok_row("t", "a", case, 1.0, 1.0), ok_row("t", "b", case, 1.0, 1.0)]
        rows += [ok_row("t", "c", case, 1.5, 1.0)]
    run = write_rounds_run(tmp_path, "t", rows, baseline="c", noise=0.05)
    winners = verdicts.fastest_agreeing(read_results(run), Rounds.read(run))
    assert winners["paired"].all() and winners["tie"].all()
    assert (winners["margin_lo"] <= 1).all() and (winners["margin_hi"] >= 1).all()
    rows = [r for r in rows if r["impl"] != "b"]
    run = write_rounds_run(tmp_path, "u", rows, baseline="c", noise=0.05)
    winners = verdicts.fastest_agreeing(read_results(run), Rounds.read(run))
    assert not winners["tie"].any() and (winners["margin_lo"] > 1).all()


def test_identical_code_on_a_machine_that_drifts_30_percent_gives_no_verdict(tmp_path, capsys):
    a = write_rounds_run(tmp_path, "a", smoke_rows("a", seqs=SEQS), seed=1)
    b = write_rounds_run(tmp_path, "b", smoke_rows("a", seqs=SEQS), seed=2, slowness=ramp(1.3))
    cmp = compared(a, b)
    judged = cmp[cmp["ratio"].notna()]
    assert judged["rule"].eq(RULE_ANCHOR).all()
    assert judged["ratio_raw"].max() > 1.2  # the machine's drift, in the raw times
    assert judged["verdict"].eq("unchanged (within noise)").all()
    assert (
        main(["compare", str(a), str(b), "--fail-above", "10", "--out", str(tmp_path / "o")]) == 0
    )
    out = capsys.readouterr().out
    assert out.startswith("machine speed in B relative to A") and "gate: PASS" in out
    assert "> Machine speed in B relative to A" in (tmp_path / "o" / "compare.md").read_text()
    # without the anchor the drift stays in the ratios: they spread more between the cases,
    # so the smallest change the verdicts can call grows
    bare = write_rounds_run(
        tmp_path, "c", smoke_rows("a", seqs=SEQS), seed=2, anchor=False, slowness=ramp(1.3)
    )
    unanchored = compared(a, bare)
    assert unanchored["rule"].dropna().eq(RULE_ROUNDS).all()
    assert unanchored["noise_pct"].max() > 2 * cmp["noise_pct"].max()


def test_an_anchor_that_changed_forty_fold_divides_no_ratio_and_is_said(tmp_path, capsys):
    """Identical code; B's speed anchor took 40x as long (its small workload waited for a
    scheduler's time slice on a shared CPU): that is no machine drift. Divided by it, every
    case would be called 40x faster in B; not divided, every case is unchanged."""
    a = write_rounds_run(tmp_path, "a", smoke_rows("a", seqs=SEQS), seed=1)
    b = write_rounds_run(tmp_path, "b", smoke_rows("a", seqs=SEQS), seed=2)
    anchor = pd.read_csv(anchor_path(b))
    anchor.assign(time_ms=anchor["time_ms"] * 40).to_csv(anchor_path(b), index=False)
    cmp = compared(a, b)
    judged = cmp[cmp["ratio"].notna()]
    assert len(judged) and judged["rule"].eq(RULE_WILD_ANCHOR).all()
    assert judged["verdict"].eq("unchanged (within noise)").all(), judged["ratio"].describe()
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "changed more than 3x between the runs in" in out and "machine speed in B" not in out


def test_whole_cases_moving_between_identical_runs_raise_the_smallest_change_called(
    tmp_path, capsys
):
    """A machine whose speed for a case's impls moves by ~15% from case to case (whole cases
    together, the anchor not following, as a shared 2-core VM does): each case's interval
    from its rounds is narrow, but the spread of all cases' ratios shows the noise, so no
    case of identical code is called and the gate passes, saying how large a change must be."""
    a = write_rounds_run(tmp_path, "a", smoke_rows("a", seqs=SEQS), seed=1, case_noise=0.15)
    b = write_rounds_run(tmp_path, "b", smoke_rows("a", seqs=SEQS), seed=2, case_noise=0.15)
    cmp = compared(a, b)
    judged = cmp[cmp["ratio"].notna()]
    assert (judged["ratio"] - 1).abs().max() > 0.15  # single cases moved far
    assert judged["verdict"].eq("unchanged (within noise)").all()
    assert judged["min_change_pct"].iloc[0] > 40 and judged["noise_pct"].iloc[0] > 10
    assert (
        main(["compare", str(a), str(b), "--fail-above", "10", "--out", str(tmp_path / "o")]) == 0
    )
    out = capsys.readouterr().out
    assert "run-to-run noise: the ratios of the" in out and "gate: PASS" in out


def test_a_planted_25_percent_slowdown_is_caught_on_a_drifting_machine(tmp_path, capsys):
    a = write_rounds_run(tmp_path, "a", smoke_rows("a", seqs=SEQS), seed=1)
    rows = slow_down(smoke_rows("a", seqs=SEQS), "tiled", 1.25)
    b = write_rounds_run(tmp_path, "b", rows, seed=2, slowness=ramp(1.3))
    cmp = compared(a, b)
    tiled, others = (
        cmp[(cmp["impl"] == "tiled") & cmp["ratio"].notna()],
        cmp[cmp["impl"] != "tiled"],
    )
    assert len(tiled) and tiled["verdict"].eq("slower").all()
    assert (tiled["ratio_lo"] > 1).all() and tiled["ratio"].between(1.2, 1.3).all()
    assert not others["verdict"].eq("slower").any()
    assert (
        main(["compare", str(a), str(b), "--fail-above", "10", "--out", str(tmp_path / "o")]) == 1
    )
    out = capsys.readouterr().out
    assert out.count("REGRESSION +") == len(tiled) and "gate: FAIL" in out


def test_compare_names_a_busy_machine_next_to_the_verdict_and_judges_no_contended_row(
    tmp_path, capsys
):
    """A run that started on a busy machine: its regressions say so on their own line. Rows
    whose timing was contended are not judged (another process held a CPU: their ratio says
    nothing about the code), are listed as such, and do not fail the gate."""
    a = write_rounds_run(tmp_path, "a", smoke_rows("a", seqs=SEQS), seed=1)
    slow = slow_down(smoke_rows("a", seqs=SEQS), "tiled", 1.5)
    b = write_rounds_run(tmp_path, "b", slow, env(load_avg_1m=3.0), seed=2)
    assert main(["compare", str(a), str(b), "--fail-above", "10", "--out", str(tmp_path / "o")])
    regressions = [
        line for line in capsys.readouterr().out.splitlines() if line.startswith("REGRESSION")
    ]
    assert regressions and all("busy machine at B's start" in line for line in regressions)
    held = [
        {**r, "contended": True} if r["impl"] == "tiled" and r["status"] == "ok" else r
        for r in slow
    ]
    c = write_rounds_run(tmp_path, "c", held, seed=2)
    assert (
        main(["compare", str(a), str(c), "--fail-above", "10", "--out", str(tmp_path / "p")]) == 0
    )
    out = capsys.readouterr().out
    assert "REGRESSION" not in out and "gate: PASS" in out
    tiled = [line for line in out.splitlines() if line.startswith("contended (not judged)")]
    assert tiled and all("tiled" in line and "contended in B" in line for line in tiled)
    assert f"{len(tiled)} case(s) contended in A or B" in out


def test_a_gate_that_could_judge_too_few_cases_exits_with_its_own_code(tmp_path, capsys):
    """Every case of B contended (a busy machine): none is judged, so the gate cannot pass;
    it says so in one line and exits EXIT_UNJUDGED, neither 0 nor the regression code. The
    same runs with half their cases judged pass again."""
    from attnbench.cli import EXIT_OK, EXIT_REGRESSION, EXIT_UNJUDGED

    a = write_rounds_run(tmp_path, "a", smoke_rows("a", seqs=SEQS), seed=1)
    slow = slow_down(smoke_rows("a", seqs=SEQS), "tiled", 1.5)
    held = [{**r, "contended": True} if r["status"] == "ok" else r for r in slow]
    b = write_rounds_run(tmp_path, "b", held, seed=2)
    args = ["compare", str(a), str(b), "--fail-above", "5", "--out", str(tmp_path / "o")]
    code = main(args)
    out = capsys.readouterr().out
    assert code == EXIT_UNJUDGED and EXIT_UNJUDGED not in (EXIT_OK, EXIT_REGRESSION)
    gate = [line for line in out.splitlines() if line.startswith("gate:")]
    assert len(gate) == 1 and "CANNOT JUDGE: only 0 of" in gate[0], gate
    assert "PASS" not in out and "CANNOT JUDGE" in (tmp_path / "o" / "compare.md").read_text()
    half = [
        {**r, "contended": True} if r["status"] == "ok" and r["impl"] == "tiled" else r
        for r in smoke_rows("a", seqs=SEQS)
    ]
    c = write_rounds_run(tmp_path, "c", half, seed=2)
    args = ["compare", str(a), str(c), "--fail-above", "5", "--out", str(tmp_path / "p")]
    assert main(args) == EXIT_OK and "gate: PASS" in capsys.readouterr().out


def test_runs_without_rounds_keep_the_older_rule_and_say_so(tmp_path, capsys):
    a = write_run(tmp_path, "a", smoke_rows("a", seqs=SEQS))
    b = write_run(tmp_path, "b", smoke_rows("b", seqs=SEQS, seed=1))
    cmp = compared(a, b)
    assert cmp["rule"].dropna().eq(RULE_OVERLAP).all() and cmp["ratio_lo"].isna().all()
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "o")]) == 0
    assert "judged by the older rule (p20–p80 overlap)" in capsys.readouterr().out


def test_recommendations_mark_a_tie(tmp_path):
    rows = []
    for n in SEQS:
        case = Case(1, 4, 4, n, n, 64)
        for impl, t in (("hf_eager", 1.0), ("hf_sdpa", 1.0)):
            rows.append({**ok_row("m", impl, case, t, 1.0), "model": "gpt2", "phase": "prefill"})
    run = write_rounds_run(tmp_path, "m", rows, baseline="hf_sdpa", noise=0.05)
    rec = recommendations(read_results(run), Rounds.read(run)).iloc[0]
    assert rec["ties"] == rec["wins"] and rec["attn_implementation"] in ("eager", "sdpa")
    from attnbench.report.render.picks import picks_table

    text = "\n".join(picks_table(recommendations(read_results(run), Rounds.read(run)), {}))
    assert "(tie)" in text


def test_terminal_summary_marks_contended_and_noisy_times(tmp_path):
    rows = smoke_rows("s", seqs=(256, 512))  # naive runs out of memory at the largest
    for r in rows:
        if r["impl"] == "tiled" and r["status"] == "ok":
            r["contended"] = True
        if r["impl"] == "naive" and r["status"] == "ok":
            r.update(time_ms_p20=r["time_ms"] * 0.5, time_ms_p80=r["time_ms"] * 1.5)
    text = summary_table(read_results(write_run(tmp_path, "s", rows)))
    lines = text.splitlines()
    header = lines[1].split()
    cells = [line for line in lines[2:] if "S256" in line]
    assert "'c' = contended" in lines[0]
    assert all(" c" in line for line in cells) and all(" ~" in line for line in cells)
    assert header.index("naive") < header.index("tiled")


def test_the_report_shows_intervals_and_the_speed_over_time(tmp_path, monkeypatch):
    from attnbench.report import report

    monkeypatch.setattr(report, "FIGURES", ())  # test_report.py draws those; this the run's
    run = write_rounds_run(
        tmp_path / "results", "r", smoke_rows("r", seqs=SEQS), slowness=ramp(1.2)
    )
    assert (
        main(
            ["report", str(run), "--reports-dir", str(tmp_path / "reports"), "--baseline", "naive"]
        )
        == 0
    )
    folder = tmp_path / "reports" / "r"
    md = (folder / "report.md").read_text()
    assert (
        "## Machine speed over the run" in md
        and (folder / "speed_over_time.png").stat().st_size > 10_000
    )
    assert "Paired per round" in md and "Each case (what varies: speedup [95% interval])" in md
    assert "whose time over the winner's, paired per round" in md


@pytest.mark.parametrize(
    "bound, resource", [("compute", "compute"), ("memory", "memory"), (None, "both")]
)
def test_the_anchor_resource_follows_the_rows_bound(bound, resource):
    from attnbench.report.compare.judge import _resource

    assert _resource({"bound_a": bound, "bound_b": None}) == resource


@pytest.mark.slow  # a real sweep of two plugins: a minute or more on 2 CPU cores
def test_the_documented_a_b_run_runs_and_reads_it(tmp_path):
    """docs/reports.md's A/B commands, as written (a shorter timing budget and a temporary
    results folder added): the two plugins sweep in one run, and the report reads it."""
    import re
    import shlex
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    page = (root / "docs" / "reports.md").read_text()
    block = re.search(r"## A/B in one run.*?```bash\n(.*?)```", page, re.S).group(1)
    sweep, report = [shlex.split(line) for line in block.replace("\\\n", " ").splitlines()]
    assert sweep[:2] == ["python", "scripts/sweep.py"] and report[:2] == [
        "python",
        "scripts/report.py",
    ]
    results = tmp_path / "results"
    sweep = [str(root / a) if a.startswith("tests/") else a for a in sweep[2:]]
    extra = ["--results-dir", str(results), "--reports-dir", str(tmp_path / "r"), "--no-progress"]
    assert main(["sweep", *sweep, *extra, "--rep-ms", "20"]) == 0
    run = results / "ab-check"
    args = [str(results / Path(a).name) if a.startswith("results/") else a for a in report[2:]]
    assert main(["report", *args, "--reports-dir", str(tmp_path / "r")]) == 0
    md = (tmp_path / "r" / "ab-check" / "report.md").read_text()
    assert "### Speedup vs ab_old" in md and "| ab_new |" in md
    sp = verdicts.speedups(read_results(run), "ab_old", Rounds.read(run))
    assert sp.loc[sp["impl"] == "ab_new", "speedup"].notna().all()


def test_a_run_compared_with_itself_or_its_copy_is_one_line_exit_2_nothing_written(
    tmp_path, capsys
):
    a = write_rounds_run(tmp_path, "a", smoke_rows("a", seqs=SEQS), seed=1)
    copy = tmp_path / "copy"
    shutil.copytree(a, copy)
    for b, said in ((a, "is the same folder"), (copy, f"is a copy of {a}")):
        out = tmp_path / "o"
        assert main(["compare", str(a), str(b), "--out", str(out)]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert f"run B {b} {said}" in line and "sweep the same grid again" in line
        assert not out.exists()


def test_noise_not_measured_says_how_many_cases_contention_left_out(tmp_path, capsys):
    rows = smoke_rows("a", seqs=SEQS)
    a = write_rounds_run(tmp_path, "a", rows, seed=1)
    free = {("sdpa", SEQS[0])}  # the only (impl, length) left uncontended
    held = [{**r, "contended": (r["impl"], r["seq_q"]) not in free} if r["status"] == "ok" else r
            for r in rows]  # fmt: skip
    b = write_rounds_run(tmp_path, "b", held, seed=2)
    cmp = compared(a, b)
    timed = int(cmp["rule"].isin([RULE_ANCHOR, RULE_ROUNDS, RULE_WILD_ANCHOR]).sum())
    out = int(cmp["verdict"].eq("contended (not judged)").sum())
    assert timed - out < NOISE_MIN_CASES <= timed  # enough cases, too few uncontended
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "o")]) == 0
    assert (
        f"run-to-run noise: not measured ({timed} cases timed in rounds, {out} of them "
        f"contended in a run and left out, {timed - out} left; the spread needs "
        f"{NOISE_MIN_CASES})"
    ) in capsys.readouterr().out
