"""Hardware ceilings measured in the same run: dense matmul rate per dtype and device-to-device
copy bandwidth, with the harness's own timer. Every ok row's TFLOP/s is read against them."""

from __future__ import annotations

import torch

from attnbench.case import DTYPES
from attnbench.measure.timing import TimerConfig, time_fn

# square matmul sizes: large enough to reach the plateau, small enough to take seconds
MATMUL_N = {"cuda": 8192, "cpu": 1024}
COPY_MIB = {"cuda": 1024, "cpu": 256}
REPEATS = 3  # each ceiling is the best of this many measurements


def matmul_tflops(
    dtype: str, device: str, n: int | None = None, timer: TimerConfig = TimerConfig()
) -> float:
    """TFLOP/s of an (n, n) @ (n, n) product on random data (2·n³ FLOPs)."""
    n = n or MATMUL_N[device.split(":")[0]]
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, generator=g, device=device).to(DTYPES[dtype])
    b = torch.randn(n, n, generator=g, device=device).to(DTYPES[dtype])
    ms = time_fn(lambda: a @ b, device.split(":")[0], timer).median_ms
    return 2.0 * n**3 / (ms * 1e-3) / 1e12


def copy_gb_s(device: str, mib: int | None = None, timer: TimerConfig = TimerConfig()) -> float:
    """GB/s of a device-to-device copy, counting the bytes read and the bytes written."""
    nbytes = (mib or COPY_MIB[device.split(":")[0]]) * 2**20
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    ms = time_fn(lambda: dst.copy_(src), device.split(":")[0], timer).median_ms
    return 2.0 * nbytes / (ms * 1e-3) / 1e9


def measure(dtypes: list[str], device: str, *, quick: bool = False) -> dict:
    """The ceilings for env.json: {"matmul_tflops": {dtype: x}, "copy_gb_s": y, ...}. Each is
    the best of ``REPEATS`` measurements: a ceiling is what the device can do, and a moment of
    interference from another process only ever lowers a measurement. The memory they took is
    handed back to the device, so that it does not shift where the sweep's rows run out."""
    timer = TimerConfig(rep_ms=20.0 if quick else 200.0)
    kind = device.split(":")[0]
    n = MATMUL_N[kind] // (2 if quick else 1)
    mib = COPY_MIB[kind] // (4 if quick else 1)
    out = {
        "matmul_tflops": {
            d: max(matmul_tflops(d, device, n, timer) for _ in range(REPEATS)) for d in dtypes
        },
        "matmul_n": n,
        "copy_gb_s": max(copy_gb_s(device, mib, timer) for _ in range(REPEATS)),
        "copy_mib": mib,
        "repeats": REPEATS,
    }
    if kind == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        out["cuda_reserved_mib_after"] = torch.cuda.memory_reserved() / 2**20
    return out
