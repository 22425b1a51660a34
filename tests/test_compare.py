import pytest
from synth import smoke_rows, write_run

from attnbench.cli import main
from attnbench.report.compare.compare import compare_runs, regressions
from attnbench.store.results import read_results

SEQS = (64, 128, 256)


def slow_down(rows, impl, seq, factor):
    for r in rows:
        if r["impl"] == impl and r["seq_q"] == seq and r["status"] == "ok":
            for c in ("time_ms", "time_ms_p20", "time_ms_p80"):
                r[c] *= factor
    return rows


@pytest.fixture
def runs(tmp_path):
    a = write_run(tmp_path, "a", smoke_rows("a", seqs=SEQS))
    b_rows = slow_down(smoke_rows("b", seqs=SEQS), "tiled", 256, 1.5)
    b_rows = [r for r in b_rows if not (r["impl"] == "naive" and r["seq_q"] == 64)]
    for r in b_rows:
        if r["impl"] == "sdpa" and r["seq_q"] == 128 and r["mode"] == "fwd" and not r["causal"]:
            for c in ("time_ms", "time_ms_p20", "time_ms_p80", "tflops", "rel_err"):
                r[c] = None
            r.update(status="crash", reason="worker died (signal 11)")
    extra = smoke_rows("b", seqs=(512,))
    b = write_run(tmp_path, "b", b_rows + [r for r in extra if r["impl"] == "sdpa"])
    return tmp_path, a, b


def test_compare_table_categories(runs):
    _, a, b = runs
    cmp = compare_runs(read_results(a), read_results(b))
    counts = cmp["outcome"].value_counts()
    assert counts["only in A"] == 4 and counts["only in B"] == 4 and counts["not ok in B"] == 1
    tiled = cmp[(cmp["impl"] == "tiled") & (cmp["seq_q"] == 256)]
    assert (tiled["ratio"] > 1.4).all()
    assert cmp.loc[cmp["outcome"] != "compared", "ratio"].isna().all()


def test_gate_fails_and_names_the_slow_cases(runs, capsys):
    root, a, b = runs
    code = main(["compare", str(a), str(b), "--fail-above", "20", "--out", str(root / "cmp")])
    out = capsys.readouterr().out
    assert code == 1
    assert out.count("REGRESSION +") == 4 and "tiled: B1 H4 S256" in out
    assert "REGRESSION now crash: sdpa: B1 H4 S128 D64 float32 full fwd" in out
    assert "only in A: naive: B1 H4 S64" in out and "only in B: sdpa: B1 H4 S512" in out
    md = (root / "cmp" / "compare.md").read_text()
    assert "## Only in A (a) (4)" in md and "## Only in B (b) (4)" in md
    assert "worker died (signal 11)" in md
    assert (root / "cmp" / "ratio_vs_seq.png").stat().st_size > 10_000


def test_gate_passes_within_threshold(tmp_path, capsys):
    a = write_run(tmp_path, "a", smoke_rows("a", seqs=SEQS, seed=0))
    b = write_run(tmp_path, "b", smoke_rows("b", seqs=SEQS, seed=1))  # noise only (~2%)
    code = main(["compare", str(a), str(b), "--fail-above", "15", "--out", str(tmp_path / "o")])
    assert code == 0
    assert "gate: PASS" in capsys.readouterr().out


def test_a_change_inside_the_noise_is_unchanged_and_does_not_fail_the_gate(tmp_path, capsys):
    a_rows = smoke_rows("a", seqs=SEQS)
    b_rows = slow_down(smoke_rows("b", seqs=SEQS), "tiled", 256, 1.3)
    for rows, low, high in ((a_rows, 0.7, 1.5), (b_rows, 0.9, 1.2)):  # wide, overlapping
        for r in rows:
            if r["impl"] == "tiled" and r["seq_q"] == 256 and r["status"] == "ok":
                r.update(time_ms_p20=r["time_ms"] * low, time_ms_p80=r["time_ms"] * high)
    a, b = write_run(tmp_path, "a", a_rows), write_run(tmp_path, "b", b_rows)
    cmp = compare_runs(read_results(a), read_results(b))
    tiled = cmp[(cmp["impl"] == "tiled") & (cmp["seq_q"] == 256)]
    assert len(tiled) and (tiled["ratio"] > 1.25).all()
    assert tiled["verdict"].eq("unchanged (within noise)").all()
    assert tiled["overlap"].eq(True).all()
    code = main(["compare", str(a), str(b), "--fail-above", "5", "--out", str(tmp_path / "o")])
    out = capsys.readouterr().out
    assert code == 0 and "gate: PASS" in out and "REGRESSION" not in out
    assert "unchanged (within noise) +30.0%: tiled: B1 H4 S256" in out
    md = (tmp_path / "o" / "compare.md").read_text()
    assert "moved by more than 5% but within the noise" in md


def test_verdicts_outside_the_noise(runs):
    _, a, b = runs
    cmp = compare_runs(read_results(a), read_results(b))
    tiled = cmp[(cmp["impl"] == "tiled") & (cmp["seq_q"] == 256)]
    assert tiled["verdict"].eq("slower").all()  # 1.5x with ~7% spreads: ranges apart
    assert cmp.loc[cmp["outcome"] != "compared", "verdict"].isna().all()


def test_no_gate_without_fail_above(runs):
    root, a, b = runs
    assert main(["compare", str(a), str(b), "--out", str(root / "o")]) == 0


def test_threshold_is_strict(runs):
    _, a, b = runs
    cmp = compare_runs(read_results(a), read_results(b))
    assert len(regressions(cmp, 60)) == 1  # only the crash: 1.5x is within +60%


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--fail-above", "five"], "'five' is not a number"),
        (["--fail-above", "-3"], "must be a finite percentage"),
        (["--fail-above", "nan"], "must be a finite percentage"),
    ],
)
def test_malformed_fail_above(runs, capsys, args, needle):
    root, a, b = runs
    code = main(["compare", str(a), str(b), *args, "--out", str(root / "x")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("attnbench compare: error: ") and needle in err
    assert err.count("\n") == 1
    assert not (root / "x").exists()


def test_missing_run_b(runs, capsys):
    root, a, _ = runs
    assert main(["compare", str(a), str(root / "nope"), "--out", str(root / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnbench compare: error: run B: ") and "does not exist" in err
    assert not (root / "x").exists()


def test_a_gate_that_compared_nothing_fails(tmp_path, capsys):
    a = write_run(tmp_path, "a", smoke_rows("a", seqs=(64, 128)))
    b = write_run(tmp_path, "b", smoke_rows("b", seqs=(256, 512)))  # no case in common
    code = main(["compare", str(a), str(b), "--fail-above", "5", "--out", str(tmp_path / "c")])
    out = capsys.readouterr().out
    assert code == 1
    assert "gate: FAIL" in out and "nothing was compared" in out
    assert "**FAIL**: no case is ok in both runs" in (tmp_path / "c" / "compare.md").read_text()
    # without a gate, the same comparison is only a report
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "d")]) == 0


def test_an_installed_package_reports_its_version_not_git_none(tmp_path, monkeypatch):
    from synth import env

    from attnbench import checkout
    from attnbench.run.executing import environment as env_module

    monkeypatch.setattr(checkout, "root", lambda: None)  # a wheel: no checkout, no git
    monkeypatch.setattr(env_module.checkout, "root", lambda: None)
    collected = env_module.collect_env(["attnbench", "sweep"], 0, "cpu")
    assert collected["git_sha"] is None and collected["checkout"] is False
    assert collected["attnbench"] == checkout.version()
    wheel_env = {**env(), "git_sha": None, "git_dirty": None, "attnbench": "0.1.0"}
    wheel_env["checkout"] = False
    a = write_run(tmp_path, "a", smoke_rows("a", seqs=SEQS), wheel_env)
    b = write_run(tmp_path, "b", smoke_rows("b", seqs=SEQS), wheel_env)
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "c")]) == 0
    md = (tmp_path / "c" / "compare.md").read_text()
    git_row = next(line for line in md.splitlines() if line.startswith("| git"))
    assert "None" not in git_row and "attnbench 0.1.0 (an installed package" in git_row


def test_the_terminal_summary_names_a_few_one_sided_cases_and_counts_the_rest(tmp_path, capsys):
    a = write_run(tmp_path, "a", smoke_rows("a", seqs=(64, 128)))
    b = write_run(tmp_path, "b", smoke_rows("b", seqs=(64, 128, 256, 512, 1024)))
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    only_b = [line for line in out.splitlines() if line.startswith("  only in B:")]
    assert len(only_b) == 5
    assert "  ... and 55 more only in B (compare.md lists every case)" in out  # 60 in all
    assert (tmp_path / "c" / "compare.md").read_text().count("| only in B |") == 60
