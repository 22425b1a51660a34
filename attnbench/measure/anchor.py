"""The speed anchor: a small fixed workload timed in every round of every case, beside the
impls, so that the machine's own speed is measured all along the run. Its ``compute`` part is
a matmul in the case's dtype, its ``memory`` part a copy; both are fixed per device type (the
same work in every run, so two runs' anchors compare), a few ms at most on a CPU. A row's
``speed_compute`` and ``speed_memory`` are the anchor's median time at the run's first timed
case (per dtype for compute) over its median during the row's case (``speed``): below 1 the
machine was slower than at the start (throttled, or shared)."""

from __future__ import annotations

import statistics
import time

from attnbench.case import torch_dtype

RESOURCES = ("compute", "memory")
SAMPLES = 2  # per resource and round (one warm-up call each when the anchor is made)
# device type -> (the matmul's side for 4- and 8-byte dtypes, for 2-byte ones; the copy's MiB)
SIZES = {"cpu": (256, 128, 4), "cuda": (4096, 8192, 256)}
L2_FLUSH_BYTES = 256 * 2**20  # CUDA: flushed before every sample, as the impls' timer does


class Anchor:
    """The anchor's tensors on ``device`` for ``dtype`` (a case's), made once."""

    def __init__(self, device: str, dtype: str):
        import torch

        self.device_type, self.dtype = device.split(":")[0], dtype
        wide, narrow, mib = SIZES[self.device_type]
        dt = torch_dtype(dtype)
        n = wide if dt.itemsize >= 4 else narrow
        g = torch.Generator().manual_seed(0)
        self.a, self.b = (torch.randn(n, n, generator=g).to(device, dt) for _ in "ab")
        self.src = torch.ones(mib * 2**20, dtype=torch.uint8, device=device)
        self.dst = torch.empty_like(self.src)
        self.work = {"compute": lambda: self.a @ self.b, "memory": lambda: self.dst.copy_(self.src)}
        for fn in self.work.values():
            fn()

    def round(self) -> dict[str, list[float]]:
        """One round's samples, ms: resource -> SAMPLES times."""
        return {name: self._samples(self.work[name]) for name in RESOURCES}

    def _samples(self, fn) -> list[float]:
        if self.device_type != "cuda":
            out = []
            for _ in range(SAMPLES):
                start = time.perf_counter()
                fn()
                out.append((time.perf_counter() - start) * 1e3)
            return out
        import torch

        flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=self.a.device)
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(SAMPLES)
        ]
        for start, end in events:
            flush.zero_()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in events]


def median_ms(samples: list[dict]) -> dict[str, float]:
    """resource -> the median of the per-round medians of ``samples`` (one dict per round)."""
    return {
        name: statistics.median(statistics.median(r[name]) for r in samples) for name in RESOURCES
    }


def speed(reference_ms: float | None, now_ms: float | None) -> float | None:
    """The machine's speed now relative to the reference: its time then / its time now."""
    if not reference_ms or not now_ms:
        return None
    return reference_ms / now_ms


def reference(entry: dict, dtype: str, rounds: tuple[dict, ...]) -> dict:
    """The run's reference (env.json's ``anchor``) with a case's anchor ``rounds`` where it has
    none yet: the first timed case gives ``memory_ms``, and ``compute_ms`` for its dtype."""
    now = median_ms(list(rounds))
    compute = dict(entry.get("compute_ms") or {})
    compute.setdefault(dtype, now["compute"])
    return {**entry, "compute_ms": compute, "memory_ms": entry.get("memory_ms") or now["memory"]}


def speeds(reference: dict, dtype: str, rounds: tuple[dict, ...]) -> dict:
    """A case's ``speed_compute`` and ``speed_memory``: its anchor ``rounds`` against the
    run's ``reference``."""
    now = median_ms(list(rounds))
    return {
        "speed_compute": speed((reference.get("compute_ms") or {}).get(dtype), now["compute"]),
        "speed_memory": speed(reference.get("memory_ms"), now["memory"]),
    }


def samples(rounds: tuple[dict, ...], start_unix: float) -> list[dict]:
    """A case's anchor ``rounds`` as long rows: round, resource, time_ms, and t_s (seconds
    since the run's start)."""
    return [
        {"round": r["round"], "resource": name, "time_ms": t, "t_s": r["t_unix"] - start_unix}
        for r in rounds
        for name in RESOURCES
        for t in r[name]
    ]
