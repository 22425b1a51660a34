import os

import pytest
from synth import env, smoke_rows, write_run

from attnbench.cli import main
from attnbench.report import report
from attnbench.report.analysis import analyse
from attnbench.report.plot import plots
from attnbench.report.render import checks
from attnbench.store.results import read_results


@pytest.fixture
def stub_figures(monkeypatch):
    """Skip drawing (seconds per report) in tests about the report's text and files."""

    def save(fig, stem, svg=True, crop=True):
        stem.with_suffix(".png").write_bytes(b"png")
        return [stem.with_suffix(".png")]

    for name in dir(plots):
        if name.startswith("plot_"):
            monkeypatch.setattr(plots, name, lambda *a, **k: None)
    monkeypatch.setattr(plots, "save_figure", save)


@pytest.fixture(scope="module")
def smoke_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("smoke")
    run = write_run(root / "results", "smoke1", smoke_rows("smoke1"))
    path = report.write_report(run, root / "reports")
    return root, run, path


def test_report_has_every_section_and_figure(smoke_report):
    root, _, path = smoke_report
    assert path == root / "reports" / "smoke1" / "report.md"
    text = path.read_text()
    for heading in (
        "## Summary",
        "### Who wins where",
        "### Speedup vs sdpa",
        "### Scaling exponents",
        "### Numerical agreement",
        "## Plots",
        "## Non-ok rows",
        "### Failures (4)",
        "### Unsupported",
    ):
        assert heading in text
    assert "Synthetic CPU @ 3.0GHz" in text
    assert "`python scripts/sweep.py --preset smoke --run-id synth`" in text
    assert "torch 2.13.0+cpu" in text
    for stem, *_, applies in report.FIGURES:
        if applies is not None:  # a figure of some runs only (decode bandwidth)
            continue
        png = path.parent / f"{stem}.png"
        assert png.stat().st_size > 10_000, stem
        assert f"]({stem}.png)" in text
    assert "nan" not in text.lower().replace("nanos", "")


def test_report_names_winners_disagreement_and_failures(smoke_report):
    text = smoke_report[2].read_text()
    assert "**sdpa** 6/6" in text
    assert "rel_err 3e-03 > bound 1e-05 on dq" in text  # the disagreeing row and its reason
    # one line per impl and cause, with its count and cases (the 4 ooms of naive are one)
    assert text.count("| naive | oom | out of memory: tried to allocate 256 MiB | 4 |") == 1
    # the 48 unsupported rows, grouped by impl and reason with their count
    assert "| triton_flash | unsupported | device=cpu (supported: cuda) | 24 |" in text
    assert "| xformers | unsupported | device=cpu (supported: cuda) | 24 |" in text
    assert "Unsupported: capability gaps, not run (48)" in text
    assert "≥" in text  # an overhead-limited time fit is marked as a lower bound


def test_report_replaces_atomically_and_keeps_old_on_failure(tmp_path, stub_figures, monkeypatch):
    run = write_run(tmp_path / "results", "r", smoke_rows("r", seqs=(64, 128, 256)))
    reports = tmp_path / "reports"
    path = report.write_report(run, reports)
    before = path.read_text()
    assert report.write_report(run, reports) == path  # a rerun replaces cleanly
    assert sorted(os.listdir(reports)) == ["r"]

    def boom(*a, **k):
        raise RuntimeError("section failed")

    monkeypatch.setattr(checks, "failures_section", boom)
    with pytest.raises(RuntimeError):
        report.write_report(run, reports)
    assert path.read_text() == before  # the old report is untouched
    assert sorted(os.listdir(reports)) == ["r"]  # no temp folder left


def _figures_said(path) -> dict[str, str]:
    """stem -> "drawn" (linked, its file there) or the reason the report gives instead."""
    said, text = {}, path.read_text()
    for fig in report.FIGURES:
        block = text.partition(f"# {fig.heading}\n")[2].split("\n#")[0]
        if f"]({fig.stem}.png)" in block:
            assert (path.parent / f"{fig.stem}.png").exists(), fig.stem
            said[fig.stem] = "drawn"
        elif "Not drawn: " in block:
            assert not (path.parent / f"{fig.stem}.png").exists(), fig.stem  # nothing half-written
            said[fig.stem] = block.split("Not drawn: ")[1].splitlines()[0]
    return said


@pytest.mark.parametrize("processes", [0, 2], ids=["here", "in-processes"])
def test_a_figure_that_fails_leaves_the_report_and_says_why(
    tmp_path, stub_figures, monkeypatch, capsys, processes
):
    """A figure that raises, here or in a drawing process, half-way through writing its file:
    the report is written, the figure's place says why in one line (on stderr too), its
    half-written file is gone, and every other figure is drawn."""
    from attnbench.report.plot import drawing

    run = write_run(tmp_path / "results", "r", smoke_rows("r", seqs=(64, 128, 256)))
    save = plots.save_figure

    def half_written(fig, stem, svg=False, crop=True):
        if stem.name == "error_vs_seq":
            stem.with_suffix(".png").write_bytes(b"\x89PNG half")
            raise RuntimeError("disk full\nsecond line")
        return save(fig, stem, svg, crop)

    monkeypatch.setattr(plots, "save_figure", half_written)
    monkeypatch.setattr(drawing, "processes", lambda: processes)
    said = _figures_said(report.write_report(run, tmp_path / "reports"))
    assert said.pop("error_vs_seq") == "RuntimeError: disk full second line"
    assert set(said.values()) == {"drawn"} and len(said) >= 6
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "attnbench report: error_vs_seq.png not drawn: RuntimeError: disk full second line"
    ]


def test_drawing_processes_share_one_import_of_pyplot():
    """pyplot is imported before the drawing processes fork, once for all of them: each
    importing it itself cost its CPU again (half a second) on the cores the analysis runs on."""
    import subprocess
    import sys

    code = (
        "import sys; from attnbench.report.plot import drawing; "
        "drawing.processes = lambda: 2; before = 'matplotlib.pyplot' in sys.modules\n"
        "with drawing.Drawing(): print(before, 'matplotlib.pyplot' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"], out.stderr[-2000:]


@pytest.mark.timeout(120)
def test_a_drawing_process_that_dies_leaves_the_report(tmp_path, stub_figures, monkeypatch):
    """A drawing process killed mid-figure (out of memory, a crash in a library) neither hangs
    the report nor loses it: the figures it took say why, the others are drawn."""
    from attnbench.report.plot import drawing

    parent = os.getpid()

    def dies(*a, **k):
        if os.getpid() != parent:
            os._exit(9)

    run = write_run(tmp_path / "results", "r", smoke_rows("r", seqs=(64, 128, 256)))
    monkeypatch.setattr(plots, "plot_error_vs_seq", dies)
    monkeypatch.setattr(drawing, "processes", lambda: 2)
    said = _figures_said(report.write_report(run, tmp_path / "reports"))
    assert said["error_vs_seq"].startswith("BrokenProcessPool: ")
    assert len(said) == len([f for f in report.FIGURES if f.applies is None])


def test_report_without_env_says_so(tmp_path, stub_figures):
    run = write_run(
        tmp_path / "results", "noenv", smoke_rows("noenv", seqs=(64, 128, 256)), env_data=False
    )
    text = report.write_report(run, tmp_path / "reports").read_text()
    assert "env.json is missing" in text


def test_report_warns_about_a_busy_machine(tmp_path, stub_figures):
    rows = smoke_rows("busy", seqs=(64, 128, 256))
    quiet = write_run(tmp_path / "results", "quiet", rows)
    busy = write_run(tmp_path / "results", "busy", rows, env_data=env(load_avg_1m=3.4))
    assert "machine was busy" not in report.write_report(quiet, tmp_path / "r").read_text()
    text = report.write_report(busy, tmp_path / "r").read_text()
    assert "machine was busy when the sweep started** (load 3.4 on 2 cores)" in text


def test_a_run_of_one_length_draws_no_figure_against_n_and_says_why(tmp_path, stub_figures):
    run = write_run(tmp_path / "results", "one", smoke_rows("one", seqs=(64,)))
    path = report.write_report(run, tmp_path / "reports")
    text = path.read_text()
    assert "Every ok row has N = 64: the figures against N (time per call, peak memory" in text
    drawn = {p.stem for p in path.parent.glob("*.png")}
    assert drawn == {f.stem for f in report.FIGURES if not f.over_n}
    assert all(f"]({stem}.png)" in text for stem in drawn)


@pytest.mark.slow
def test_report_from_a_real_smoke_sweep(tmp_path, capsys):
    assert (
        main(
            [
                "sweep",
                "--device",
                "cpu",
                "--preset",
                "smoke",
                "--run-id",
                "smoke",
                "--no-progress",
                "--impls",
                "naive,sdpa,tiled,xformers",
                "--results-dir",
                str(tmp_path / "results"),
                "--reports-dir",
                str(tmp_path / "reports"),
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert (
        main(
            [
                "report",
                str(tmp_path / "results" / "smoke"),
                "--reports-dir",
                str(tmp_path / "reports"),
            ]
        )
        == 0
    )
    text = (tmp_path / "reports" / "smoke" / "report.md").read_text()
    assert "### Who wins where" in text and "attnbench sweep --device cpu --preset smoke" in text
    # smoke sweeps 2 lengths: every series says why it has no fit instead of inventing one
    assert "2 lengths with a value, a fit needs 3" in text
    assert "| xformers |" in text  # CPU has no xformers: listed as unsupported
    for stem, *_ in report.FIGURES:
        assert (tmp_path / "reports" / "smoke" / f"{stem}.png").stat().st_size > 5_000


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda d: None, "does not exist"),
        (lambda d: d.mkdir(), "results.csv not found"),
        (lambda d: (d.mkdir(), (d / "results.csv").write_text("a,b\n1,2\n")), "lacks columns"),
    ],
)
def test_report_cli_bad_input(tmp_path, capsys, make, needle):
    run = tmp_path / "run"
    make(run)
    code = main(["report", str(run), "--reports-dir", str(tmp_path / "reports")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("attnbench report: error: ") and needle in err and err.count("\n") == 1
    assert not (tmp_path / "reports").exists()


def test_report_cli_unknown_baseline(tmp_path, capsys):
    run = write_run(tmp_path, "r", smoke_rows("r", seqs=(64, 128, 256)))
    assert (
        main(["report", str(run), "--reports-dir", str(tmp_path / "rep"), "--baseline", "nosuch"])
        == 2
    )
    assert "pick one of: naive, sdpa" in capsys.readouterr().err
    assert not (tmp_path / "rep").exists()


def test_report_cli_writes_report(tmp_path, capsys, stub_figures):
    run = write_run(tmp_path, "r", smoke_rows("r", seqs=(64, 128, 256)))
    assert (
        main(["report", str(run), "--reports-dir", str(tmp_path / "rep"), "--baseline", "naive"])
        == 0
    )
    out = capsys.readouterr().out.strip()
    assert out.endswith("report.md")
    assert "### Speedup vs naive" in (tmp_path / "rep" / "r" / "report.md").read_text()


def test_impl_colours_are_stable_across_runs(impls):
    colors = {name: impl.color for name, impl in impls.items() if impl.color}
    assert {"naive", "sdpa", "tiled", "triton_flash"} <= set(colors)  # built-ins declare one
    a = plots.impl_style(["sdpa", "naive"], colors)
    b = plots.impl_style(["naive", "sdpa", "tiled", "zz_plugin", "aa_plugin"], colors)
    assert a["sdpa"] == b["sdpa"] and a["naive"] == b["naive"]
    assert b["aa_plugin"] != b["zz_plugin"]
    assert len({c for c, _ in b.values()}) == len(b)


def test_report_lists_cross_checked_rows_and_flags_borrowed_kernels(tmp_path, stub_figures):
    """CUDA rows: the profiler cross-checked a sample of them (profiler_ms on those alone), and
    xformers ran PyTorch's kernels (backend pytorch:flash): the report says which rows were
    cross-checked, and that xformers is no independent baseline: where it wins, it wins as
    the kernel sdpa_flash ran too, one contestant named once."""
    from synth import ok_row

    from attnbench.case import Case

    rows = []
    for i, n in enumerate((1024, 2048, 4096)):
        case = Case(2, 16, 16, n, n, 128, dtype="bfloat16", device="cuda")
        sdpa = ok_row("gpu", "sdpa_flash", case, 2.0 * n / 1024, 10.0)
        xf = ok_row("gpu", "xformers", case, 1.9 * n / 1024, 10.0)
        sdpa.update(backend="flash", profiler_ms=sdpa["time_ms"] if i == 0 else None)
        xf.update(backend="pytorch:flash", profiler_ms=xf["time_ms"] if i == 0 else None)
        rows += [sdpa, xf]
    run = write_run(tmp_path / "results", "gpu", rows, env_data=env(device="cuda"))
    text = report.write_report(run, tmp_path / "reports").read_text()
    assert "The profiler cross-checked 2 of 6 ok CUDA rows" in text
    assert "| sdpa_flash | B2 H16 S1024 D128 bfloat16 full fwd |" in text
    assert "**Not an independent baseline**: `xformers` in 3 of 3 ok rows (pytorch:flash)" in text
    assert "**xformers (PyTorch's kernels)** (same kernel as sdpa_flash) 3/3" in text  # faster


def test_measurement_checks_say_no_row_page_faulted_instead_of_zero_rows(tmp_path):
    from attnbench.store.results import read_results

    rows = smoke_rows("pf", seqs=(64, 128, 256))
    for r in rows:
        r["page_faults"] = 2.0 if r["status"] == "ok" else None
    df = read_results(write_run(tmp_path, "pf", rows))
    text = "\n".join(checks.checks_section(analyse(df, {}, "r")))
    assert "0 CPU row(s)" not in text
    assert "No CPU row page-faulted inside the timing (at most 2 minor faults" in text


def test_a_gpu_at_its_power_cap_is_said_once_and_only_rows_held_back_are_listed(tmp_path):
    """On an H100 every sustained row meets the power cap: the checks count the reasons, and
    list only rows whose clock fell more than 5% under the run's highest, or that saw a
    thermal or hardware reason."""
    from attnbench.store.results import read_results

    rows = [r for r in smoke_rows("gpu", seqs=(64, 128, 256)) if r["status"] == "ok"]
    for r in rows:
        r.update(device="cuda", sm_clock_mhz=1980.0, throttle="sw_power_cap")
    rows[0].update(sm_clock_mhz=1800.0)  # power capped and slowed
    rows[1].update(throttle="sw_power_cap,hw_thermal")  # a thermal reason at full clock
    rows[2].update(throttle="none")
    df = read_results(write_run(tmp_path, "gpu", rows))
    text = "\n".join(checks.checks_section(analyse(df, {}, "r")))
    held = len(rows) - 1
    assert f"of {len(rows)} ok rows: hw_thermal in 1, sw_power_cap in {held}." in text
    assert "a single burst runs faster" in text and "2 row(s) ran with their clocks held" in text
    listed = [line for line in text.splitlines() if "sw_power_cap" in line and line[:2] == "| "]
    assert len(listed) == 2


def test_no_two_series_share_a_label(tmp_path, stub_figures):
    """Three masks (none, document, block_sparse) of the same shapes: each series is named
    apart in the analysis and in the rendered scaling table, and decode series (one query,
    the cache varies) are fitted against the cache length."""
    from synth import ok_row

    from attnbench.case import Case
    from attnbench.report.analysis import analyse_device
    from attnbench.store.results import read_results

    masks = {"none": None, "document": "uniform:16-64", "block_sparse": "block=16:local=1"}
    rows = []
    for n in (128, 256, 512, 1024):
        for mask, pattern in masks.items():
            for impl, causal in (("a", False), ("a", True), ("b", False)):
                row = ok_row("m", impl, Case(1, 2, 2, n, n, 16, causal=causal), n * n, n)
                rows.append({**row, "mask": mask, "pattern": pattern})
        for q in (1, 4):
            case = Case(1, 4, 2, q, 8 * n, 16, causal=True, causal_align="bottom_right",
                        phase="decode")  # fmt: skip
            rows.append(ok_row("m", "a", case, 1e-4 * n, 1e-3 * n))
    run = write_run(tmp_path / "results", "m", rows)
    a = analyse_device(read_results(run), env())
    series = a.fits.drop_duplicates(["impl", "series"])
    assert len(series) == len(a.fits) // 2 == 3 * 3 + 2  # every series named apart
    of_a = {s for s in series.loc[series["impl"] == "a", "series"] if "decode" not in s}
    for mask in ("no mask", "document uniform:16-64", "block_sparse block=16:local=1"):
        assert sum(mask in label for label in of_a) == 2, (mask, of_a)  # full and causal
    decode = a.fits[a.fits["seq_kv_rule"].str.startswith("Sq=")]
    assert set(decode["axis"]) == {"seq_kv"} and len(decode) == 4
    time = decode[decode["metric"] == "time_ms"]
    assert time["slope"].between(0.9, 1.1).all() and (time["seq_max"] == 8192).all()
    text = report.write_report(run, tmp_path / "reports").read_text()
    table = text.split("### Scaling exponents")[1].split("\n\n")[2]
    named = [tuple(line.split(" | ")[:2]) for line in table.splitlines()[2:]]
    assert len(named) == 11 and len(set(named)) == len(named), named
    assert table.count("pts, Skv 2048–8192)") == 4  # decode: time and memory vs the cache


def test_a_run_written_before_a_metric_existed_is_still_reported(tmp_path, stub_figures):
    """A run made before the speed anchor has no speed_compute or speed_memory columns: they
    read back blank, and its report is written (it crashed in the measurement checks)."""
    import csv

    run = write_run(tmp_path, "old", smoke_rows("old", seqs=(64, 128, 256)))
    path = run / "results.csv"
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    kept = [c for c in rows[0] if c not in ("speed_compute", "speed_memory")]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=kept, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    assert main(["report", str(run), "--reports-dir", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "old" / "report.md").is_file()


def test_a_row_over_the_copy_ceiling_is_explained_by_reads_and_set_against_published_peaks(
    tmp_path,
):
    """Decode reads its cache: it can pass a copy's bandwidth (a read and a write per byte);
    the report says so, not "measured low", and states the device's published peaks."""
    from synth import ok_row

    from attnbench.case import Case

    case = Case(32, 32, 8, 1, 4096, 128, dtype="bfloat16", device="cuda")
    row = ok_row("d", "sdpa", case, 0.2, 1.0)
    row.update(gbps=3100.0, pct_peak=103.0, bound="memory")
    ceilings = {"matmul_tflops": {"bfloat16": 700.0}, "copy_gb_s": 3000.0, "matmul_n": 8192}
    env = {"gpu_name": "NVIDIA H100 80GB HBM3", "ceilings": ceilings}
    df = read_results(write_run(tmp_path, "d", [row]))
    text = "\n".join(checks.checks_section(analyse(df, env, "d")))
    assert "above the measured copy bandwidth" in text and "measured low" not in text
    assert "measured matmul 700 TFLOP/s = 71% of the published 989.4" in text
    assert "the fastest row 3100 GB/s = 93% of published" in text


def test_flagged_rows_say_which_check_flagged_them(tmp_path):
    from synth import ok_row

    from attnbench.case import Case

    rows = [ok_row("f", "naive", Case(1, 4, 4, n, n, 64), 1.0, 1.0) for n in (128, 256)]
    rows[0].update(time_ms_p20=0.5, time_ms_p80=1.5)  # noisy
    rows[1].update(contended=True, cpu_share=0.5)
    df = read_results(write_run(tmp_path, "f", rows))
    text = "\n".join(checks.checks_section(analyse(df, {}, "f")))
    assert "2 ok row(s) flagged by the checks above (noisy 1, contended 1)" in text
    assert "| naive | B1 H4 S128 D64 float32 full fwd | noisy |" in text


def test_the_header_names_the_preset_impls_a_command_left_out():
    from attnbench.report.render.header import preset_left_out

    env = {"command": "attnbench race --head-dim 128 --impls triton_flash,sdpa_flash"}
    left = preset_left_out(env)
    assert left.startswith("the race preset's triton_flash_fa2") and "sdpa_flash" not in left
    assert preset_left_out({"command": "attnbench sweep --preset cpu"}) == ""


def test_a_peak_of_several_score_matrices_is_said_in_score_matrices(tmp_path):
    from synth import ok_row

    from attnbench.case import Case
    from attnbench.report.analysis import analyse_device
    from attnbench.report.render.sections import score_memory_lines

    rows = []
    for n in (1024, 2048, 4096):
        case = Case(2, 16, 16, n, n, 128, dtype="bfloat16")
        matrix_mib = 2 * 16 * n * n * 2 / 2**20
        rows.append(ok_row("m", "math", case, 1.0, 4.8 * matrix_mib))
        rows.append(ok_row("m", "flash", case, 1.0, 0.01 * matrix_mib * 4096 / n))
    a = analyse_device(read_results(write_run(tmp_path, "m", rows)))
    text = "\n".join(score_memory_lines(a))
    assert "math (fwd full bfloat16 B2 H16 D128 Skv=Sq, N 4096): 4.8x" in text
    assert "flash (" not in text


def test_a_row_whose_precision_is_below_an_fp32_accumulating_kernel_is_listed(tmp_path):
    from synth import ok_row

    from attnbench.case import Case
    from attnbench.report.analysis import analyse_device
    from attnbench.report.render.sections import disagreement_section

    rows = []
    for impl, ratio in (("half_acc", 9.5), ("sdpa", 1.1)):
        row = ok_row("p", impl, Case(1, 4, 4, 2048, 2048, 64, dtype="bfloat16"), 1.0, 1.0)
        rows.append({**row, "precision_ratio": ratio, "precision_low": ratio > 2.75})
    a = analyse_device(read_results(write_run(tmp_path, "p", rows)))
    text = "\n".join(disagreement_section(a))
    assert "All 2 ok rows agree" in text
    assert "1 ok row(s) have a precision below an fp32-accumulating kernel's" in text
    assert "| half_acc | B1 H4 S2048 D64 bfloat16 full fwd | 9.50 |" in text
    assert "| sdpa |" not in text


def test_the_same_cases_across_devices_are_side_by_side_on_a_busy_machine_too(tmp_path):
    """A run over two kinds of device (a Ray run): each case's median time on each, by the
    rows' device names, also where the machine was busy (the device parts are then titled
    'BUSY', the table's columns are still the rows' device names)."""
    from synth import ok_row

    from attnbench.case import Case

    case = Case(1, 2, 2, 64, 64, 16)
    rows = [
        {**ok_row("x", "sdpa", case, t, 1.0), "device_name": name}
        for name, times in (("CPU A", (1.0, 3.0, 2.0)), ("CPU B", (5.0,)))
        for t in times
    ]
    busy = {**env(load_avg_1m=9.0), "cpu_count": 2}
    df = read_results(write_run(tmp_path, "x", rows, env_data=busy))
    run = analyse(df, busy, "x")
    assert all("BUSY" in part.name for part in run.devices)
    text = "\n".join(checks.across_devices_section(run))
    assert "| case | impl | CPU A | CPU B |" in text
    assert "| B1 H2 S64 D16 float32 full fwd | sdpa | 2 | 5 |" in text
