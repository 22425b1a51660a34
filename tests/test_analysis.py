import math

import numpy as np
import pandas as pd
import pytest
from synth import failed_row, ok_row, write_run

from attnbench.case import Case
from attnbench.report.analyse import derived, scaling
from attnbench.report.decide import verdicts
from attnbench.store.results import read_results

SEQS = (64, 128, 256, 512, 1024, 2048, 4096)


def series(
    tmp_path, time_fn, mem_fn, seqs=SEQS, impl="x", noise=0.0, seed=0, statuses=None, seq_kv=None
):
    rng = np.random.default_rng(seed)
    rows = []
    for n in seqs:
        case = Case(1, 2, 2, n, seq_kv or n, 32)
        status = (statuses or {}).get(n, "ok")
        if status != "ok":
            rows.append(failed_row("r", impl, case, status, "boom"))
            continue
        jitter = float(rng.lognormal(0, noise)) if noise else 1.0
        rows.append(ok_row("r", impl, case, time_fn(n) * jitter, mem_fn(n)))
    return read_results(write_run(tmp_path, "r", rows))


def fit_of(fits, metric):
    return fits[fits["metric"] == metric].iloc[0]


def test_fit_recovers_known_exponents_with_noise_and_overhead(tmp_path):
    df = series(tmp_path, lambda n: 0.05 + 3e-6 * n**2, lambda n: 0.5 + 0.01 * n, noise=0.03)
    fits = scaling.scaling_exponents(df)
    t, m = fit_of(fits, "time_ms"), fit_of(fits, "peak_mem_mib")
    assert t["slope"] == pytest.approx(2.0, abs=0.1)
    assert m["slope"] == pytest.approx(1.0, abs=0.05)
    assert 0 < t["slope_se"] < 0.1
    assert t["n_points"] >= 3 and not t["overhead_limited"]


def test_fit_is_exact_on_a_pure_power_law():
    n = np.array(SEQS, dtype=float)
    fit = scaling.fit_loglog(n, 7e-4 * n**1.5)
    assert fit["slope"] == pytest.approx(1.5, abs=1e-9)
    assert fit["slope_se"] == pytest.approx(0.0, abs=1e-9)


def test_overhead_cut_drops_the_flat_region():
    n = np.array(SEQS, dtype=float)
    y = 0.2 + 1e-6 * n**2  # flat until N ~ 500
    naive = np.polyfit(np.log(n), np.log(y), 1)[0]
    fit = scaling.fit_loglog(n, y)
    assert naive < 1.2  # a fit over every point would badly understate the exponent
    assert fit["slope"] == pytest.approx(2.0, abs=0.15)
    assert fit["seq_min"] == 1024 and not fit["overhead_limited"]


def test_overhead_limited_fit_is_flagged_as_lower_bound():
    n = np.array((64, 128, 256, 512, 1024), dtype=float)
    fit = scaling.fit_loglog(n, 1.0 + 1e-6 * n**2)  # reaches 4x its floor only at 2048+
    assert fit["overhead_limited"] is True
    assert fit["n_points"] == 3 and fit["seq_min"] == 256
    assert fit["slope"] < 2.0
    assert "lower bound" in fit["reason"]


def test_fewer_than_three_points_gives_no_fit(tmp_path):
    df = series(tmp_path, lambda n: n**2, lambda n: n, seqs=(512, 1024))
    fits = scaling.scaling_exponents(df)
    assert fits["slope"].isna().all()
    assert fits["reason"].str.contains("needs 3").all()


def test_failed_rows_are_not_fit_points(tmp_path):
    df = series(
        tmp_path,
        lambda n: n**2,
        lambda n: n,
        seqs=(256, 512, 1024, 2048),
        statuses={1024: "oom", 2048: "timeout"},
    )
    fits = scaling.scaling_exponents(df)
    assert fits["slope"].isna().all()
    assert (fits["n_ok"] == 2).all() and (fits["n_failed"] == 2).all()
    assert fits["failed"].str.contains("1 oom").all()


def contradictory(tmp_path):
    """sdpa ok everywhere; fast ok at 128 but 'error' at 256 with a (bogus) tiny time."""
    rows = []
    for n in (128, 256):
        case = Case(1, 2, 2, n, n, 32)
        rows.append(ok_row("r", "sdpa", case, 1.0, 1.0))
        if n == 128:
            rows.append(ok_row("r", "fast", case, 0.5, 1.0))
        else:
            bad = failed_row("r", "fast", case, "error", "RuntimeError")
            bad["time_ms"] = 1e-9  # must never be used: the status says it failed
            rows.append(bad)
        rows.append(ok_row("r", "wrong", case, 0.1, 1.0, agrees=False, reason="rel_err"))
        rows.append(ok_row("r", "unchecked", case, 0.2, 1.0, agrees=None))
    return read_results(write_run(tmp_path, "r", rows))


def test_speedup_only_where_both_ok(tmp_path):
    sp = verdicts.speedups(contradictory(tmp_path), "sdpa").set_index(["impl", "seq_q"])
    assert sp.loc[("fast", 128), "speedup"] == pytest.approx(2.0)
    assert pd.isna(sp.loc[("fast", 256), "speedup"])
    assert sp.loc[("sdpa", 256), "speedup"] == 1.0


def test_speedup_na_when_baseline_failed(tmp_path):
    case = Case(1, 2, 2, 128, 128, 32)
    df = read_results(
        write_run(
            tmp_path,
            "r",
            [failed_row("r", "sdpa", case, "oom", "x"), ok_row("r", "tiled", case, 1.0, 1.0)],
        )
    )
    assert verdicts.speedups(df, "sdpa")["speedup"].isna().all()


def test_fastest_agreeing_skips_failed_and_disagreeing(tmp_path):
    w = verdicts.fastest_agreeing(contradictory(tmp_path)).set_index("seq_q")
    assert w.loc[128, "impl"] == "fast"
    assert w.loc[256, "impl"] == "sdpa"  # not 'fast' (error), 'wrong' or 'unchecked'
    assert w.loc[128, "margin"] == pytest.approx(2.0)


def test_seq_kv_rule_separates_fixed_and_following(tmp_path):
    rows = []
    for n in (128, 256, 512):
        rows.append(ok_row("r", "a", Case(1, 2, 2, n, n, 32), 1.0, 1.0))
        rows.append(ok_row("r", "a", Case(1, 2, 2, n, 1024, 32), 1.0, 1.0))
        rows.append(ok_row("r", "a", Case(1, 2, 2, n, 2 * n, 32, causal=True), 1.0, 1.0))
    df = read_results(write_run(tmp_path, "r", rows))
    relations = set(derived.seq_kv_rule(df))
    assert relations == {"Skv=Sq", "Skv=1024", "Skv=2*Sq"}
    fits = scaling.scaling_exponents(df, ["time_ms"])
    assert len(fits) == 3 and (fits["n_ok"] == 3).all()


def test_a_fixed_token_grid_is_one_series_over_n_and_a_batch_grid_is_not(tmp_path):
    """The race preset holds B x N fixed: each length has its own batch. Its rows make one
    series per impl (B·N=4096) with a fit, where a grid that crosses batch and length keeps
    one series per batch."""
    race = [(4096 // n, n) for n in (256, 512, 1024, 2048)]
    crossed = [(b, n) for b in (1, 2) for n in (256, 512, 1024)]
    rows = [
        ok_row("r", impl, Case(b, 2, 2, n, n, 32, causal=causal), b * n * n * 1e-6, 1.0)
        for impl, causal, grid in (("a", False, race), ("a", True, crossed))
        for b, n in grid
    ]
    df = derived.with_series(read_results(write_run(tmp_path, "r", rows)))
    assert set(df.loc[~df["causal"], "batch_rule"]) == {"B·N=4096"}
    assert set(df.loc[df["causal"], "batch_rule"]) == {"B=1", "B=2"}
    fits = scaling.scaling_exponents(df, ["time_ms"])
    race_fit = fits[fits["batch_rule"] == "B·N=4096"]
    assert len(race_fit) == 1 and race_fit["n_ok"].iloc[0] == 4
    assert race_fit["slope"].iloc[0] == pytest.approx(1.0)  # B·N² at fixed B·N: ~N
    assert len(fits[fits["causal"]]) == 2
    labels = derived.series_labels(fits)
    assert any("B·N=4096" in label for label in labels)
    assert any(" B1 " in f" {label} " for label in labels)


def test_nothing_fitted_from_status_not_ok():
    assert math.isnan(scaling.fit_loglog([], [])["slope"])


def test_wins_are_spans_of_the_lengths_won_and_ties_are_marked(tmp_path):
    from attnbench.report.analysis import analyse_device
    from attnbench.report.render.sections import winners_section

    times = {64: (1.0, 2.0), 128: (1.0, 2.0), 256: (2.0, 1.0), 512: (1.0, 1.02)}  # (a, b)
    rows = []
    for n, (ta, tb) in times.items():
        case = Case(1, 4, 4, n, n, 64, "float32", False, "fwd", "cpu")
        rows += [ok_row("w", "a", case, ta, 1.0), ok_row("w", "b", case, tb, 1.0)]
    df = read_results(write_run(tmp_path, "w", rows))
    wins = verdicts.wins_by_family(verdicts.fastest_agreeing(df)).set_index("impl")
    assert wins.loc["a", "spans"] == "64–128, 512" and wins.loc["a", "ties"] == 1
    assert wins.loc["b", "spans"] == "256" and wins.loc["b", "ties"] == 0
    text = "\n".join(winners_section(analyse_device(df)))
    assert "**a** 3/4 (N 64–128, 512; 1 tie)" in text and "b 1/4 (N 256)" in text
