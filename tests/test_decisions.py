"""The report's decisions as a user reads them (Reports round 2): the kernel that wins with
the fastest row of it, decode split by new tokens, the kernel each pick ran, failures next
to a pick, its compile time, verdict lines, the first screen, and staleness from git."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pandas as pd
import pytest
from synth import ok_row

from attnbench.case import Case
from attnbench.report.decide import verdicts
from attnbench.report.decide.parts import part_verdicts
from attnbench.report.decide.recommend import _runner_up, recommendations
from attnbench.report.render.opening import staleness_line
from attnbench.report.render.picks import lead_text, picks_table, use_text, verdict_lines

ROOT = Path(__file__).resolve().parent.parent
LLAMA_H100 = ROOT / "results" / "llama3-8b-nvidia-h100-80gb-hbm3"


def decode(batch, new_tokens, cache):
    return Case(batch, 32, 8, new_tokens, cache, 128, dtype="bfloat16", causal=True,
                causal_align="bottom_right", model="llama3-8b", phase="decode")  # fmt: skip


def error_row(impl, case, reason):
    return {**ok_row("r", impl, case, 1.0, 1.0), "status": "error", "reason": reason,
            "time_ms": None, "agrees": None}  # fmt: skip


def test_a_kernel_competes_with_its_fastest_row():
    # cpu-preset bwd causal N=256: sdpa and sdpa_flash both ran flash; sdpa_flash's 1.34 ms
    # beats sdpa_math's 1.38, sdpa's own 1.69 does not
    case = Case(1, 4, 4, 256, 256, 64, causal=True, mode="bwd")
    rows = [
        {**ok_row("r", impl, case, t, 1.0), "backend": b}
        for impl, b, t in (
            ("sdpa", "flash", 1.69),
            ("sdpa_flash", "flash", 1.336),
            ("sdpa_math", "math", 1.379),
        )  # fmt: skip
    ]
    w = verdicts.fastest_agreeing(pd.DataFrame(rows)).iloc[0]
    assert w["impl"] == "sdpa_flash" and w["same_kernel"] == "sdpa"
    assert w["runner_up"] == "sdpa_math"


def test_a_kernels_wins_in_a_family_are_counted_under_one_name():
    # sdpa and sdpa_flash ran flash: sdpa was fastest at N 128 and 512, sdpa_flash at 256;
    # one kernel, so one entry with 3/3 wins, not "sdpa 2/3; sdpa_flash 1/3"
    rows = []
    for n, fast in ((128, "sdpa"), (256, "sdpa_flash"), (512, "sdpa")):
        case = Case(1, 4, 4, n, n, 64, causal=True)
        rows += [
            {**ok_row("r", impl, case, t, 1.0), "backend": b}
            for impl, b, t in (
                ("sdpa", "flash", 1.0 if fast == "sdpa" else 1.1),
                ("sdpa_flash", "flash", 1.0 if fast == "sdpa_flash" else 1.1),
                ("naive", None, 3.0),
            )
        ]
    wins = verdicts.wins_by_family(verdicts.fastest_agreeing(pd.DataFrame(rows)))
    assert list(wins["impl"]) == ["sdpa"] and list(wins["wins"]) == [3]
    assert list(wins["same_kernel"]) == ["sdpa_flash"]


def neighbour_rows():
    """Decode at B=32, Sq 1, cache 4096 / 32768 / 131072: 'paged' wins the two shorter
    caches and fails at 131072 (Inductor's int32 index), 'dense' wins there."""
    rows = []
    for skv in (4096, 32768, 131072):
        c = decode(32, 1, skv)
        if skv == 131072:
            rows.append(error_row("paged", c, "InductorError: inconsistent types int64 and int32"))
            rows.append(ok_row("r", "dense", c, 1.0, 1.0))
        else:
            rows.append({**ok_row("r", "paged", c, 1.0, 1.0), "compile_ms": 1500.0})
            rows.append(ok_row("r", "dense", c, 2.0, 1.0))
    return pd.DataFrame(rows)


def test_a_pick_says_its_failures_next_to_its_workload_and_its_compile_time():
    rec = recommendations(neighbour_rows())
    paged = rec[rec["impl"] == "paged"].iloc[0]
    assert paged["workload"] == "Sq=1 B=32 Skv=4096,32768"
    cause = "error (InductorError: inconsistent types int64 and int32)"
    assert paged["failures"] == (f"Sq=1 B=32 Skv=131072: {cause}",)
    assert paged["compile_ms"] == pytest.approx(1500.0)
    text = "\n".join(picks_table(rec, {}))
    assert "Skv=131072: error (InductorError" in text and "1.5 s" in text


def test_three_values_along_a_split_keep_their_neighbours_merged():
    # cache 4096, 32768: "a" wins by 2x; 131072: "b" by 2x. The split along Skv must give two
    # groups ({4096, 32768} and {131072}), not three: neighbours sharing a pick are merged
    rows = []
    for skv in (4096, 32768, 131072):
        c = decode(1, 1, skv)
        fast = "a" if skv < 131072 else "b"
        rows += [ok_row("r", i, c, 1.0 if i == fast else 2.0, 1.0) for i in ("a", "b")]
    rec = recommendations(pd.DataFrame(rows))
    assert list(rec["workload"]) == ["Sq=1 B=1 Skv=4096,32768", "Sq=1 B=1 Skv=131072"]
    assert list(rec["impl"]) == ["a", "b"]


def test_the_next_kernel_is_the_closest_not_the_first_name():
    # each is the closest in one case; zeta is closer over both (median 1.35x against 1.75x)
    mine = pd.Series([1.0, 1.0])
    others = pd.DataFrame({"alpha": [1.5, 2.0], "zeta": [1.6, 1.1]})
    assert _runner_up(others, mine) == "zeta"


def test_a_pick_serving_two_workloads_of_a_part_is_said_once_with_both():
    from attnbench.report.decide.parts import PartVerdict

    picks = pd.DataFrame(
        {
            "impl": ["paged", "flex", "paged"],
            "kernel": ["", "", ""],
            "where": ["B=1 Skv=131072", "B=1 Skv=32768", "B=32 Skv=4096,32768"],
            "contended": [0, 0, 0],
            "cases": [1, 1, 2],
            "single": ["sdpa"] * 3,
            "single_loss": [1.3] * 3,
        }
    )
    (line,) = verdict_lines([PartVerdict("4-token decode", picks, agreed=True)])
    assert line.startswith(
        "- **4-token decode**: paged at B=1 Skv=131072 and B=32 Skv=4096,32768; "
        "flex at B=1 Skv=32768 (one pick for all: sdpa within 1.30x)"
    ), line


def test_a_margin_is_never_printed_below_one():
    assert lead_text(1.51, "triton_flash") == "1.51x over triton_flash"
    assert lead_text(0.95, "flex") == "flex 1.05x faster"
    assert use_text("sdpa", "cudnn") == "sdpa → cuDNN"
    assert use_text("sdpa_cudnn", "cudnn") == "sdpa_cudnn" and use_text("flex", "") == "flex"


@pytest.mark.skipif(not LLAMA_H100.exists(), reason="the committed Llama H100 run is absent")
def test_the_llama_h100_verdicts_read_as_a_person_would_say_them():
    from attnbench.store.results import load_run

    df, _ = load_run(LLAMA_H100)
    rec = recommendations(df)
    lines = verdict_lines(part_verdicts(rec))
    assert lines[0] == "- **prefill**: sdpa → cuDNN, fastest everywhere, 1.51x over triton_flash"
    # one new token: sdpa (flash) within 1.03x at B=1, cuDNN at B=32; sdpa alone within 1.15x
    assert lines[1].startswith("- **1-token decode**: sdpa → flash at B=1; sdpa_cudnn at B=32")
    assert "one pick for all: sdpa within 1.15x" in lines[1]
    assert lines[2].startswith("- **4-token decode**:") and "flex at B=1" in lines[2]
    assert (rec["worst_loss"] <= 1.10).all()
    flex = rec[rec["impl"] == "flex"].iloc[0]
    assert "Sq=4 B=32 Skv=131072: error" in flex["failures"][0]


def git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_staleness_names_the_commits_ahead_and_whether_measuring_code_changed(tmp_path):
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "user.email", "a@b.c")
    git(tmp_path, "config", "user.name", "a")
    (tmp_path / "attnbench" / "run").mkdir(parents=True)
    (tmp_path / "README.md").write_text("a\n")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "first")
    sha = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True,
                         text=True, check=True).stdout.strip()  # fmt: skip
    assert "the commit this report was rendered at" in staleness_line({"git_sha": sha}, tmp_path)
    (tmp_path / "README.md").write_text("b\n")
    git(tmp_path, "commit", "-qam", "docs")
    line = staleness_line({"git_sha": sha}, tmp_path)
    assert f"Measured at {sha[:7]}" in line and "1 commit later" in line
    assert "measuring code (attnbench/run, measure, impls) is unchanged" in line
    (tmp_path / "attnbench" / "run" / "row.py").write_text("x = 1\n")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "run")
    line = staleness_line({"git_sha": sha}, tmp_path)
    assert "2 commits later" in line and "changed since" in line
    assert "cannot tell" in staleness_line({"git_sha": "0" * 40}, tmp_path)
    assert "cannot tell" in staleness_line({"git_sha": sha}, tmp_path / "nowhere")


def test_staleness_reads_the_checkout_attnbench_runs_from():
    """Without a folder given, the history is the checkout's own (where its modules live,
    however deep): its HEAD is the commit rendered at."""
    from attnbench import checkout

    root = checkout.root()
    if root is None or not (root / ".git").exists():
        pytest.skip("attnbench runs from an installed package or a tree without git history")
    sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                         text=True, check=True).stdout.strip()  # fmt: skip
    assert staleness_line({"git_sha": sha}).endswith("the commit this report was rendered at.")


def test_report_refuses_a_tolerance_below_one_in_one_line(tmp_path, capsys):
    from attnbench.cli import _tolerance, main

    reports = tmp_path / "reports"
    argv = ["report", str(LLAMA_H100), "--tolerance", "0.9", "--reports-dir", str(reports)]
    assert main(argv) == 2 and not reports.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--tolerance: '0.9'" in err[0]
    assert _tolerance("1.25") == 1.25


def frame(rows, tmp=None) -> pd.DataFrame:
    """The rows as results.csv gives them back: every schema column, typed."""
    import tempfile

    from synth import write_run

    from attnbench.store.results import read_results

    with tempfile.TemporaryDirectory() as root:
        return read_results(write_run(Path(root), "r", rows))


def test_the_lowest_cpu_share_is_said_of_the_contended_rows():
    from attnbench.report.analysis import analyse
    from attnbench.report.render.checks import checks_section

    case = Case(1, 4, 4, 256, 256, 64)
    rows = [
        {**ok_row("r", "a", case, 1.0, 1.0), "cpu_share": 0.32, "contended": False},
        {**ok_row("r", "b", case, 1.0, 1.0), "cpu_share": 0.36, "contended": True},
    ]
    text = "\n".join(checks_section(analyse(frame(rows), {}, "r")))
    assert "1 CPU row(s) were contended" in text and "lowest cpu_share 0.36" in text
    assert "0.32" not in text


def test_the_profiler_gap_is_time_over_profiler_minus_one():
    from attnbench.report.analysis import analyse
    from attnbench.report.render.checks import checks_section

    case = Case(1, 4, 4, 256, 256, 64, device="cuda", dtype="bfloat16")
    rows = [{**ok_row("r", "a", case, 1.79, 1.0), "profiler_ms": 1.0}]
    text = "\n".join(checks_section(analyse(frame(rows), {}, "r")))
    assert "(time / profiler - 1): 79.0%" in text


def test_no_n_squared_buffer_is_claimed_for_a_decode_series():
    from attnbench.report.analysis import analyse_device
    from attnbench.report.render.sections import score_memory_lines

    rows = []
    for skv in (1024, 2048, 4096):  # a decode series: its peak is a K/V copy, not scores
        rows.append(ok_row("r", "eager", decode(1, 1, skv), 1.0, 258 * skv / 2**20 * 128))
    for n in (256, 512, 1024):  # a prefill series holding 3 score matrices
        c = Case(1, 4, 4, n, n, 64)
        rows.append(ok_row("r", "naive", c, 1.0, 3 * 4 * n * n * 4 / 2**20))
    text = "\n".join(score_memory_lines(analyse_device(pd.DataFrame(rows))))
    assert "naive" in text and "3.0x" in text
    assert "eager" not in text


def test_a_negative_or_noise_only_exponent_is_no_lower_bound():
    from attnbench.report.analyse.scaling import bound_mark

    fit = {"overhead_limited": True, "slope": 1.6, "slope_se": 0.1}
    assert bound_mark(fit) == "≥"
    assert bound_mark({**fit, "slope": -0.37, "slope_se": 0.75}) == ""
    assert bound_mark({**fit, "slope": 0.3, "slope_se": 0.2}) == ""  # within noise of 0
    assert bound_mark({**fit, "overhead_limited": False}) == ""


def test_the_agreement_bound_sits_at_the_cache_length_on_a_decode_panel():
    from attnbench.report.analyse.derived import with_series
    from attnbench.report.analyse.figure_data import error_lines
    from attnbench.report.plot import plots

    rows = [
        {**ok_row("r", "sdpa", decode(1, 1, skv), 1.0, 1.0), "err_bound": 1e-2}
        for skv in (1024, 2048, 4096)
    ]
    fig = plots.plot_error_vs_seq(error_lines(with_series(pd.DataFrame(rows))))
    dashed = [ln for ax in fig.axes for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    xs = {float(x) for ln in dashed for x in ln.get_xdata()}
    plots.plt.close(fig)
    assert xs == {1024.0, 2048.0, 4096.0}


def test_speed_over_time_is_on_a_log_axis():
    from attnbench.report.analyse.figure_data import speed_series
    from attnbench.report.plot import plots

    series = pd.DataFrame(
        {
            "resource": ["compute"] * 3,
            "t_s": [0.0, 1.0, 2.0],
            "time_ms": [1.0, 0.01, 0.002],
            "speed": [1.0, 100.0, 540.0],
        }  # fmt: skip
    )
    fig = plots.plot_speed_over_time(speed_series(series))
    scale = fig.axes[0].get_yscale()
    plots.plt.close(fig)
    assert scale == "log"


def test_hf_sdpa_records_the_sdpa_kernel_it_ran_and_is_one_contestant_with_sdpa(impls):
    pytest.importorskip(
        "transformers", reason="transformers is not installed (pip install '.[hf]')"
    )
    from attnbench.testing import run_rows

    case = Case(1, 4, 2, 64, 64, 16, causal=True, causal_align="bottom_right")
    rows = run_rows([impls["sdpa"], impls["hf_sdpa"]], case)
    assert rows["hf_sdpa"]["status"] == "ok" and rows["hf_sdpa"]["backend"]
    assert rows["hf_sdpa"]["backend"] == rows["sdpa"]["backend"]  # the same torch op
    w = verdicts.fastest_agreeing(frame(list(rows.values()))).iloc[0]
    assert {w["impl"], w["same_kernel"]} == {"sdpa", "hf_sdpa"}


FIRST_SCREEN = 40  # lines: the decision fits on one screen
RUNS = [  # the Llama H100 run in every suite, the others with -m slow (seconds each)
    pytest.param(p, marks=() if p == LLAMA_H100 else pytest.mark.slow, id=p.name)
    for p in sorted((ROOT / "results").glob("*"))
    if (p / "results.csv").exists()
]


@pytest.fixture
def text_only(monkeypatch):
    """Reports without drawing (seconds per figure): the text is what these tests read."""
    from attnbench.report.plot import plots

    for name in dir(plots):
        if name.startswith("plot_"):
            monkeypatch.setattr(plots, name, lambda *a, **k: None)
    monkeypatch.setattr(plots, "save_figure", lambda fig, stem, **k: [])


@pytest.mark.parametrize("run", RUNS)
def test_every_committed_run_renders_its_decision_on_the_first_screen(run, tmp_path, text_only):
    from attnbench.report.report import write_report

    lines = write_report(run, tmp_path).read_text().splitlines()
    head = "\n".join(lines[:FIRST_SCREEN])
    assert "## Not covered" in head
    if "## Recommendations" in "\n".join(lines):
        assert "## Verdicts" in head and "## Recommendations" in head
        assert head.index("## Not covered") > head.index("## Recommendations")
    long = [line[:80] for line in lines if len(line) > 400]
    assert long == []


def test_memory_panels_carry_o_n_and_o_n_squared_guides():
    from attnbench.report.analyse.derived import with_series
    from attnbench.report.analyse.figure_data import memory_lines
    from attnbench.report.plot import plots

    rows = [ok_row("r", "naive", Case(1, 4, 4, n, n, 64), 1.0, n * n / 1e4) for n in (256, 1024)]
    fig = plots.plot_memory_vs_seq(memory_lines(with_series(frame(rows))))
    guides = {ln.get_label(): ln for ax in fig.axes for ln in ax.get_lines()}
    plots.plt.close(fig)
    assert {"O(N) guide", "O(N²) guide"} <= set(guides)
    n2 = guides["O(N²) guide"].get_ydata()
    assert n2[-1] / n2[0] == pytest.approx(16.0)  # 4x the length: 16x the memory


def test_decode_panels_show_bandwidth_against_the_hbm_peak():
    from attnbench.report.analysis import analyse_device
    from attnbench.report.plot import plots
    from attnbench.report.plot.figures import FIGURES

    rows = [
        {**ok_row("r", "sdpa", decode(1, 1, s), 0.1, 1.0), "gbps": s / 50} for s in (4096, 8192)
    ]
    env = {"gpu_name": "NVIDIA H100 80GB HBM3", "ceilings": {"copy_gb_s": 3003.0}}
    a = analyse_device(frame(rows), env)
    figure = next(f for f in FIGURES if f.stem == "decode_bandwidth")
    assert figure.applies(a)
    fig = figure.draw(a)
    ys = {float(ln.get_ydata()[0]) for ax in fig.axes for ln in ax.get_lines()}
    plots.plt.close(fig)
    assert {3350.0, 3003.0} <= ys
    prefill = analyse_device(frame([ok_row("r", "sdpa", Case(1, 4, 4, 64, 64, 16), 1.0, 1.0)]))
    assert not figure.applies(prefill)


def test_who_wins_where_names_a_decode_familys_cache_lengths_as_skv():
    rows = []
    for skv in (1024, 2048, 4096):
        rows += [ok_row("r", i, decode(1, 1, skv), t, 1.0) for i, t in (("a", 1.0), ("b", 2.0))]
    wins = verdicts.wins_by_family(verdicts.fastest_agreeing(frame(rows)))
    assert list(wins["axis"]) == ["Skv"] and list(wins["spans"]) == ["1024–4096"]


def test_who_wins_where_tells_a_decode_familys_wins_by_cache_length_per_new_tokens():
    """One and four new tokens share a decode family: its wins are cache lengths at each Sq,
    never 'N 1' (the number of new tokens read as a length)."""
    rows = []
    for sq, skv, fast in ((1, 1024, "a"), (1, 2048, "a"), (4, 1024, "b"), (4, 2048, "a")):
        slow = "b" if fast == "a" else "a"
        rows += [ok_row("r", fast, decode(1, sq, skv), 1.0, 1.0)]
        rows += [ok_row("r", slow, decode(1, sq, skv), 2.0, 1.0)]
    wins = verdicts.wins_by_family(verdicts.fastest_agreeing(frame(rows))).set_index("impl")
    assert set(wins["axis"]) == {"Skv"}
    assert wins.loc["a", "spans"] == "1024–2048 at Sq=1, 2048 at Sq=4"
    assert wins.loc["b", "spans"] == "1024 at Sq=4"


def test_a_decode_pick_states_its_kv_cache_beside_its_peak_temporaries():
    rec = recommendations(neighbour_rows())  # B=32 Hkv=8 D=128 bf16: 16 MiB per 1024 keys
    paged = rec[rec["impl"] == "paged"].iloc[0]
    assert (paged["kv_mib_min"], paged["kv_mib_max"]) == (512.0, 4096.0)
    assert "(KV 512–4096)" in "\n".join(picks_table(rec, {}))


def two_case_rows(times: dict) -> pd.DataFrame:
    """Decode at B=1 Sq=1, cache 4096 and 32768: impl -> its two times."""
    cases = [decode(1, 1, 4096), decode(1, 1, 32768)]
    return pd.DataFrame(
        [ok_row("r", i, c, t, 1.0) for i, ts in times.items() for c, t in zip(cases, ts)]
    )


def test_picks_equal_in_worst_loss_are_told_apart_by_their_median_loss_not_their_name():
    # both lose 1.05x once; zeta is fastest in the other case, alpha loses there too
    rec = recommendations(two_case_rows({"alpha": (1.05, 1.05), "zeta": (1.05, 1.0),
                                         "best": (1.0, 9.0), "other": (9.0, 1.0)}))  # fmt: skip
    assert list(rec["impl"]) == ["zeta"] and rec.loc[0, "worst_loss"] == pytest.approx(1.05)


def test_a_loss_of_exactly_the_tolerance_keeps_one_pick():
    rec = recommendations(two_case_rows({"a": (1.1, 1.0), "b": (1.0, 2.0)}))
    assert list(rec["impl"]) == ["a"] and rec.loc[0, "worst_loss"] == 1.1


def test_a_long_table_is_folded_below_the_first_screen():
    from attnbench.report.render.markdown import FOLD_ROWS, fold_long

    assert fold_long("t", ["| a |"], FOLD_ROWS) == ["| a |", ""]
    long = fold_long("The fits per series", ["| a |"], FOLD_ROWS + 1)
    assert long[0] == "<details>" and f"({FOLD_ROWS + 1} rows)" in long[1]
    text = (ROOT / "reports" / "cpu-preset-2core-xeon" / "report.md").read_text()
    waste = text.split("# Wasted work")[1].split("\n### ")[0]
    assert "<summary>Useful and work GFLOP per case and impl" in waste


def test_the_compare_figure_rings_a_decode_ratio_over_the_gate_at_its_cache_length():
    from attnbench.report.analyse.figure_data import ratio_lines

    rows = [
        {**ok_row("r", "sdpa", decode(1, 1, skv), 1.0, 1.0), "ratio": 1.5}
        for skv in (1024, 2048, 4096)
    ]
    lines = ratio_lines(pd.DataFrame(rows), 10.0, "B / A time ratio")
    (panel,) = lines.panels
    assert list(panel.extra.x) == [1024.0, 2048.0, 4096.0]  # the axis' cache lengths, not Sq=1
