"""Hardware ceilings measured in the same run: dense matmul rate per dtype and device-to-device
copy bandwidth, with the harness's own timer. Every ok row's TFLOP/s is read against them."""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnbench.case import torch_dtype
from attnbench.measure.timing import TimerConfig, Timing, time_fn

# square matmul sizes: large enough to reach the plateau, small enough to take seconds
MATMUL_N = {"cuda": 8192, "cpu": 1024}
COPY_MIB = {"cuda": 1024, "cpu": 256}
REPEATS = 3  # each ceiling is the best of this many measurements
# CPU: a measurement whose threads waited for a CPU (measure/contention.py) does not count
# toward REPEATS and is tried again, up to this many tries in all
MAX_TRIES = 3 * REPEATS


def matmul_tflops(
    dtype: str, device: str, n: int | None = None, timer: TimerConfig = TimerConfig()
) -> float:
    """TFLOP/s of an (n, n) @ (n, n) product on random data (2·n³ FLOPs)."""
    return _matmul(dtype, device, n, timer)[0]


def copy_gb_s(device: str, mib: int | None = None, timer: TimerConfig = TimerConfig()) -> float:
    """GB/s of a device-to-device copy, counting the bytes read and the bytes written."""
    return _copy(device, mib, timer)[0]


def _matmul(dtype: str, device: str, n: int | None, timer: TimerConfig) -> tuple[float, bool]:
    """The rate and whether the measurement was contended (CPU; False on CUDA)."""
    n = n or MATMUL_N[device.split(":")[0]]
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, generator=g, device=device).to(torch_dtype(dtype))
    b = torch.randn(n, n, generator=g, device=device).to(torch_dtype(dtype))
    t = time_fn(lambda: a @ b, device.split(":")[0], timer)
    return 2.0 * n**3 / (t.median_ms * 1e-3) / 1e12, _contended(t)


def _copy(device: str, mib: int | None, timer: TimerConfig) -> tuple[float, bool]:
    nbytes = (mib or COPY_MIB[device.split(":")[0]]) * 2**20
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    t = time_fn(lambda: dst.copy_(src), device.split(":")[0], timer)
    return 2.0 * nbytes / (t.median_ms * 1e-3) / 1e9, _contended(t)


def _contended(t: Timing) -> bool:
    return t.contention is not None and t.contention.contended


def best(
    measure_once: Callable[[], tuple[float, bool]], max_tries: int = MAX_TRIES
) -> tuple[float, bool]:
    """The best rate over the tries, until REPEATS were uncontended (contended ones are
    tried again, up to ``max_tries`` in all), and whether none was uncontended (the ceiling
    may then be low: every try waited for the CPU)."""
    rates, clean = [], 0
    for _ in range(max(max_tries, REPEATS)):
        rate, busy = measure_once()
        rates.append(rate)
        clean += not busy
        if clean >= REPEATS:
            break
    return max(rates), clean == 0


def measure(dtypes: list[str], device: str, *, quick: bool = False) -> dict:
    """The ceilings for env.json: {"matmul_tflops": {dtype: x}, "copy_gb_s": y, ...}. Each is
    the best of ``REPEATS`` measurements: a ceiling is what the device can do, and a moment of
    interference from another process only ever lowers a measurement (on the CPU, contended
    measurements are tried again, except in ``quick`` runs; ``contended`` says whether a
    ceiling kept one all the same, and then the rows get no ``bound``). The memory they took
    is handed back to the device, so that it does not shift where the sweep's rows run out."""
    timer = TimerConfig(rep_ms=20.0 if quick else 200.0)
    kind = device.split(":")[0]
    n = MATMUL_N[kind] // (2 if quick else 1)
    mib = COPY_MIB[kind] // (4 if quick else 1)
    tries = REPEATS if quick else MAX_TRIES  # quick runs (tests, smoke) do not try again
    rates = {d: best(lambda d=d: _matmul(d, device, n, timer), tries) for d in dtypes}
    copy = best(lambda: _copy(device, mib, timer), tries)
    out = {
        "matmul_tflops": {d: rate for d, (rate, _) in rates.items()},
        "matmul_n": n,
        "copy_gb_s": copy[0],
        "copy_mib": mib,
        "repeats": REPEATS,
        "contended": copy[1] or any(busy for _, busy in rates.values()),
    }
    if kind == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        out["cuda_reserved_mib_after"] = torch.cuda.memory_reserved() / 2**20
    return out
