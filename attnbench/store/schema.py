"""The row schema, defined here once: every column of results.csv with its pandas dtype and
meaning (docs/columns.md is generated from it), the statuses, and the row's identity. The case
columns come from the case dimensions (dims.py); this module places them in the CSV's order."""

from __future__ import annotations

from attnbench.dims import DIM, DIMS, SPEC_COLUMNS


def _case(*names: str) -> dict[str, tuple[str, str]]:
    """The columns of case dimensions, in the order given (the CSV's)."""
    return {n: (DIM[n].dtype, DIM[n].meaning) for n in names}


LOST = "lost"  # the row's executor was lost (its actor, node or head), not the impl's doing
STATUSES = ("ok", "unsupported", "oom", "error", "timeout", "crash", LOST)
RETRIED = (LOST,)  # the statuses whose rows --resume runs again (--retry adds others)

# name -> (pandas dtype, meaning). The order here is the CSV's column order.
COLUMNS: dict[str, tuple[str, str]] = {
    "run_id": ("string", "the sweep this row belongs to"),
    "impl": ("string", "registered impl name"),
    **_case(
        "mode",
        "batch",
        "heads",
        "kv_heads",
        "seq_q",
        "seq_kv",
        "head_dim",
        "dtype",
        "causal",
        "device",
    ),
    "status": ("string", "one of " + ", ".join(STATUSES)),
    "reason": ("string", "why the status is not ok, or why agrees is false"),
    "time_ms": ("Float64", "median time of one call, milliseconds"),
    "time_ms_p20": ("Float64", "20th percentile of the samples"),
    "time_ms_p80": ("Float64", "80th percentile of the samples"),
    "samples": ("Int64", "number of timing samples behind the median"),
    "rounds": (
        "Int64",
        "number of interleaved rounds the samples were taken in (the case's impls, and the "
        "speed anchor, timed round-robin, the order rotated each round: docs/method.md)",
    ),
    "speedup": (
        "Float64",
        "the run's baseline impl's time / this impl's time, paired by round: the median of "
        "the per-round ratios (> 1: faster than the baseline); blank for the baseline itself "
        "and where the baseline has no ok row in the case",
    ),
    "speedup_lo": ("Float64", "lower bound of speedup's 95% bootstrap interval over rounds"),
    "speedup_hi": ("Float64", "upper bound of speedup's 95% bootstrap interval over rounds"),
    "speed_compute": (
        "Float64",
        "the machine's compute speed while the case was timed, relative to the run's first "
        "case: the speed anchor's matmul time then / now (< 1: slower, e.g. throttled)",
    ),
    "speed_memory": (
        "Float64",
        "the machine's memory speed while the case was timed, relative to the run's first "
        "case: the speed anchor's copy time then / now",
    ),
    "tflops": ("Float64", "case FLOPs (unmasked pairs only) / time_ms, 1e12 FLOP/s"),
    "peak_mem_mib": ("Float64", "peak memory above what was allocated before the call, MiB"),
    "max_abs_err": (
        "Float64",
        "|x - ref| at the element nearest its own bound, of the checked tensor (out; dq, dk, "
        "dv with backward) nearest its bound (docs/method.md: the agreement rule)",
    ),
    "rel_err": (
        "Float64",
        "||x - ref||_2 / ||ref||_2 of the tensor nearest its bound; blank when every "
        "reference is zero (reason says which and how it was judged); under 256 elements "
        "its bound is the floor, half of ||ref||",
    ),
    "agrees": (
        "boolean",
        "every checked tensor is finite and within its bounds (docs/method.md: the "
        "agreement rule; a failed bias check, bfloat16 only, is named in `reason`)",
    ),
    "err_bound": ("Float64", "the bound that rel_err was held to"),
    "max_abs_bound": ("Float64", "the bound that max_abs_err was held to"),
    "flops": ("Float64", "FLOPs of the timed work"),
    "gbps": (
        "Float64",
        "the fewest bytes the timed work must move (q, k, v read, out written; with backward "
        "the gradients too: docs/method.md) / time_ms, 1e9 B/s",
    ),
    "page_faults": (
        "Float64",
        "CPU: minor page faults per timed call (getrusage); 10 or more means calls paged "
        "memory in (the heap grew, or the allocator handed memory back between calls), and "
        "reason says so; blank on CUDA",
    ),
    "cpu_share": (
        "Float64",
        "CPU: the process's CPU time over the timed loop / (wall time x torch threads); 1 / "
        "threads (one busy thread) to 1 (all busy) on an idle machine, less when it waited "
        "for a CPU; blank on CUDA (docs/method.md: contention)",
    ),
    "contended": (
        "boolean",
        "CPU: the timed threads waited for a CPU (run-queue delay over 10% of their time; "
        "without it, cpu_share x threads under 0.8): another process was using the CPU, so "
        "time_ms is inflated, and reason says so; blank on CUDA",
    ),
    "seed": ("Int64", "seed of the inputs"),
    **_case("mask", *SPEC_COLUMNS),  # the mask and the columns of its spec
    "work_flops": (
        "Float64",
        "FLOPs of the (query, key) pairs the impl's computation covers, masked ones "
        "included, as the impl declares it (its tiles or call shapes; docs/method.md: "
        "wasted work); blank where it declares none. flops / work_flops is the useful share",
    ),
    **_case("level", "causal_align", "model", "phase", "score_mod"),
    "backend": (
        "string",
        "SDPA backend that ran (flash, efficient, cudnn, math); xformers: the operators it "
        "dispatched to (pytorch:flash, pytorch:efficient when they were PyTorch's own kernels, "
        "xformers:<operator> for its own); blank for other impls",
    ),
    "compile_ms": (
        "Float64",
        "torch.compile impls: first call's wall time minus a steady "
        "call's, ms; never part of time_ms",
    ),
    "recompiled": (
        "boolean",
        "torch.compile recompiled during the timing pass (time_ms then includes compilation)",
    ),
    "pct_peak": (
        "Float64",
        "percentage of the roofline: the larger of tflops over the matmul rate measured for "
        "this dtype and gbps over the measured copy bandwidth (at the start of the run, on "
        "the device that ran the row: env.json ceilings, or devices with several)",
    ),
    "bound": (
        "string",
        "the ceiling that bounds the row by its arithmetic intensity (flops per byte moved): "
        "compute (matmul rate) or memory (copy bandwidth) where the intensity is 2x or more "
        "above or below the ridge point, balanced within 2x of it; blank without measured "
        "ceilings or when every try at them waited for the CPU (env.json ceilings.contended)",
    ),
    "profiler_ms": (
        "Float64",
        "CUDA: the profiler's summed kernel time per call, to "
        "cross-check time_ms (reason notes a >5% difference); on the first and every tenth "
        "row of each impl, every row with --profile; blank on the others",
    ),
    "sm_clock_mhz": ("Float64", "CUDA: median SM clock while timing (NVML)"),
    "profiler_sm_clock_mhz": (
        "Float64",
        "CUDA: median SM clock while the profiler's calls ran (NVML), inside the last timing "
        "round right after its samples; blank where profiler_ms is. The cross-check compares "
        "like with like: clocks more than 1% apart are compared in SM cycles (time x clock)",
    ),
    "power_w": ("Float64", "CUDA: median board power while timing, W (NVML)"),
    "temp_c": ("Float64", "CUDA: median GPU temperature while timing, C (NVML)"),
    "throttle": (
        "string",
        "CUDA: clock-slowdown reasons NVML reported while timing "
        "(none, or e.g. sw_power_cap,hw_thermal)",
    ),
    "host": ("string", "host name of the machine that ran the row"),
    "device_name": (
        "string",
        "the device that ran the row: the GPU's name on CUDA, else the CPU model "
        "(env.json devices holds its versions and ceilings)",
    ),
    "node": ("string", "with --executor ray: the Ray node id of the node that ran the row"),
    "actor": ("Int64", "with --executor ray: the number of the actor that ran the row (0, 1, ...)"),
    "gpu_index": (
        "Int64",
        "CUDA: the index of the GPU that ran the row on its machine (as nvidia-smi numbers it)",
    ),
    "gpu_uuid": ("string", "CUDA: the UUID of the GPU that ran the row (GPU-...)"),
    "cuda_graph": (
        "boolean",
        "time_ms is the replay of a CUDA graph of the timed call (--cuda-graph: CUDA, mode "
        "fwd), which leaves the host's launch cost out; false: calls launched one by one",
    ),
    "precision_ratio": (
        "Float64",
        "bfloat16 and float16, level op, agreeing rows: out's rms error against the float64 "
        "reference over the elements whose output dominates its magnitude, over that of a "
        "kernel that accumulates in float32, on the same inputs (docs/method.md: precision); "
        "about 1 for a flash kernel, blank in float32, on disagreeing rows and under 64 such "
        "elements",
    ),
    "precision_low": (
        "boolean",
        "precision_ratio is over its calibrated limit: precision below an fp32-accumulating "
        "kernel, a flag apart from agrees; reason says so, with the figure and its count",
    ),
}
METRICS = (  # blank in every row that is not ok
    "flops",
    "gbps",
    "work_flops",
    "time_ms",
    "time_ms_p20",
    "time_ms_p80",
    "samples",
    "rounds",
    "speedup",
    "speedup_lo",
    "speedup_hi",
    "speed_compute",
    "speed_memory",
    "tflops",
    "peak_mem_mib",
    "max_abs_err",
    "rel_err",
    "agrees",
    "err_bound",
    "max_abs_bound",
    "precision_ratio",
    "precision_low",
    "page_faults",
    "cpu_share",
    "contended",
    "backend",
    "compile_ms",
    "recompiled",
    "pct_peak",
    "bound",
    "profiler_ms",
    "sm_clock_mhz",
    "profiler_sm_clock_mhz",
    "power_w",
    "temp_c",
    "throttle",
    "cuda_graph",
)
CASE_KEY = ("impl", *(d.name for d in DIMS))  # a row's identity: its impl and its case
# key columns added after the first runs, and what rows written before them hold (None: blank)
LATER_KEYS = {d.name: d.old for d in DIMS if d.later}
SAMPLE_COLUMNS = ("run_id", *CASE_KEY, "sample", "round", "time_ms")  # round: blank in old runs
# the speed anchor: one line per sample, with its case's key (no impl) and the seconds since
# the run's start (env.json anchor.start_unix)
ANCHOR_COLUMNS = ("run_id", *CASE_KEY[1:], "round", "resource", "time_ms", "t_s")
# --profile: one line per (row, kernel or op), the device's time summed over PROFILED_CALLS
KERNEL_COLUMNS = ("run_id", *CASE_KEY, "kernel", "calls", "total_us", "share")


def columns_markdown() -> str:
    """The table of docs/columns.md, made from COLUMNS (a test keeps the two the same)."""
    lines = ["| column | meaning |", "| --- | --- |"]
    lines += [f"| `{name}` | {meaning} |" for name, (_, meaning) in COLUMNS.items()]
    return "\n".join(lines)
