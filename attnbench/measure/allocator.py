"""Keeping glibc's allocator from handing the heap back to the OS between timed CPU calls.

By default glibc trims the top of the heap (and unmaps large blocks) when memory is freed, so
every call of an attention impl that allocates tens of MiB page-faults them back in: thousands
of minor faults per call, and ``time_ms`` doubles between identical runs depending on when the
trimming happens. Raising the trim and mmap thresholds keeps the memory mapped after the first
calls. Workers get it through ``GLIBC_TUNABLES`` (read by glibc at process start, so it is set
in the environment the worker is spawned with); the sweep's own process, which measures rows
with ``--no-isolate``, gets the same thresholds through ``mallopt``. The setting is recorded in
env.json (``malloc``); docs/method.md ("CPU timing and the allocator") has the measurements.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import platform
import resource

THRESHOLD = 4 * 2**30  # bytes: far above any allocation of one call
TUNABLES = {
    "glibc.malloc.trim_threshold": THRESHOLD,
    "glibc.malloc.mmap_threshold": THRESHOLD,
}
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # malloc.h
_MALLOPT_MAX = 2**31 - 1  # mallopt takes an int


def is_glibc() -> bool:
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def tunables(current: str | None) -> str:
    """``GLIBC_TUNABLES`` with the thresholds added; settings already there win."""
    items = [t for t in (current or "").split(":") if t]
    given = {t.split("=", 1)[0] for t in items}
    items += [f"{k}={v}" for k, v in TUNABLES.items() if k not in given]
    return ":".join(items)


@contextlib.contextmanager
def worker_environment(enabled: bool):
    """Within the block, processes started inherit ``GLIBC_TUNABLES`` with the thresholds."""
    if not (enabled and is_glibc()):
        yield
        return
    before = os.environ.get("GLIBC_TUNABLES")
    os.environ["GLIBC_TUNABLES"] = tunables(before)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("GLIBC_TUNABLES", None)
        else:
            os.environ["GLIBC_TUNABLES"] = before


def pin_in_process() -> bool:
    """The same thresholds for this process, via mallopt; False where that is not possible."""
    if not is_glibc():
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(
            libc.mallopt(_M_TRIM_THRESHOLD, _MALLOPT_MAX)
            and libc.mallopt(_M_MMAP_THRESHOLD, _MALLOPT_MAX)
        )
    except (OSError, AttributeError):
        return False


def describe(enabled: bool, isolate: bool) -> dict:
    """For env.json: what the rows were measured under."""
    if not enabled:
        how = "off (--no-malloc-tunables): glibc's defaults, the heap may be trimmed"
    elif not is_glibc():
        how = "not applied: not glibc"
    elif isolate:
        how = "GLIBC_TUNABLES in the worker processes"
    else:
        how = "mallopt(M_TRIM_THRESHOLD, M_MMAP_THRESHOLD) in this process"
    return {
        "enabled": enabled and is_glibc(),
        "how": how,
        "GLIBC_TUNABLES": tunables(os.environ.get("GLIBC_TUNABLES")) if enabled else None,
    }


def minor_faults() -> int:
    """Minor page faults of this process so far (getrusage)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
