"""Synthetic sweep output with the real schema (written through results.row_writer)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from attnbench.case import Case
from attnbench.store.results import row_writer

SMOKE_SEQS = (64, 128, 256, 512, 1024, 2048)


def ok_row(
    run_id,
    impl,
    case: Case,
    time_ms,
    mem_mib,
    rel_err=1e-6,
    bound=1e-5,
    agrees=True,
    reason=None,
    flops=None,  # a kind with a drawn layout counts its pairs from the draw: give them
):
    flops = case.flops() if flops is None else flops
    return {
        "run_id": run_id,
        "impl": impl,
        **case.as_dict(),
        "status": "ok",
        "reason": reason,
        "time_ms": time_ms,
        "time_ms_p20": time_ms * 0.97,
        "time_ms_p80": time_ms * 1.04,
        "samples": 20,
        "tflops": flops / (time_ms * 1e-3) / 1e12,
        "peak_mem_mib": mem_mib,
        "max_abs_err": rel_err * 3,
        "rel_err": rel_err,
        "agrees": agrees,
        "err_bound": bound,
        "flops": flops,
        "seed": 0,
    }


def failed_row(run_id, impl, case: Case, status, reason):
    return {
        "run_id": run_id,
        "impl": impl,
        **case.as_dict(),
        "status": status,
        "reason": reason,
        "flops": case.flops(),
        "seed": 0,
    }


def env(device="cpu", load_avg_1m=0.1):
    return {
        "time_utc": "2025-01-01T00:00:00+00:00",
        "command": "python scripts/sweep.py --preset smoke --run-id synth",
        "seed": 0,
        "device": device,
        "gpu_name": None,
        "gpu_sm_count": None,
        "gpu_mem_gib": None,
        "cpu_name": "Synthetic CPU @ 3.0GHz",
        "baseline": "sdpa",
        "impls": {"sdpa": {"source": "attnbench.impls.sdpa", "baseline": True, "color": None}},
        "cpu_threads": 2,
        "python": "3.11.7",
        "platform": "Linux",
        "torch": "2.13.0+cpu",
        "cuda": None,
        "cudnn": None,
        "triton": None,
        "xformers": None,
        "git_sha": "0" * 40,
        "git_dirty": False,
        "cpu_count": 2,
        "load_avg_1m": load_avg_1m,
    }


def smoke_rows(run_id="synth", seqs=SMOKE_SEQS, speed=1.0, seed=0):
    """A smoke-like sweep: naive ~N^2 memory (oom at the largest N), tiled ~N memory,
    sdpa fastest, xformers/triton_flash unsupported on CPU, tiled disagreeing on fwd_bwd
    causal at the largest N."""
    rng = np.random.default_rng(seed)
    rows = []
    for mode in ("fwd", "fwd_bwd"):
        for causal in (False, True):
            for n in seqs:
                case = Case(
                    batch=1,
                    heads=4,
                    kv_heads=4,
                    seq_q=n,
                    seq_kv=n,
                    head_dim=64,
                    dtype="float32",
                    causal=causal,
                    mode=mode,
                    device="cpu",
                )
                work = case.flops() / 1e9
                for impl, cost, over, mem in (
                    ("naive", 2.0, 0.05, lambda n: 16e-6 * n * n),
                    ("sdpa", 1.0, 0.02, lambda n: 0.002 * n),
                    ("tiled", 1.5, 0.3, lambda n: 0.003 * n),
                ):
                    if impl == "naive" and n == seqs[-1]:
                        rows.append(
                            failed_row(
                                run_id,
                                impl,
                                case,
                                "oom",
                                "out of memory: tried to allocate 256 MiB",
                            )
                        )
                        continue
                    t = (over + cost * work) * speed * float(rng.lognormal(0, 0.02))
                    agrees = not (
                        impl == "tiled" and mode == "fwd_bwd" and causal and n == seqs[-1]
                    )
                    rows.append(
                        ok_row(
                            run_id,
                            impl,
                            case,
                            t,
                            mem(n) * float(rng.lognormal(0, 0.01)),
                            rel_err=2e-6 if agrees else 3e-3,
                            bound=1e-5,
                            agrees=agrees,
                            reason=None if agrees else "rel_err 3e-03 > bound 1e-05 on dq",
                        )
                    )
                rows.append(
                    failed_row(
                        run_id, "xformers", case, "unsupported", "device=cpu (supported: cuda)"
                    )
                )
                rows.append(
                    failed_row(
                        run_id, "triton_flash", case, "unsupported", "device=cpu (supported: cuda)"
                    )
                )
    return rows


def write_run(root: Path, run_id: str, rows, env_data=None) -> Path:
    run_dir = Path(root) / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    with row_writer(run_dir) as w:
        w.write(rows)
    if env_data is not False:
        (run_dir / "env.json").write_text(json.dumps(env_data or env()))
    return run_dir
