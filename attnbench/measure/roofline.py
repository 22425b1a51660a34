"""A row's rates and its place under the roofline: FLOP/s and bytes/s from the median time,
``pct_peak`` (the share of the roof its arithmetic intensity meets) and ``bound`` (which roof
that is), against the ceilings measured in the same run (measure/ceilings.py;
docs/method.md)."""

from __future__ import annotations

from typing import Protocol

from attnbench.case import Case

# bound: an intensity within this factor of the ridge point is "balanced" (docs/method.md)
RIDGE_BAND = 2.0


class Ceilings(Protocol):
    """The run's measured ceilings (run.row.Settings has them)."""

    matmul_tflops: dict  # dtype -> measured matmul rate, TFLOP/s
    copy_gb_s: float | None  # the measured copy bandwidth
    ceilings_contended: bool  # the ceilings waited for the CPU: no bound


def rates(flops: float, bytes_moved: float, median_ms: float) -> dict:
    """The row's flops, tflops and gbps at its median time."""
    seconds = median_ms * 1e-3
    return {"flops": flops, "tflops": flops / seconds / 1e12, "gbps": bytes_moved / seconds / 1e9}


def roofline(row: dict, case: Case, ceilings: Ceilings, notes: list[str]) -> dict:
    """pct_peak and bound: the row against the roof its arithmetic intensity meets. The roof
    is min(matmul rate, intensity x copy bandwidth), so the percentage of it is the larger of
    tflops / matmul rate and gbps / copy bandwidth (whichever ceilings were measured).

    ``bound`` names a roof only where the intensity is RIDGE_BAND or more away from the ridge
    point (matmul rate / bandwidth): a ceiling measured up to that factor off cannot flip the
    label. Within the band it is ``balanced``; with ceilings measured while the process waited
    for the CPU (``ceilings_contended``, any factor off) it is blank. ``notes`` gets the note
    of a pct_peak above 100."""
    peak_tflops = ceilings.matmul_tflops.get(case.dtype)
    shares = {
        "compute": row["tflops"] / peak_tflops if peak_tflops else None,
        "memory": row["gbps"] / ceilings.copy_gb_s if ceilings.copy_gb_s else None,
    }
    measured = {k: v for k, v in shares.items() if v is not None}
    if not measured:
        return {}
    out = {"pct_peak": 100 * max(measured.values())}
    if len(measured) == 2 and not ceilings.ceilings_contended:
        ridge = peak_tflops * 1e12 / (ceilings.copy_gb_s * 1e9)  # FLOP per byte
        intensity = row["flops"] / case.bytes_moved()
        out["bound"] = "balanced"
        if intensity * RIDGE_BAND <= ridge:
            out["bound"] = "memory"
        elif intensity >= ridge * RIDGE_BAND:
            out["bound"] = "compute"
    if out["pct_peak"] > 100:
        notes.append(over_ceiling_note(out["pct_peak"], max(measured, key=measured.get)))
    return out


def over_ceiling_note(pct: float, roof: str) -> str:
    """Why a row reads above 100% of a measured ceiling: the copy that measures memory
    bandwidth reads and writes every byte, and a kernel that mostly reads (decode reading its
    KV cache) can pass it; a matmul ceiling was measured low."""
    if roof == "memory":
        return (
            f"pct_peak {pct:.0f}% is above the measured copy bandwidth, which a copy gets "
            f"reading and writing each byte: mostly reading, as decode does, runs faster"
        )
    return (
        f"pct_peak {pct:.0f}% is above the measured matmul ceiling: it was measured low (a "
        f"busy machine?), so pct_peak is not trustworthy for this run"
    )
