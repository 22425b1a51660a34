"""Ceilings, profile mode, the profiler cross-check and the clock sampler, on the CPU."""

import importlib.metadata
import json
import types

import pandas as pd
import pytest

from attnbench.cli import main
from attnbench.measure import clocks, profiling
from attnbench.run.executing.local import Subprocess
from attnbench.store.env import FIELDS
from attnbench.store.results import read_results

ENV_FIELDS = (*FIELDS, "ceilings")  # the machine's, and the ceilings the sweep measured


@pytest.fixture(scope="module")
def profiled_run(tmp_path_factory):
    """The smoke grid profiled, each start of a worker process counted."""
    tmp = tmp_path_factory.mktemp("prof")
    starts, start = [], Subprocess._start

    def counted(self):
        starts.append(self)
        start(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Subprocess, "_start", counted)
        code = main(
            [
                "sweep",
                "--device",
                "cpu",
                "--preset",
                "smoke",
                "--impls",
                "naive,tiled,xformers",
                "--seq-len",
                "64",
                "--profile",
                "tiled,fwd_bwd",
                "--results-dir",
                str(tmp / "res"),
                "--reports-dir",
                str(tmp / "rep"),
                "--run-id",
                "p",
                "--no-progress",
            ]
        )
    assert code == 0
    return tmp / "res" / "p", tmp / "rep" / "p", len(starts)


def test_env_json_has_every_field_blank_where_it_does_not_apply(profiled_run):
    run_dir, *_ = profiled_run
    env = json.loads((run_dir / "env.json").read_text())
    assert set(ENV_FIELDS) <= set(env)
    for gpu_only in ("gpu_name", "gpu_sm_count", "gpu_l2_mib", "driver", "cudnn"):
        assert env[gpu_only] is None
    assert env["cpu_name"] and env["torch"] and env["seed"] == 0
    # the versions of what the run's impls require: xformers (installed by the test extra;
    # the GPU image has none)
    pytest.importorskip("xformers")
    assert env["packages"] == {"xformers": importlib.metadata.version("xformers")}
    assert env["xformers_kernels"]["version"] == env["packages"]["xformers"]


def test_the_device_questions_and_the_rows_share_one_worker_process(profiled_run):
    """A worker started from a thread that then ends is killed with it (PDEATHSIG): the
    device's questions are asked from the thread that runs the rows, so a sweep starts one
    worker process, not two."""
    *_, starts = profiled_run
    assert starts == 1


def test_ceilings_are_measured_and_every_ok_row_gets_pct_peak(profiled_run):
    run_dir, *_ = profiled_run
    ceilings = json.loads((run_dir / "env.json").read_text())["ceilings"]
    assert ceilings["matmul_tflops"]["float32"] > 0 and ceilings["copy_gb_s"] > 0
    df = read_results(run_dir)
    ok = df[df["status"] == "ok"]
    # the larger of the compute share and the memory share: the roof the intensity meets
    compute = 100 * ok["tflops"] / ceilings["matmul_tflops"]["float32"]
    memory = 100 * ok["gbps"] / ceilings["copy_gb_s"]
    expected = compute.where(compute >= memory, memory)
    assert len(ok) and ((ok["pct_peak"] - expected).abs() <= 1e-9 * expected).all()
    assert df[df["status"] != "ok"]["pct_peak"].isna().all()
    # bound: blank when every try at the ceilings waited for the CPU, else set on every row
    assert ok["bound"].isna().all() if ceilings["contended"] else ok["bound"].notna().all()


def test_profile_writes_a_trace_per_selected_pair_and_the_op_table(profiled_run):
    run_dir, report_dir, _ = profiled_run
    traces = sorted((run_dir / "traces").glob("*.json"))
    assert [t.name.split("__")[0] for t in traces] == ["tiled", "tiled"]  # fwd_bwd, causal both
    trace = json.loads(traces[0].read_text())
    assert any(e.get("name") == "TiledAttentionBackward" for e in trace["traceEvents"])
    kernels = pd.read_csv(run_dir / "kernels.csv")
    assert set(kernels["impl"]) == {"tiled"} and set(kernels["mode"]) == {"fwd_bwd"}
    for _, g in kernels.groupby("causal"):
        assert g["share"].sum() == pytest.approx(1.0)
    assert (kernels["calls"] > 0).all() and (kernels["total_us"] >= 0).all()
    report = (report_dir / "report.md").read_text()
    assert "## What ran (--profile)" in report and "TiledAttentionBackward" in report


def test_cpu_rows_have_no_gpu_only_numbers(profiled_run):
    run_dir, *_ = profiled_run
    df = read_results(run_dir)
    for col in ("profiler_ms", "sm_clock_mhz", "power_w", "temp_c", "throttle"):
        assert df[col].isna().all(), col


def test_mismatch_note_fires_only_beyond_five_percent():
    assert profiling.mismatch_note(1.0, 0.96) is None
    assert profiling.mismatch_note(1.0, None) is None
    note = profiling.mismatch_note(1.0, 0.8)
    assert "+25%" in note and "gaps between kernels" in note  # time / profiler - 1
    assert "-20%" in profiling.mismatch_note(1.0, 1.25)


def test_clock_sampler_medians_and_throttle_reasons(monkeypatch):
    readings = iter(
        [(1980, 500_000, 60, 0), (1500, 700_000, 70, 0x4), (1700, 690_000, 71, 0x40)]
        + [(1700, 690_000, 71, 0)] * 1000
    )
    fake = types.SimpleNamespace(
        NVML_CLOCK_SM=0,
        NVML_TEMPERATURE_GPU=0,
        nvmlDeviceGetClockInfo=lambda h, kind: current[0],
        nvmlDeviceGetPowerUsage=lambda h: current[1],
        nvmlDeviceGetTemperature=lambda h, kind: current[2],
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: current[3],
    )
    current = next(readings)

    def advance(*_):
        nonlocal current
        current = next(readings)
        return True

    monkeypatch.setattr(clocks, "_nvml_handle", lambda device: (fake, "handle"))
    sampler = clocks.ClockSampler("cuda")
    sampler._stop.wait = advance  # one reading per loop turn, no sleeping
    sampler._stop.is_set = lambda: len(sampler.samples) >= 3
    sampler._loop()
    summary = sampler.summary()
    assert summary["sm_clock_mhz"] == 1700 and summary["power_w"] == 690.0
    assert summary["throttle"] == "sw_power_cap,hw_thermal"


def test_clock_sampler_is_blank_on_cpu():
    with clocks.ClockSampler("cpu") as sampler:
        pass
    assert sampler.summary() == {
        "sm_clock_mhz": None,
        "power_w": None,
        "temp_c": None,
        "throttle": None,
    }


def test_mismatch_note_compares_like_clocks_in_sm_cycles():
    # 6% apart in time, but the profiled calls ran 6% faster clocks: the same SM cycles
    assert profiling.mismatch_note(1.0, 0.94, 1700.0, 1808.0) is None
    assert "+6%" in profiling.mismatch_note(1.0, 0.94)  # clocks unknown: time against time
    assert "+6%" in profiling.mismatch_note(1.0, 0.94, 1800.0, 1800.0)  # the same clock
    note = profiling.mismatch_note(1.0, 0.8, 1980.0, 1755.0)
    assert "in SM cycles (clocks 1980 vs 1755 MHz)" in note and "+41%" in note


class _Clocks:
    """A ClockSampler that reads one SM clock (MHz) and notes when it was entered."""

    def __init__(self, mhz, events, name):
        self.mhz, self.events, self.name, self.samples = mhz, events, name, []

    def __call__(self, device):
        return self

    def __enter__(self):
        self.events.append(self.name)
        self.samples = [(self.mhz, 300.0, 60.0, 0)]
        return self

    def __exit__(self, *exc):
        pass


def test_the_profiled_calls_run_inside_the_last_timing_round_and_record_their_clock(
    monkeypatch,
):
    """The plumbing on the CPU: the profile comes right after the last round's samples (not
    after the memory pass), its clock is the row's profiler_sm_clock_mhz, and the cross-check
    compares the two in SM cycles."""
    from attnbench import plugins
    from attnbench.case import Case
    from attnbench.measure.timing import TimerConfig
    from attnbench.run.measuring import passes, row
    from attnbench.testing import run_row

    events = []
    interleaved = row.interleaved  # a CPU case: its impls' samples are taken in turns

    def timed(timers, index, failed):
        events.append(f"samples {index}")
        return interleaved(timers, index, failed)

    def profiled(fn, device_type, trace_path=None):
        events.append("profile")
        return profiling.Profile([], 0.5)

    def memory(fn, device_type):
        events.append("memory")
        return 1.0

    monkeypatch.setattr(row, "interleaved", timed)
    monkeypatch.setattr(row, "ClockSampler", _Clocks(1980.0, events, "timed clocks"))
    monkeypatch.setattr(passes, "ClockSampler", _Clocks(1755.0, events, "profile clocks"))
    monkeypatch.setattr(passes, "profile_fn", profiled)
    monkeypatch.setattr(passes, "peak_mem_mib", memory)
    settings = row.Settings(TimerConfig(rep_ms=1.0, min_samples=1, rounds=3), profile=())
    impl = plugins.discover(entry_points=False)["sdpa"]
    got = run_row(impl, Case(1, 2, 2, 16, 16, 16), settings=settings)
    assert got["status"] == "ok", got["reason"]
    rounds = [e for e in events if e.startswith("samples")]
    assert rounds == ["samples 0", "samples 1", "samples 2"]
    last = events.index("samples 2")  # then the profile's clocks, then the profile
    assert events[last + 1 : last + 3] == ["profile clocks", "profile"], events
    assert events.index("profile") < events.index("memory")
    assert got["sm_clock_mhz"] == 1980.0 and got["profiler_sm_clock_mhz"] == 1755.0
    assert got["profiler_ms"] == 0.5
    assert "in SM cycles (clocks 1980 vs 1755 MHz)" in got["reason"]
