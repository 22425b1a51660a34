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
        **case.columns(),
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
        **case.columns(),
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


ANCHOR_MS = {"compute": 2.0, "memory": 0.5}  # the synthetic speed anchor's times at speed 1


def timed_in_rounds(
    rows, rounds=7, slowness=None, noise=0.02, seed=0, baseline="sdpa", per_round=3, case_noise=0
):
    """The rows as if each case's impls and the speed anchor were timed in ``rounds``
    interleaved rounds, ``per_round`` samples each, on a machine whose time per unit of work
    at the run's fraction t (0 to 1, one case after another) is ``slowness(t)`` (default 1),
    and whose speed for a case's impls (not the anchor) is off by a lognormal factor of sigma
    ``case_noise``, the same for the whole case: returns (rows with their medians, rounds,
    speedups and speeds; samples; anchor lines)."""
    from attnbench.measure import paired
    from attnbench.store.schema import CASE_KEY

    slowness = slowness or (lambda t: 1.0)
    rng = np.random.default_rng(seed)
    case_cols = [c for c in CASE_KEY if c != "impl"]
    cases = list(dict.fromkeys(tuple(r.get(c) for c in case_cols) for r in rows))
    samples, anchor, per_row, all_times = [], [], {}, {}
    for i, case in enumerate(cases):
        mine = [r for r in rows if tuple(r.get(c) for c in case_cols) == case]
        off = rng.lognormal(0, case_noise) if case_noise else 1.0
        for rnd in range(rounds):
            t = (i + rnd / rounds) / len(cases)
            for resource, ms in ANCHOR_MS.items():
                times = [ms * slowness(t) * rng.lognormal(0, noise) for _ in range(per_round)]
                anchor += [
                    {
                        **dict(zip(case_cols, case)),
                        "round": rnd,
                        "resource": resource,
                        "time_ms": v,
                        "t_s": 10.0 * t,
                    }
                    for v in times
                ]
            for r in mine:
                if r["status"] != "ok":
                    continue
                times = [
                    r["time_ms"] * off * slowness(t) * rng.lognormal(0, noise)
                    for _ in range(per_round)
                ]
                per_row.setdefault(id(r), {})[rnd] = float(np.median(times))
                all_times.setdefault(id(r), []).extend(times)
                samples += [
                    {**r, "sample": len(samples), "round": rnd, "time_ms": v} for v in times
                ]
    out = []
    for original in rows:
        r = dict(original)
        if r["status"] == "ok":
            mine = all_times[id(original)]
            r.update(
                time_ms=float(np.median(mine)),
                time_ms_p20=float(np.percentile(mine, 20)),
                time_ms_p80=float(np.percentile(mine, 80)),
                samples=len(mine),
                rounds=rounds,
            )
            base = next(
                (
                    b
                    for b in rows
                    if b["impl"] == baseline
                    and b["status"] == "ok"
                    and all(b.get(c) == r.get(c) for c in case_cols)
                ),
                None,
            )
            if base is not None and r["impl"] != baseline:
                ratio = paired.ratio(per_row[id(base)], per_row[id(original)])
                r.update(speedup=ratio.value, speedup_lo=ratio.lo, speedup_hi=ratio.hi)
        out.append(r)
    return out, samples, anchor


def write_timing(run_dir: Path, samples, anchor) -> None:
    """samples.csv (through the real writer) and anchor.csv of a synthetic run."""
    import csv

    from attnbench.report.analyse.rounds import anchor_path
    from attnbench.store.results import samples_writer

    with samples_writer(run_dir) as w:
        w.write(samples)
    if anchor:
        with open(anchor_path(run_dir), "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(anchor[0]))
            writer.writeheader()
            writer.writerows(anchor)


def write_rounds_run(root: Path, run_id: str, rows, env_data=None, anchor=True, **timing):
    """write_run for rows timed in rounds (timed_in_rounds' options), with samples.csv and,
    unless ``anchor`` is False, anchor.csv."""
    rows, samples, anchor_lines = timed_in_rounds(rows, **timing)
    run_dir = write_run(root, run_id, rows, env_data)
    write_timing(run_dir, samples, anchor_lines if anchor else [])
    return run_dir
