"""The analysis reads a run's rows as columns and splits them by key once (derived.groups):
the rules the per-case and per-series passes kept from the frame-per-group code they
replaced (ties by name, a noisy runner-up, p20-p80 overlaps, blank key values, the points a
fit used, a missing kernel, a round's median)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from synth import ok_row

from attnbench.case import Case
from attnbench.report.analyse import derived, scaling
from attnbench.report.analyse.rounds import _per_round
from attnbench.report.decide import verdicts
from attnbench.report.decide.recommend import _losses, _pick


def rows_of(times: dict, case: Case, **extra) -> list[dict]:
    return [{**ok_row("r", impl, case, t, 1.0), **extra.get(impl, {})} for impl, t in times.items()]


def test_groups_give_each_blank_key_value_its_own_group_in_groupby_order():
    df = pd.DataFrame({"a": ["y", None, "x", "y", None], "b": [1, 2, 1, 1, 2]})
    got = derived.groups(df, ["a", "b"])
    want = [(k, g.index.to_numpy()) for k, g in df.groupby(["a", "b"], dropna=False, sort=True)]
    assert [k for k, _ in got] == [k for k, _ in want]  # blanks last, as groupby sorts them
    assert all((p == w).all() for (_, p), (_, w) in zip(got, want))
    assert [k for k, _ in derived.groups(df, ["b"])] == [(1,), (2,)]  # one key: tuples too
    assert derived.groups(df.iloc[:0], ["a"]) == []


def test_equal_times_go_to_the_first_name_and_a_case_without_agreement_says_why():
    tied = rows_of({"zeta": 1.0, "alpha": 1.0, "mid": 2.0}, Case(1, 4, 4, 128, 128, 64))
    lost = rows_of({"naive": 1.0}, Case(1, 4, 4, 256, 256, 64))
    lost[0]["agrees"] = False
    w = verdicts.fastest_agreeing(pd.DataFrame(tied + lost)).set_index("seq_q")
    assert w.loc[128, "impl"] == "alpha" and w.loc[128, "runner_up"] == "zeta"
    assert w.loc[128, "tie"]  # equal medians: within the noise
    assert pd.isna(w.loc[256, "impl"]) and w.loc[256, "reason"] == "no impl is ok and agrees"
    assert w.loc[256, "n_rows"] == 1 and w.loc[256, "n_agreeing"] == 0


def test_a_noisy_runner_up_marks_the_win_and_disjoint_ranges_are_no_tie():
    case = Case(1, 4, 4, 128, 128, 64)
    rows = rows_of({"fast": 1.0, "slow": 2.0, "slowest": 3.0}, case)
    rows[1].update(time_ms_p20=1.5, time_ms_p80=2.6)  # slow's samples spread 55%: noisy
    w = verdicts.fastest_agreeing(pd.DataFrame(rows)).iloc[0]
    assert w["impl"] == "fast" and not w["tie"] and w["caveat"] == "noisy"
    rows[1].update(time_ms_p20=1.03, time_ms_p80=2.06)  # reaches below fast's p80: a tie
    rows[2].update(time_ms_p20=2.9, time_ms_p80=3.1)
    w = verdicts.fastest_agreeing(pd.DataFrame(rows)).iloc[0]
    assert w["tie"] and w["caveat"] == "noisy"


def test_a_fit_counts_the_contended_points_it_used_and_the_failed_rows_by_status():
    rows = []
    for n, t, busy in ((128, 1.0, True), (256, 1.1, False), (512, 4.0, True), (1024, 16.0, False)):
        rows += rows_of({"naive": t}, Case(1, 4, 4, n, n, 64), naive={"contended": busy})
        rows += rows_of({"tiled": t}, Case(1, 4, 4, n, n, 64))
    for n, status in ((2048, "oom"), (4096, "oom"), (8192, "timeout")):
        rows += [{**rows_of({"naive": 1.0}, Case(1, 4, 4, n, n, 64))[0], "status": status}]
    fits = scaling.scaling_exponents(pd.DataFrame(rows))
    naive = fits[(fits["impl"] == "naive") & (fits["metric"] == "time_ms")].iloc[0]
    # only N=512 and 1024 reach 4x the floor: the 3 largest N are fitted (a lower bound)
    assert naive["overhead_limited"] and (naive["seq_min"], naive["seq_max"]) == (256, 1024)
    assert naive["n_contended"] == 1  # N=128 is not among the points fitted: N=512 counts
    assert naive["n_ok"] == 4 and naive["n_failed"] == 3 and naive["failed"] == "2 oom, 1 timeout"
    tiled = fits[(fits["impl"] == "tiled") & (fits["metric"] == "time_ms")].iloc[0]
    assert tiled["n_contended"] == 0 and pd.isna(tiled["failed"])


def test_a_missing_kernel_races_as_another_kernel_and_an_alias_costs_nothing():
    times = pd.DataFrame(
        {"a": [1.0, 2.0], "b": [1.1, 1.0], "c": [4.0, np.nan]}, dtype="Float64"
    )  # case × impl
    kernels = pd.DataFrame({"a": ["k", "k"], "b": ["k", None], "c": ["m", None]}, dtype="string")
    loss = _losses(times, kernels)
    # case 0: a and b ran k (aliases): each is weighed against c only, and itself
    assert loss[0].tolist() == pytest.approx([1.0, 1.0, 4.0])
    # case 1: b's kernel is not known, so it races a: a loses 2x, b nothing; c did not run
    assert loss[1, :2].tolist() == pytest.approx([2.0, 1.0]) and np.isnan(loss[1, 2])


def test_a_pick_breaks_ties_by_median_loss_then_name_and_says_where_it_lost_most():
    # case ids 7, 8, 9; every impl its own kernel
    times = pd.DataFrame(
        {"b": [1.2, 1.0, 1.0], "a": [1.0, 1.2, 1.0], "c": [1.0, 1.0, 1.2], "d": [1.2, 1.1, 1.0]},
        index=[7, 8, 9],
        dtype="Float64",
    )
    kernels = pd.DataFrame({c: [c] * 3 for c in times}, index=times.index, dtype="string")
    pick = _pick(times, kernels)  # a, b, c and d all lose 1.2x at worst; d's median is 1.1
    assert (pick.impl, pick.worst_at) == ("a", 8) and pick.worst == pytest.approx(1.2)
    held = pd.Series([1.25, 1.1, 1.1], index=times.index)
    pick = _pick(times, kernels, held)  # b loses 1.2 where 1.25 is allowed: it fits
    assert (pick.impl, pick.fits) == ("b", True) and pick.worst_at == 7
    pick = _pick(times, kernels, held.clip(upper=1.1))  # none fits: the least over, a
    assert (pick.impl, pick.fits) == ("a", False)
    times.loc[9] = np.nan  # no impl ran case 9: no pick
    assert _pick(times, kernels).impl is None


def test_a_rounds_median_is_the_middle_of_its_lines_rounds_in_order():
    lines = pd.DataFrame(
        {
            "impl": ["x"] * 5 + ["y"],
            "round": ["2", "2", "1", "2", "2", ""],  # a line without a round is left out
            "time_ms": ["4", "1", "7", "2", "3", "5"],
        }
    )
    assert _per_round(lines, ("impl",)) == {("x",): {1: 7.0, 2: 2.5}}
    assert list(_per_round(lines, ("impl",))[("x",)]) == [1, 2]
