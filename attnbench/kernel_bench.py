"""Race attnbench's Triton kernel (triton_flash) against SDPA's backends and xFormers on one GPU.

Shapes: bf16, B * N = 16384 tokens and heads * head_dim = 2048 (so B = 16384 / N and
heads = 2048 / head_dim), N = 512 ... 16384, head_dim 64 and 128, causal and not, forward
and backward. FLOPs: forward 4 * B * heads * pairs * head_dim with pairs = N^2, or N(N+1)/2
causal; backward 2.5x the forward. Times are the median of ``triton.testing.do_bench``.
Before timing, each shape checks triton_flash (out, dq, dk, dv on batch 0, heads 0-1) against
SDPA's math backend in float32, with the harness's agreement rule (baseline: math in bf16).

The output CSV is long/tidy, one row per (impl, mode, seq_len, head_dim, causal), plus one
row for the bf16 GEMM ceiling (impl gemm_bf16, mode gemm).
"""
from __future__ import annotations

import argparse
import csv
import math
import re
import sys
from pathlib import Path
from typing import Callable

import torch

from attnbench.case import Case

TOKENS = 16384  # B * N
HIDDEN = 2048  # heads * head_dim
SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)
MODES = ("fwd", "bwd")
QUICK = dict(seq_lens=(1024, 4096), head_dims=(128,), warmup=10, rep=30)
GEMM_N = 8192
COLUMNS = ("impl", "mode", "seq_len", "head_dim", "causal", "batch", "heads", "time_ms",
           "tflops", "status", "reason")
OURS = "triton_flash"
NO_CUDA_EXIT = 2


def shape(seq_len: int, head_dim: int) -> tuple[int, int]:
    """(batch, heads) for a sequence length and head dim at fixed tokens and hidden size."""
    if TOKENS % seq_len or HIDDEN % head_dim:
        raise ValueError(f"seq_len={seq_len} must divide {TOKENS} and head_dim={head_dim} "
                         f"must divide {HIDDEN}")
    return TOKENS // seq_len, HIDDEN // head_dim


def flops(batch: int, heads: int, seq_len: int, head_dim: int, causal: bool, mode: str) -> float:
    """The harness's own FLOP count (attnbench.case), for a self-attention shape."""
    return Case(batch=batch, heads=heads, kv_heads=heads, seq_q=seq_len, seq_kv=seq_len,
                head_dim=head_dim, causal=causal, mode=mode).flops()


def device_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated integers") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive integers")
    return values


def _modes(text: str) -> tuple[str, ...]:
    values = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [m for m in values if m not in MODES]
    if not values or bad:
        raise argparse.ArgumentTypeError(f"{text!r}: modes are {', '.join(MODES)}")
    return values


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-lens", type=_int_list, default=None,
                   help=f"comma-separated N (default {','.join(map(str, SEQ_LENS))})")
    p.add_argument("--head-dims", type=_int_list, default=None,
                   help=f"comma-separated head dims (default {','.join(map(str, HEAD_DIMS))})")
    p.add_argument("--modes", type=_modes, default=MODES, help="fwd,bwd (default both)")
    p.add_argument("--causal", choices=("both", "true", "false"), default="both")
    p.add_argument("--impls", default=None, help="comma-separated subset of the impls")
    p.add_argument("--quick", action="store_true",
                   help=f"N {QUICK['seq_lens']}, head dim {QUICK['head_dims']}, short timing")
    p.add_argument("--warmup", type=int, default=None, help="do_bench warmup in ms (25)")
    p.add_argument("--rep", type=int, default=None, help="do_bench rep in ms (100)")
    p.add_argument("--out", type=Path, default=None,
                   help="CSV path (default results/kernel_bench/<device-slug>.csv)")
    args = p.parse_args(argv)
    args.seq_lens = args.seq_lens or (QUICK["seq_lens"] if args.quick else SEQ_LENS)
    args.head_dims = args.head_dims or (QUICK["head_dims"] if args.quick else HEAD_DIMS)
    args.warmup = args.warmup or (QUICK["warmup"] if args.quick else 25)
    args.rep = args.rep or (QUICK["rep"] if args.quick else 100)
    args.causals = {"both": (False, True), "true": (True,), "false": (False,)}[args.causal]
    for n in args.seq_lens:
        for d in args.head_dims:
            try:
                shape(n, d)
            except ValueError as exc:
                p.error(str(exc))
    return args


# --------------------------------------------------------------------------------- the impls
# Each maker takes bhsd tensors q, k, v (B, H, N, D) and returns (inputs, fn): fn(*inputs) is
# the timed call and returns out in the layout of its inputs; layout changes happen here,
# outside the timed region. Raising means "cannot run", with the message as the reason.

def _sdpa(backend_name: str):
    def make(q, k, v, causal):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = getattr(SDPBackend, backend_name)

        def fn(q, k, v):
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v,
                                                                        is_causal=causal)
        return (q, k, v), fn
    return make


def _xformers(q, k, v, causal):
    import xformers.ops as xops
    from xformers.ops.fmha.attn_bias import LowerTriangularMask
    bias = LowerTriangularMask() if causal else None
    inputs = tuple(t.detach().transpose(1, 2).contiguous().requires_grad_(t.requires_grad)
                   for t in (q, k, v))  # (B, N, H, D)
    return inputs, lambda q, k, v: xops.memory_efficient_attention(q, k, v, attn_bias=bias)


def _ours(q, k, v, causal):
    from attnbench.kernels.triton_flash import flash_attention
    scale = 1.0 / math.sqrt(q.shape[-1])
    return (q, k, v), lambda q, k, v: flash_attention(q, k, v, causal=causal, scale=scale)


IMPLS: dict[str, Callable] = {
    OURS: _ours,
    "sdpa_flash": _sdpa("FLASH_ATTENTION"),
    "sdpa_efficient": _sdpa("EFFICIENT_ATTENTION"),
    "sdpa_cudnn": _sdpa("CUDNN_ATTENTION"),
    "xformers": _xformers,
}


# ------------------------------------------------------------------------------------ running

def _reason(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def _verify(q, k, v, causal: bool, out, grads=None, dout=None) -> list[str]:
    """triton_flash vs SDPA math in float32 on batch 0, heads 0-1; [] when it agrees.
    ``grads`` (dq, dk, dv) are those of ``out`` for the cotangent ``dout`` (full shapes)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attnbench.accuracy import agrees, error
    sl = (slice(0, 1), slice(0, 2))
    dout = None if dout is None else dout[sl]

    def math_attn(dtype):
        qs, ks, vs = (t.detach()[sl].to(dtype).requires_grad_(grads is not None)
                      for t in (q, k, v))
        with torch.enable_grad(), sdpa_kernel(SDPBackend.MATH):
            o = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)
            g = torch.autograd.grad(o, (qs, ks, vs), dout.to(dtype)) if grads else ()
        return (o.detach(), *g)

    ref, base = math_attn(torch.float32), math_attn(q.dtype)
    ours = (out[sl],) if grads is None else (out[sl], *(g[sl] for g in grads))
    bad = []
    for name, x, r, b in zip(("out", "dq", "dk", "dv"), ours, ref, base):
        err, err_base = error(x, r), error(b, r)
        if not agrees(err, err_base, q.dtype):
            bad.append(f"{name} rel {err.rel:.2e} > baseline {err_base.rel:.2e}")
    return bad


def _slice_grads(q, k, v, causal, dout):
    from attnbench.kernels.triton_flash import flash_attention
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = flash_attention(q, k, v, causal=causal, scale=1.0 / math.sqrt(q.shape[-1]))
    return out.detach(), torch.autograd.grad(out, (q, k, v), dout)


def run_one(name, make, mode, n, d, causal, warmup, rep) -> dict:
    from triton.testing import do_bench
    b, h = shape(n, d)
    row = dict(impl=name, mode=mode, seq_len=n, head_dim=d, causal=causal, batch=b, heads=h,
               time_ms="", tflops="", status="ok", reason="")
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
               .requires_grad_(mode == "bwd") for _ in range(3))  # (B, H, N, D)
    try:
        try:  # first call: can it run at all (and triton_flash autotunes here, untimed)
            inputs, fn = make(q, k, v, causal)
            out = fn(*inputs)
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - cannot run: a reason in the table
            row.update(status="unsupported", reason=_reason(exc))
            return row
        if name == OURS:
            check_out, grads, dout = out.detach(), None, None
            if mode == "bwd":
                dout = torch.randn_like(out)
                check_out, grads = _slice_grads(q, k, v, causal, dout)
            bad = _verify(q, k, v, causal, check_out, grads, dout)
            if bad:
                row.update(status="mismatch", reason="vs SDPA math: " + "; ".join(bad))
            del check_out, grads, dout
        if mode == "fwd":
            with torch.no_grad():
                ms = do_bench(lambda: fn(*inputs), warmup=warmup, rep=rep,
                              return_mode="median")
        else:
            dout = torch.randn_like(out)
            ms = do_bench(lambda: out.backward(dout, retain_graph=True), warmup=warmup,
                          rep=rep, grad_to_none=list(inputs), return_mode="median")
    except torch.cuda.OutOfMemoryError as exc:
        row.update(status="oom", reason=_reason(exc))
        return row
    except Exception as exc:  # noqa: BLE001
        row.update(status="error", reason=_reason(exc))
        return row
    finally:
        torch.cuda.empty_cache()
    row.update(time_ms=ms, tflops=flops(b, h, n, d, causal, mode) / (ms * 1e-3) / 1e12)
    return row


def gemm_tflops(warmup: int, rep: int) -> float:
    from triton.testing import do_bench
    a = torch.randn(GEMM_N, GEMM_N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(GEMM_N, GEMM_N, device="cuda", dtype=torch.bfloat16)
    ms = do_bench(lambda: a @ b, warmup=warmup, rep=rep, return_mode="median")
    return 2.0 * GEMM_N**3 / (ms * 1e-3) / 1e12


def ratio(rows: list[dict]) -> float | None:
    """triton_flash TFLOP/s over the best other impl's, for rows of one shape."""
    ours = [r["tflops"] for r in rows if r["impl"] == OURS and r["status"] != "oom"
            and r["tflops"] != ""]
    others = [r["tflops"] for r in rows if r["impl"] != OURS and r["status"] == "ok"]
    return ours[0] / max(others) if ours and others else None


def print_table(rows: list[dict], names: list[str], ceiling: float) -> None:
    print(f"\nbf16 GEMM {GEMM_N}^3: {ceiling:.1f} TFLOP/s (ceiling)\n")
    head = f"{'mode':4} {'D':>4} {'causal':6} {'N':>6} " + " ".join(f"{n:>15}" for n in names)
    print(head + f" {'ours/best':>9}")
    keys = sorted({(r["mode"], r["head_dim"], r["causal"], r["seq_len"]) for r in rows})
    for key in keys:
        group = [r for r in rows if (r["mode"], r["head_dim"], r["causal"], r["seq_len"]) == key]
        cells = []
        for name in names:
            r = next((r for r in group if r["impl"] == name), None)
            cells.append("-" if r is None else f"{r['tflops']:.1f}" if r["status"] == "ok"
                         else r["status"] if r["tflops"] == "" else f"{r['tflops']:.1f}!")
        rr = ratio(group)
        print(f"{key[0]:4} {key[1]:>4} {str(key[2]):6} {key[3]:>6} "
              + " ".join(f"{c:>15}" for c in cells) + f" {'' if rr is None else f'{rr:.2f}':>9}")
    notes = [r for r in rows if r["status"] != "ok"]
    if notes:
        print("\n(! = timed but did not agree with SDPA math)")
        for r in notes:
            print(f"  {r['impl']} {r['mode']} N={r['seq_len']} D={r['head_dim']} "
                  f"causal={r['causal']}: {r['status']}: {r['reason']}")


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_kernel: needs a CUDA GPU and torch.cuda.is_available() is False here; "
              "nothing was run or written.", file=sys.stderr)
        return NO_CUDA_EXIT
    try:
        import triton  # noqa: F401
    except ImportError:
        print("bench_kernel: needs triton (pip install triton) for do_bench and triton_flash; "
              "nothing was run or written.", file=sys.stderr)
        return NO_CUDA_EXIT
    names = list(IMPLS) if args.impls is None else [n.strip() for n in args.impls.split(",")]
    unknown = [n for n in names if n not in IMPLS]
    if unknown:
        print(f"bench_kernel: unknown impls {unknown} (known: {', '.join(IMPLS)})",
              file=sys.stderr)
        return 1
    dev = torch.cuda.get_device_name()
    out = args.out or Path("results/kernel_bench") / f"{device_slug(dev)}.csv"
    print(f"{dev}; torch {torch.__version__}; triton {sys.modules['triton'].__version__}")
    ceiling = gemm_tflops(args.warmup, args.rep)
    rows = [dict(impl="gemm_bf16", mode="gemm", seq_len=GEMM_N, head_dim="", causal="",
                 batch="", heads="", time_ms=2.0 * GEMM_N**3 / ceiling / 1e9, tflops=ceiling,
                 status="ok", reason=f"{GEMM_N}^3 bf16 matmul")]
    for mode in args.modes:
        for d in args.head_dims:
            for causal in args.causals:
                for n in args.seq_lens:
                    for name in names:
                        row = run_one(name, IMPLS[name], mode, n, d, causal, args.warmup,
                                      args.rep)
                        rows.append(row)
                        shown = f"{row['tflops']:.1f} TFLOP/s" if row["tflops"] != "" else ""
                        print(f"  {mode} D={d} causal={causal} N={n} {name}: {row['status']} "
                              f"{shown} {row['reason'][:120]}", flush=True)
    print_table([r for r in rows if r["impl"] != "gemm_bf16"], names, ceiling)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"\nwrote {out}")
    return 0
