"""What a call costs the host, against what it costs the GPU: is a row launch-bound?

A sweep's CUDA timer puts a pair of events around each call. When the host needs longer to
launch a call than the GPU needs to run it, the GPU waits between calls and ``time_ms`` is the
host's time, not the kernel's (on the first H100 lease, ``triton_flash`` took 0.114 ms at
B2 H16 N1024 D128 forward where ``triton_flash_fa2`` took 0.048). This measures both sides per
impl and case:

- host: seconds to launch ``--calls`` calls back to back while the GPU is held busy by a spin
  kernel queued first (``torch.cuda._sleep``), so that no launch waits for the GPU;
- GPU: the same calls timed with one pair of CUDA events after that spin kernel, so that they
  run back to back without a gap.

    python benchmarks/launch_cost.py [--impls triton_flash,triton_flash_fa2,sdpa_flash]
        [--seq-len 1024,4096] [--head-dim 128] [--mode fwd,bwd] [--calls 100]
        [--launch-paths cached,autotuner]

prints one line per (impl, case): host µs and GPU µs per call, and "launch-bound" where the
host's exceeds the GPU's. ``--launch-paths``: ``triton_flash`` once per launch path
(``triton_flash/tuning.py``: ``cached`` launches the compiled kernel directly after the first
tuned call, ``autotuner`` goes through Triton's autotuner and binder on every call), as
``triton_flash[cached]`` and so on, in the same call. It needs a CUDA GPU; elsewhere it says
so in one line (exit 2).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from attnbench import plugins  # noqa: E402
from attnbench.case import Case  # noqa: E402
from attnbench.run.measuring.call import Call  # noqa: E402
from attnbench.run.measuring.inputs import make_inputs  # noqa: E402

SPIN_CYCLES = 400_000_000  # about 0.2 s of a 2 GHz GPU: longer than launching the calls


def host_and_gpu_us(fn, calls: int) -> tuple[float, float]:
    """Per call: the host's launch time and the GPU's run time, in microseconds."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(SPIN_CYCLES)  # the GPU spins while the host launches every call
    start.record()
    began = time.perf_counter()
    for _ in range(calls):
        fn()
    host_s = time.perf_counter() - began
    end.record()
    torch.cuda.synchronize()
    return host_s / calls * 1e6, start.elapsed_time(end) / calls * 1e3


def cases(args) -> list[Case]:
    return [
        Case(
            batch=max(1, args.tokens // n),
            heads=args.heads,
            kv_heads=args.heads,
            seq_q=n,
            seq_kv=n,
            head_dim=args.head_dim,
            dtype="bfloat16",
            causal=causal,
            device="cuda",
            mode=mode,
        )
        for mode in args.mode.split(",")
        for causal in (False, True)
        for n in (int(s) for s in args.seq_len.split(","))
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--impls", default="triton_flash,triton_flash_fa2,sdpa_flash,sdpa_cudnn")
    p.add_argument("--seq-len", default="1024,4096")
    p.add_argument("--tokens", type=int, default=2048, help="batch = tokens / N")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--mode", default="fwd,bwd")
    p.add_argument("--calls", type=int, default=100, help="calls launched per measurement")
    p.add_argument("--launch-paths", default="", help="triton_flash's, e.g. cached,autotuner")
    args = p.parse_args()
    paths = [x for x in args.launch_paths.split(",") if x]
    if paths:
        from attnbench.impls.triton_flash.tuning import LAUNCH_PATHS  # imports triton

        if any(x not in LAUNCH_PATHS for x in paths):
            print(f"launch_cost.py: --launch-paths {args.launch_paths}: each one of "
                  f"{', '.join(LAUNCH_PATHS)}", file=sys.stderr)  # fmt: skip
            return 2
    if not torch.cuda.is_available():
        print("launch_cost.py: needs a CUDA GPU; none is visible to torch", file=sys.stderr)
        return 2
    impls = plugins.discover()
    unknown = [n for n in args.impls.split(",") if n not in impls]
    if unknown:
        print(f"launch_cost.py: unknown impl(s) {', '.join(unknown)}", file=sys.stderr)
        return 2
    print(f"{'impl':22} {'case':40} {'host us':>9} {'GPU us':>9}")
    names = [
        (n, p)
        for n in args.impls.split(",")
        for p in (paths if n == "triton_flash" else [""]) or [""]
    ]
    for case in cases(args):
        inputs = make_inputs(case, 0)
        for name, path in names:
            impl = impls[name]
            if path:  # the module reads it on every call
                from attnbench.impls.triton_flash import tuning

                tuning.LAUNCH_PATH = path
                name = f"{name}[{path}]"
            why = "; ".join(impl.reasons(case))
            if not why:
                try:
                    call = Call.prepare(impl, case, inputs)
                    call.check()
                    host, gpu = host_and_gpu_us(call.timed_fn(), args.calls)
                except Exception as exc:  # noqa: BLE001 (one impl's failure is its line)
                    why = f"{type(exc).__name__}: {exc}"[:120]
            if why:
                print(f"{name:22} {case.label():40} {'–':>9} {'–':>9}  {why}")
                continue
            bound = "  launch-bound" if host > gpu else ""
            print(f"{name:22} {case.label():40} {host:9.1f} {gpu:9.1f}{bound}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
