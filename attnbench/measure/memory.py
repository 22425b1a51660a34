"""Peak memory of one call, in its own pass: bytes allocated at the peak of the call minus
bytes allocated just before it (the output and anything the call keeps count)."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable

import torch

from attnbench.errors import AttnbenchError
from attnbench.measure.profiling import profiled


class MemoryUnavailable(AttnbenchError, RuntimeError):
    """This device/torch build gives no way to measure the peak honestly."""


def device_memory_bytes(device: str) -> int | None:
    """The memory of ``device``: a CUDA device's total, the host's physical memory on the
    CPU; None where it cannot be read."""
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            return None
        return torch.cuda.get_device_properties(torch.device(device)).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def peak_mem_mib(fn: Callable[[], object], device_type: str) -> float:
    gc.collect()
    if device_type == "cuda":
        return _peak_cuda(fn) / 2**20
    return _peak_cpu(fn) / 2**20


def _peak_cuda(fn: Callable[[], object]) -> int:
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del result
    return peak


def _peak_cpu(fn: Callable[[], object]) -> int:
    """The profiler's allocator events, replayed in time order: the running sum of
    allocations (+) and frees (-) during the call, and its maximum."""
    from torch.profiler import ProfilerActivity

    try:
        from torch._C._profiler import _EventType
    except ImportError as exc:
        raise MemoryUnavailable(f"this torch has no profiler event tree ({exc})") from exc
    with profiled([ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    del result
    events = []
    stack = list(prof.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
        stack.extend(node.children)
    running = peak = 0
    for _, size in sorted(events):
        running += size
        peak = max(peak, running)
    return peak
