"""Offline compile report for the ``triton_flash`` kernels: no GPU needed.

Compiles each kept config (``tuning.CONFIGS``) of the forward and backward kernels for sm90
and sm80 with the Triton this runs under, and reads from the result: registers and spill
(stack) bytes (cuobjdump on the cubin), shared memory (kernel metadata), and in the PTX the
counts of ``wgmma`` and ``mma.sync`` instructions, TMA loads (``cp.async.bulk.tensor`` from
global to shared) and stores, other global vector loads, and ``wgmma.wait_group`` with a
nonzero count (a matmul left in flight while other work runs). Arguments are assumed
16-byte aligned, as Triton specializes them at launch. Needs TRITON_INTERPRET unset.

Goal for sm90 configs: no spills, no mma.sync, TMA for every Q/K/V load (``goal_failures``).

``--lab``: the kernel lab's variants (``tuning.LAB``) instead, full and causal, for sm90, with
the warps as launched (12 where warp specialization took: a producer warpgroup beside two
consumers), ``setmaxnreg`` and TMA reduces; their check (``lab_failures``): shared memory
within the limit, 12 warps for every WS variant, a TMA reduce for every DQ_TMA one.

    python -m attnbench.impls.triton_flash.compile_report                # print Markdown
    python -m attnbench.impls.triton_flash.compile_report \\
        --update benchmarks/triton_flash_compile_report.md              # replace this
                                                                        # version's section
    python -m attnbench.impls.triton_flash.compile_report --lab \\
        --update benchmarks/triton_flash_compile_report.md              # its lab section
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from attnbench.impls.triton_flash import tuning
from attnbench.impls.triton_flash.kernel import head_pad

POINTERS = {"Q", "K", "V", "O", "DO", "DK", "DV"}
FP32_POINTERS = {"LSE", "DELTA", "DQ"}
INT_POINTERS = {"CU_Q", "CU_K"}
FLOATS = {"qk_scale", "sm_scale"}
# descriptor load sites in the source: fwd q + (k, v) per loop (+ k prologue when pipelined);
# bwd k, v + (q, dO) per query loop
MIN_TMA_LOADS = {"fwd": 5, "bwd": 6}
# a dim per padded width; 80 and 192 show non-power-of-two dims on sm90
HEAD_DIMS = {90: (16, 32, 64, 80, 128, 192, 256), 80: (16, 32, 64, 128, 256)}

MAX_SMEM = {90: 232448, 80: 166912}  # opt-in shared memory per block: H100, A100
_PTX_COUNTS = {
    "wgmma": r"\bwgmma\.mma_async\b",
    "mma_sync": r"\bmma\.sync\b",
    "tma_loads": r"\bcp\.async\.bulk\.tensor\.\dd\.shared::\w+\.global\b",
    "tma_stores": r"\bcp\.async\.bulk\.tensor\.\dd\.global\.shared::\w+\b",
    "ld_global_vec": r"\bld\.global(?:\.\w+)*\.v[248]\b",
    "wgmma_wait_inflight": r"\bwgmma\.wait_group\.sync\.aligned\s+[1-9]",
    "tma_reduce": r"\bcp\.reduce\.async\.bulk\.tensor\b",
    "setmaxnreg": r"\bsetmaxnreg\.\w+",
}


def launched_warps(ptx: str) -> int | None:
    """Warps per program as launched (the PTX's thread count / 32): ``num_warps``, or more
    when Triton warp-specialized the kernel (a producer warpgroup beside the consumers)."""
    found = re.search(r"\.(?:reqntid|maxntid)\s+(\d+)", ptx)
    return int(found.group(1)) // 32 if found else None


def _signature(fn, dtype: str, consts: dict) -> tuple[dict, dict]:
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in consts:
            sig[name] = "constexpr"
        elif name in POINTERS:
            sig[name] = f"*{dtype}"
        elif name in FP32_POINTERS:
            sig[name] = "*fp32"
        elif name in INT_POINTERS:
            sig[name] = "*i32"
        else:
            sig[name] = "fp32" if name in FLOATS else "i32"
        if sig[name].startswith("*") or name.startswith("s_"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


def _resources(cubin: bytes) -> tuple[int | None, int | None]:
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not cuobjdump.exists():
        return None, None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run(
            [str(cuobjdump), "--dump-resource-usage", f.name], capture_output=True, text=True
        ).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    return (int(found.group(1)), int(found.group(2))) if found else (None, None)


def compile_one(kind: str, arch: int, dtype: str, head_dim: int, cfg: tuple,
                causal: bool = True) -> dict:  # fmt: skip
    """Compile one config; the returned row holds the resources and PTX counts."""
    fn = tuning._KERNELS[kind]
    meta, warps, stages = tuning.meta_of(kind, cfg)
    consts = dict(
        HEAD_DIM=head_dim,
        HEAD_PAD=head_pad(head_dim),
        CAUSAL=causal,
        ALIGN_END=False,
        VARLEN=False,
        IEEE=dtype == "fp32",
        **meta,
    )
    sig, attrs = _signature(fn, dtype, consts)
    t0 = time.perf_counter()
    compiled = triton.compile(
        ASTSource(fn, sig, consts, attrs=attrs),
        target=GPUTarget("cuda", arch, 32),
        options=dict(num_warps=warps, num_stages=stages),
    )
    ptx = compiled.asm["ptx"]
    regs, spill = _resources(compiled.asm["cubin"])
    row = dict(kind=kind, arch=arch, dtype=dtype, head_dim=head_dim, config=cfg, regs=regs)
    row.update(spill_bytes=spill, smem=compiled.metadata.shared, warps=launched_warps(ptx))
    row.update({name: len(re.findall(rx, ptx)) for name, rx in _PTX_COUNTS.items()})
    row["compile_s"] = round(time.perf_counter() - t0, 1)
    return row


def goal_failures(row: dict) -> list[str]:
    """What keeps an sm90 row from the goal: spills, mma.sync, Q/K/V not all loaded by TMA."""
    bad = []
    if row["smem"] > MAX_SMEM[row["arch"]]:
        bad.append(f"shared memory {row['smem']} > {MAX_SMEM[row['arch']]}")
    if row["spill_bytes"]:
        bad.append(f"{row['spill_bytes']} B spilled")
    if row["arch"] >= 90:
        if row["mma_sync"]:
            bad.append(f"{row['mma_sync']} mma.sync")
        if row["tma_loads"] < MIN_TMA_LOADS[row["kind"]] or row["ld_global_vec"]:
            bad.append(f"{row['tma_loads']} TMA loads, {row['ld_global_vec']} vector ld.global")
    return bad


def rows(archs=(90, 80), kinds=("fwd", "bwd"), dtype="bf16", head_dims=None, first=False):
    """Compile every kept config; yields one row (or an error row) per config."""
    for arch in archs:
        for kind in kinds:
            for d in head_dims or HEAD_DIMS[arch]:
                configs = tuning.CONFIGS[arch][kind][head_pad(d)]
                for cfg in configs[:1] if first else configs:
                    try:
                        yield compile_one(kind, arch, dtype, d, cfg)
                    except Exception as exc:  # noqa: BLE001 - a failed compile is a row
                        yield dict(kind=kind, arch=arch, dtype=dtype, head_dim=d, config=cfg,
                                   error=f"{type(exc).__name__}: {str(exc)[:160]}")  # fmt: skip


_COLUMNS = ("kind", "arch", "head_dim", "config", "regs", "spill_bytes", "smem", "wgmma",
            "mma_sync", "tma_loads", "tma_stores", "ld_global_vec",
            "wgmma_wait_inflight", "warps", "tma_reduce")  # fmt: skip


def lab_failures(row: dict) -> list[str]:
    """What keeps a lab variant's row from its check: no compile, shared memory over the
    limit, a WS variant not warp-specialized (12 warps), a DQ_TMA one with no TMA reduce."""
    if "error" in row:
        return [row["error"]]
    meta = tuning.meta_of(row["kind"], row["config"])[0]
    bad = []
    if row["smem"] > MAX_SMEM[row["arch"]]:
        bad.append(f"shared memory {row['smem']} > {MAX_SMEM[row['arch']]}")
    if meta.get("WS") and row["warps"] != 12:
        bad.append(f"WS: {row['warps']} warps, not 12 (not warp-specialized)")
    if meta.get("DQ_TMA") and not row["tma_reduce"]:
        bad.append("DQ_TMA: no cp.reduce.async.bulk.tensor")
    return bad


def lab_rows(arch: int = 90, dtype: str = "bf16", head_dim: int = 128, causal=(False, True),
             names=None):  # fmt: skip
    """Compile every lab variant (or those in ``names``, "fwd:ws" or "ws"), full and causal."""
    for kind, variants in tuning.LAB.items():
        for name, cfg in variants.items():
            if names and name not in names and f"{kind}:{name}" not in names:
                continue
            for c in causal:
                try:
                    row = compile_one(kind, arch, dtype, head_dim, cfg, causal=c)
                except Exception as exc:  # noqa: BLE001 - a failed compile is a row
                    row = dict(kind=kind, arch=arch, dtype=dtype, head_dim=head_dim, config=cfg,
                               error=f"{type(exc).__name__}: {str(exc)[:160]}")  # fmt: skip
                yield dict(row, variant=name, causal=c)


_LAB_COLUMNS = ("variant", "kind", "causal", "config", "regs", "spill_bytes", "smem", "warps",
                "setmaxnreg", "tma_reduce", "wgmma", "tma_loads")  # fmt: skip


def lab_markdown(table: list[dict], dtype: str) -> str:
    head = (
        f"### Lab variants, Triton {triton.__version__} (sm90, {dtype}, head dim 128, "
        "16-byte aligned arguments)\n\n"
        "`tuning.LAB`'s config tuples; warps as launched (12: warp-specialized). Check column: "
        "empty when shared memory is within the limit, every WS variant shows 12 warps and "
        "every DQ_TMA one a TMA reduce (spills are reported, not failed).\n\n"
    )
    cells = [[str(r.get(c, "")) for c in _LAB_COLUMNS] + ["; ".join(lab_failures(r))]
             for r in table]  # fmt: skip
    failing = sum(1 for r in table if lab_failures(r))
    tail = f"\n{len(table)} rows, {failing} off the check.\n"
    return head + _table([*_LAB_COLUMNS, "check"], cells) + tail


def _table(columns, rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(cells) + " |" for cells in rows]) + "\n"


def markdown(table: list[dict], dtype: str) -> str:
    head = (
        f"### Triton {triton.__version__} ({dtype}, causal, 16-byte aligned arguments)\n\n"
        "config: fwd (BLOCK_M, BLOCK_N, warps, stages, ping-pong), bwd (BLOCK_M, BLOCK_N, "
        "warps, stages). Goal column: empty when the row meets the goal (sm90: no spills, no "
        "mma.sync, every Q/K/V load by TMA; both: no spills, shared memory within the limit). "
        "wgmma_wait_inflight: `wgmma.wait_group N` with N > 0 (a matmul still in flight).\n\n"
    )
    rows = []
    for r in table:
        if "error" in r:
            cells = [str(r[c]) for c in _COLUMNS[:4]] + [f"FAILED {r['error']}"]
            cells += [""] * (len(_COLUMNS) - 4)
        else:
            cells = [str(r[c]).replace("True", "pp").replace("False", "-") for c in _COLUMNS]
            cells.append("; ".join(goal_failures(r)))
        rows.append(cells)
    failing = sum(1 for r in table if "error" in r or goal_failures(r))
    tail = f"\n{len(table)} configs, {failing} off the goal.\n"
    return head + _table([*_COLUMNS, "goal"], rows) + tail


_TITLE = (
    "# triton_flash: offline compile report\n\n"
    "Written by `python -m attnbench.impls.triton_flash.compile_report --update <this file>`, "
    "once per Triton version (each run replaces its own section). Compiler facts, not speed.\n"
)


def update(path: Path, section: str, part: str = "") -> None:
    """Replace (or append) this Triton version's section (``part``: "lab") of the report."""
    tag = f"triton {triton.__version__}{' ' + part if part else ''}"
    start, end = f"<!-- {tag} -->", f"<!-- end {tag} -->"
    text = path.read_text() if path.exists() else _TITLE
    block = f"{start}\n{section}{end}\n"
    if start in text:
        text = text[: text.index(start)] + block + text[text.index(end) + len(end) + 1 :]
    else:
        text = text + ("\n" if text else "") + block
    path.write_text(text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--archs", default="90,80")
    p.add_argument("--kinds", default="fwd,bwd")
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--head-dims", default="", help="comma list (default: one per tile width)")
    p.add_argument("--first", action="store_true", help="only the first config of each")
    p.add_argument("--update", type=Path, help="write this version's section into this file")
    p.add_argument("--lab", action="store_true", help="the kernel lab's variants (sm90)")
    args = p.parse_args(argv)
    if tuning.interpreting():
        print("compile_report: unset TRITON_INTERPRET", file=sys.stderr)
        return 2
    if args.lab:
        table = []
        for r in lab_rows(dtype=args.dtype):
            table.append(r)
            print({k: v for k, v in r.items() if k != "dtype"}, file=sys.stderr, flush=True)
        section = lab_markdown(table, args.dtype)
        if args.update:
            update(args.update, section, "lab")
        else:
            print(section)
        return 1 if any(lab_failures(r) for r in table) else 0
    dims = tuple(map(int, args.head_dims.split(","))) if args.head_dims else None
    table = []
    for r in rows(tuple(map(int, args.archs.split(","))), tuple(args.kinds.split(",")),
                  args.dtype, dims, args.first):  # fmt: skip
        table.append(r)
        print({k: v for k, v in r.items() if k != "dtype"}, file=sys.stderr, flush=True)
    section = markdown(table, args.dtype)
    if args.update:
        update(args.update, section)
    else:
        print(section)
    return 1 if any("error" in r or goal_failures(r) for r in table) else 0


if __name__ == "__main__":
    sys.exit(main())
