"""Compile the triton_flash_fa2 kernels for a GPU architecture without a GPU and report each
config's shared memory, registers and spill bytes (from the cubin via cuobjdump).

This checks that the kernels compile for sm80/sm90 (which the CPU interpreter never does) and
grounds the autotune pruning in attnbench/impls/triton_flash_fa2/kernel.py. Arguments are assumed
16-byte aligned (as Triton specializes them at launch), so the loops get pipelined as on a GPU.
Needs TRITON_INTERPRET unset.

    python -m attnbench.impls.triton_flash_fa2.compile_check --arch 90 --dtype bf16 --head-dims 128
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from attnbench.impls.triton_flash_fa2 import kernel as tf

POINTERS = ("Q", "K", "V", "O", "DO", "DQ", "DK", "DV")
FLOATS = ("qk_scale", "sm_scale")
TRITON_TYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def _signature(fn, dtype: str, consts: dict) -> tuple[dict, dict]:
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in consts:
            sig[name] = "constexpr"
        elif name in POINTERS or name in ("LSE", "DELTA"):
            sig[name] = "*fp32" if name in ("LSE", "DELTA") else f"*{dtype}"
        else:
            sig[name] = "fp32" if name in FLOATS else "i32"
        if sig[name].startswith("*") or name.startswith("s_"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


def compile_config(
    kind: str,
    arch: int,
    dtype: str,
    d: int,
    m: int,
    n: int,
    warps: int,
    stages: int,
    causal: bool = True,
) -> dict:
    fn = tf._KERNELS[kind]
    consts = dict(HEAD_DIM=d, CAUSAL=causal, IEEE=dtype == "fp32", BLOCK_M=m, BLOCK_N=n)
    sig, attrs = _signature(fn, dtype, consts)
    kernel = triton.compile(
        ASTSource(fn, sig, consts, attrs=attrs),
        target=GPUTarget("cuda", arch, 32),
        options=dict(num_warps=warps, num_stages=stages),
    )
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    regs = spill = None
    if cuobjdump.exists():
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(kernel.asm["cubin"])
            f.flush()
            usage = subprocess.run(
                [str(cuobjdump), "--dump-resource-usage", f.name], capture_output=True, text=True
            ).stdout
        found = re.search(r"REG:(\d+) STACK:(\d+)", usage)
        if found:
            regs, spill = int(found.group(1)), int(found.group(2))
    return dict(
        kind=kind,
        arch=arch,
        dtype=dtype,
        head_dim=d,
        tiles=(m, n, warps, stages),
        smem=kernel.metadata.shared,
        smem_estimate=tf._smem_bytes(kind, m, n, stages, d, TRITON_TYPES[dtype].itemsize),
        regs=regs,
        spill_bytes=spill,
    )


def pruned_configs(kind: str, arch: int, dtype: str, d: int, max_smem: int) -> list[tuple]:
    """The configs the autotuner would try on ``arch`` (as tuples)."""
    old = tf._is_hopper, tf._max_smem
    tf._is_hopper, tf._max_smem = (lambda: arch >= 90), (lambda: max_smem)
    try:
        q = torch.empty(1, dtype=TRITON_TYPES[dtype])
        kept = tf._prune(kind)(tf._configs(kind), {"Q": q}, HEAD_DIM=d)
    finally:
        tf._is_hopper, tf._max_smem = old
    return [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) for c in kept]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", type=int, default=90, help="80 (A100) or 90 (H100)")
    p.add_argument("--dtype", choices=tuple(TRITON_TYPES), default="bf16")
    p.add_argument("--head-dims", default="64,128,256")
    p.add_argument("--kinds", default="fwd,dq,dkdv")
    p.add_argument("--first", action="store_true", help="only the first config of each")
    args = p.parse_args(argv)
    if tf.interpreting():
        print("compile_check: unset TRITON_INTERPRET", file=sys.stderr)
        return 2
    max_smem = 232448 if args.arch >= 90 else 166912  # opt-in per block: H100, A100
    failed = 0
    for kind in args.kinds.split(","):
        for d in map(int, args.head_dims.split(",")):
            configs = pruned_configs(kind, args.arch, args.dtype, d, max_smem)
            for cfg in configs[:1] if args.first else configs:
                try:
                    r = compile_config(kind, args.arch, args.dtype, d, *cfg)
                except Exception as exc:  # noqa: BLE001
                    failed += 1
                    print(
                        f"{kind} sm{args.arch} {args.dtype} D={d} {cfg}: FAILED "
                        f"{type(exc).__name__}: {str(exc)[:200]}",
                        flush=True,
                    )
                    continue
                print(
                    f"{kind} sm{args.arch} {args.dtype} D={d} {cfg}: smem {r['smem']} "
                    f"(estimate {r['smem_estimate']}) regs {r['regs']} "
                    f"spills {r['spill_bytes']}",
                    flush=True,
                )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
