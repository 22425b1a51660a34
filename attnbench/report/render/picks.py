"""The report's decision, rendered from recommend.recommendations and parts.part_verdicts:
one verdict line per phase (decode per number of new tokens), as a person would say it, and
the picks' table: per workload the impl to use, the kernel it ran, its worst loss and where,
the tolerance it was held to, its lead over the next kernel, its time and (decode) bandwidth
per case, its compile time and its failures in or next to its workload; a pick resting on
contended rows says so in both."""

from __future__ import annotations

import pandas as pd

from attnbench.measure.published import published
from attnbench.report.render.markdown import table

# backend column -> the kernel's name as its users say it
KERNEL_NAMES = {"cudnn": "cuDNN", "flash": "flash", "efficient": "mem-efficient", "math": "math"}
FAILURES_SHOWN = 2  # a pick's failures listed in its cell; the rest counted


def kernel_name(backend) -> str:
    """'cuDNN' for 'cudnn', 'flash+cuDNN' for several, '' for an impl's own code."""
    if not isinstance(backend, str) or not backend:
        return ""
    return "+".join(KERNEL_NAMES.get(b, b) for b in backend.split("+"))


def use_text(impl, backend) -> str:
    """An impl with the kernel it ran: 'sdpa → cuDNN' (just 'flex' for its own code)."""
    kernel = kernel_name(backend)
    forced = str(backend).lower() in str(impl).lower()  # sdpa_cudnn ran cudnn: said by its name
    return f"{impl} → {kernel}" if kernel and not forced else str(impl)


def lead_text(margin, runner_up) -> str:
    """The pick against the next kernel: '1.51x over triton_flash', or where another kernel
    is faster by the median, 'flex 1.05x faster' (never a margin below 1)."""
    if pd.isna(margin) or not isinstance(runner_up, str):
        return "no other kernel ran"
    if margin >= 1:
        return f"{margin:.2f}x over {runner_up}"
    return f"{runner_up} {1 / margin:.2f}x faster"


def loss_text(worst, where=None) -> str:
    """A pick's worst loss: 'fastest everywhere', or '1.08x (B=32 Sq=4 Skv=4096)'."""
    if pd.isna(worst):
        return ""
    if worst <= 1.0 + 1e-9:
        return "fastest everywhere"
    return f"within {worst:.2f}x" + (f" (at {where})" if isinstance(where, str) and where else "")


def verdict_lines(verdicts) -> list[str]:
    """One line per model and part (parts.part_verdicts): '**prefill**: sdpa → cuDNN, fastest
    everywhere, 1.51x over triton_flash'; a part with several picks names each by what sets it
    apart, and the one pick that would serve the whole part with its worst loss. A pick whose
    deciding rows were contended says so instead of standing as a fact."""
    lines = []
    for v in verdicts:
        head, g = f"**{v.label}**", v.picks
        if not v.agreed:
            lines.append(f"- {head}: no impl agrees in every case of {g['workload'].iloc[0]}")
            continue
        if len(g) == 1:
            r = g.iloc[0]
            said = f"{_said(r)}, {loss_text(r['worst_loss'])}"
            lines.append(f"- {head}: {said}, {lead_text(r['margin'], r['runner_up'])}")
            continue
        where: dict[str, list[str]] = {}  # a pick said once, with every workload it serves
        for _, r in g.iterrows():
            where.setdefault(_said(r), []).append(str(r["where"]))
        picks = "; ".join(f"{said} at {' and '.join(at)}" for said, at in where.items())
        first = g.iloc[0]
        one = f"one pick for all: {first['single']} {loss_text(first['single_loss'])}"
        lines.append(f"- {head}: {picks} ({one})")
    return lines


def contended_text(r) -> str:
    """'' unless the pick's deciding rows were contended somewhere: then in how many of its
    cases, and what to do."""
    n = r["contended"]
    if pd.isna(n) or not n:
        return ""
    return f"contended in {int(n)} of {int(r['cases'])} cases: re-measure on a quiet machine"


def _said(r) -> str:
    """A pick as a verdict names it, with its doubt where its rows were contended."""
    doubt = contended_text(r)
    return use_text(r["impl"], r["kernel"]) + (f" ({doubt})" if doubt else "")


def picks_table(rec: pd.DataFrame, env: dict) -> list[str]:
    """The picks, one row per workload (recommend.recommendations)."""
    peak = published(env.get("gpu_name"))
    copy = (env.get("ceilings") or {}).get("copy_gb_s") if isinstance(env, dict) else None
    shown = rec.assign(
        use=[_use_cell(r) for _, r in rec.iterrows()],
        loss=[loss_text(w, at) for w, at in zip(rec["worst_loss"], rec["worst_at"])],
        lead=[lead_text(m, n) for m, n in zip(rec["margin"], rec["runner_up"])],
        ms=[_span(lo, hi, ".3g") for lo, hi in zip(rec["time_ms_min"], rec["time_ms_max"])],
        bandwidth=[_bandwidth(r, peak, copy) for _, r in rec.iterrows()],
        mem=[_memory(r) for _, r in rec.iterrows()],
        compile=[_compile(c) for c in rec["compile_ms"]],
        fails=[_fails(f) for f in rec["failures"]],
        tolerance=[
            f"{_span(lo, hi, '.2f')}x" for lo, hi in zip(rec["tolerance_min"], rec["tolerance_max"])
        ],
        attn=[
            "" if pd.isna(a) else f"`{a}` ({loss_text(w)})"
            for a, w in zip(rec["attn_implementation"], rec["attn_worst_loss"])
        ],
    )
    labels = {
        "part": "part",
        "workload": "workload",
        "use": "use → kernel",
        "loss": "worst loss",
        "tolerance": "tolerance (the noise, ≤ cap)",
        "lead": "vs next kernel",
        "ms": "ms per case",
        "bandwidth": "decode GB/s (% of HBM peak, of copy)",
        "mem": "peak MiB (decode: KV cache MiB)",
        "compile": "compile",
        "fails": "fails in or next to it",
        "attn": "attn_implementation",
    }
    if not rec["attn_implementation"].notna().any():
        del labels["attn"]
    if not rec["phase"].eq("decode").any():
        del labels["bandwidth"]
    if rec["model"].nunique() > 1:
        labels = {"model": "model", **labels}
    return [table(shown, labels), ""]


def _use_cell(r) -> str:
    if pd.isna(r["impl"]):
        return "no impl agrees everywhere"
    notes = []
    if isinstance(r["same_kernel"], str) and r["same_kernel"]:
        notes.append(f"same kernel as {r['same_kernel']}")
    ties, wins = r["ties"], r["wins"]
    if ties:
        notes.append("tie" if ties == wins else f"{int(ties)} of {int(wins)} wins ties")
    if isinstance(r["marks"], str) and r["marks"]:
        notes.append(r["marks"])
    doubt = contended_text(r)
    if doubt:
        notes.append(doubt)
    said = f"**{use_text(r['impl'], r['kernel'])}**"
    return said + (f" ({'; '.join(notes)})" if notes else "")


def _span(lo, hi, fmt: str) -> str:
    if pd.isna(lo):
        return ""
    if f"{lo:{fmt}}" == f"{hi:{fmt}}":
        return f"{lo:{fmt}}"
    return f"{lo:{fmt}}–{hi:{fmt}}"


def _bandwidth(r, peak, copy) -> str:
    """Decode reads its cache once per step: GB/s per case, and as % of the device's HBM
    (the published peak, and the run's measured copy speed)."""
    if r["phase"] != "decode" or pd.isna(r["gbps_min"]):
        return ""
    said = _span(r["gbps_min"], r["gbps_max"], ".0f")
    pct = []
    if peak is not None:
        spec = peak.memory_gb_s
        pct.append(f"{_span(100 * r['gbps_min'] / spec, 100 * r['gbps_max'] / spec, '.0f')}%")
    if copy:
        pct.append(f"{_span(100 * r['gbps_min'] / copy, 100 * r['gbps_max'] / copy, '.0f')}%")
    return said + (f" ({', '.join(pct)})" if pct else "")


def _memory(r) -> str:
    """The peak temporaries over the cases, and in decode the KV cache they sit beside."""
    peak = _span(r["peak_mem_mib_min"], r["peak_mem_mib_max"], ".4g")
    if r["phase"] != "decode" or pd.isna(r["kv_mib_min"]):
        return peak
    return f"{peak} (KV {_span(r['kv_mib_min'], r['kv_mib_max'], '.5g')})"


def _compile(ms) -> str:
    return "" if pd.isna(ms) else f"{ms / 1000:.1f} s"


def _fails(parts) -> str:
    if not isinstance(parts, tuple) or not parts:
        return ""
    more = len(parts) - FAILURES_SHOWN
    return "; ".join(parts[:FAILURES_SHOWN]) + (f"; and {more} more" if more > 0 else "")
