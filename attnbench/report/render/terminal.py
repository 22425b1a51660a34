"""What the terminal shows besides a run's progress: ``attnbench list`` (every impl on one
line, then a note per impl, then every mask kind and score modifier), the model presets
(--list-models) and the summary table printed at the end of a sweep."""

from __future__ import annotations

import textwrap

import pandas as pd

from attnbench import plugins
from attnbench.case import DEVICES, DTYPE_BYTES
from attnbench.masks import ANY, KINDS, MASKS, MODS
from attnbench.masks.contract import defined_in
from attnbench.models import models_table
from attnbench.report.analyse.summary import summary

__all__ = ["list_impls", "models_table", "summary_table"]

LIST_WIDTH = 100  # attnbench list: lines no wider than this


ALIGN_SHORT = {("top_left",): "tl", ("bottom_right",): "br"}  # attnbench list's al column


def _bwd(impl) -> str:
    """y, n, or the devices it has a backward on."""
    if isinstance(impl.backward, bool):
        return "y" if impl.backward else "n"
    return ",".join(impl.backward)


NEED_SHORT = {"additive": "add", "grad": "all*"}  # what an impl needs of every modifier


def _compact(values, every=(), short=None) -> str:
    """A capability list in a few characters: 'all' when it is every allowed value, else
    the values (abbreviated by ``short``), an evenly spaced run of numbers as 'a-b/step' and
    a doubling one as 'a-b/x2'."""
    values = list(values)
    if every and set(values) >= set(every):
        return "all"
    if len(values) > 3 and all(isinstance(v, int) and v > 0 for v in values):
        steps = {b - a for a, b in zip(values, values[1:])}
        if len(steps) == 1:
            return f"{values[0]}-{values[-1]}/{steps.pop()}"
        if all(b == 2 * a for a, b in zip(values, values[1:])):
            return f"{values[0]}-{values[-1]}/x2"
    return ",".join((short or {}).get(v, str(v)) for v in values)


def _short_mod(name: str) -> str:
    """A score modifier's name in the table: its ``short``, else its name."""
    return getattr(MODS.get(name), "short", "") or name


def _masks(impl) -> str:
    """The masks beyond none ('-': none alone; '!' after them: it needs one of them)."""
    if ANY[0] in impl.masks:
        return "all"
    extra = [m for m in impl.masks if m != "none"]
    short = {k.name: k.short for k in KINDS.values() if k.short}
    shown = _compact(extra, MASKS[1:], short) if extra else "-"
    return shown if "none" in impl.masks else shown + "!"


def _mods(impl) -> str:
    """The score modifiers an impl takes, for attnbench list's sm column."""
    if ANY[0] not in impl.score_mods:
        return ",".join(_short_mod(m) for m in impl.score_mods) or "-"
    return "+".join(NEED_SHORT[n] for n in impl.score_mod_needs) or "all"


HEAD_ORDER_SHORT = {"grouped": "y", "interleaved": "i"}  # the GQA column of attnbench list


def list_impls(impls: dict, device: str) -> str:
    """Every impl on one line each (what it supports, where it came from), then a note per
    impl (what it is; why it cannot run here), every line within LIST_WIDTH characters."""
    dtypes = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
    rows, notes = [], []
    for impl in impls.values():
        here = impl.available and device in impl.devices
        rows.append(
            {
                "impl": impl.name,
                "here": "yes" if here else "no",
                "dev": _compact(impl.devices, DEVICES),
                "dtypes": _compact(impl.dtypes, DTYPE_BYTES, dtypes),
                "head_dims": "any" if impl.head_dims is None else _compact(impl.head_dims),
                "c/x/g/b": "/".join(
                    [
                        *("y" if f else "n" for f in (impl.causal, impl.cross)),
                        HEAD_ORDER_SHORT.get(impl.head_order, "y") if impl.gqa else "n",
                        _bwd(impl),
                    ]
                ),
                "masks": _masks(impl),
                "sm": _mods(impl),
                "al": ALIGN_SHORT.get(impl.causal_align, "both"),
                "in": "md" if impl.module else "pg" if impl.paged else "op",
                "from": plugins.impl_origin(impl),
            }
        )
        why = impl.unavailable or ("" if here else f"not on {device}")
        where = "" if plugins.impl_origin(impl) == "built-in" else f" [{impl.source}]"
        text = "; ".join(t for t in (why, impl.description) if t) + where
        notes.append(
            textwrap.fill(
                f"{impl.name}: {text or '(no description)'}",
                width=LIST_WIDTH,
                subsequent_indent="    ",
                break_on_hyphens=False,
            )
        )
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in rows[0]} if rows else {}
    table = "\n".join(
        " ".join(str(r[c]).ljust(w) for c, w in widths.items()).rstrip()
        for r in [dict(zip(widths, widths)), *rows]
    )
    legend = textwrap.fill(
        "here: runs on this device; dev: devices (all: cpu and cuda); head_dims: a-b/s from a "
        "to b in steps of s, a-b/x2 from a to b doubling; c/x/g/b: causal / cross "
        "(seq_q != seq_kv) / GQA (y: query head h reads kv head h // group; i: h % kv_heads, "
        "head_order interleaved) / "
        "backward (a device: there only); masks beyond none: pad(ding), win(dow), doc(ument), "
        "bsp = block_sparse, all: every kind, a plugin's too, '!': needs one of them; "
        "sm: score modifiers (cap = softcap, ali = alibi; add: every one that only adds a bias, "
        "a plugin's too; all*: all, with backward those that declare grad); "
        "al: causal alignment, tl(top-left), br(bottom-right) or both (one "
        "alone also runs the other's cases of equal lengths); in: what it takes, op (q, k, v), "
        "pg (a paged KV cache) or md (a module impl: x, at --level layer only); "
        "from: built-in (attnbench.impls), impls/ (the checkout's drop-in folder), --plugin, "
        "entry point",
        width=LIST_WIDTH,
        break_on_hyphens=False,
    )
    return "\n".join([table, "", legend, "", *notes, "", masks_table()])


def masks_table() -> str:
    """Every mask kind and score modifier, a plugin's too: how a sweep names it, what it
    needs, where it came from (built-in, or the plugin file) and what it means."""
    kinds = [(_kind_syntax(k), defined_in(type(k)), k.meaning, _needs(k)) for k in KINDS.values()]
    mods = [(_mod_syntax(m), defined_in(m), m.meaning, "") for m in MODS.values()]
    entries = kinds + mods
    width = max(len(e[0]) for e in entries) + 2
    lines = ["mask kinds and score modifiers (from: built-in, or the plugin file in brackets):"]
    for syntax, where, meaning, needs in entries:
        source = "built-in" if where == "built-in" else "plugin"
        extra = "" if where == "built-in" else f" [{where}]"
        lines.append(
            textwrap.fill(
                f"{syntax.ljust(width)}{source:<9} {meaning or '(no meaning)'}{needs}{extra}",
                width=LIST_WIDTH,
                subsequent_indent=" " * (width + 10),
                break_on_hyphens=False,
                break_long_words=False,  # a plugin's file path stays whole
            )
        )
    return "\n".join(lines)


def _kind_syntax(kind) -> str:
    """--mask NAME, with [:SPEC] where it takes a spec (its meaning names an option that
    gives one too)."""
    return f"--mask {kind.name}" + ("" if kind.default_spec is None else "[:SPEC]")


def _needs(kind) -> str:
    """What a kind needs of a case, and its default spec."""
    needs = [f"default {kind.default_spec}"] if kind.default_spec is not None else []
    if kind.needs_causal:
        needs.append("causal only")
    if kind.self_only:
        needs.append("seq_q = seq_kv")
    return f" ({'; '.join(needs)})" if needs else ""


def _mod_syntax(mod) -> str:
    """--score-mod NAME, with [:ARG] where it takes an argument (:ARG where it needs one)."""
    if mod.default_arg is not None:
        return f"--score-mod {mod.name}[:ARG]"
    try:
        mod.canonical(None)
    except (TypeError, ValueError):
        return f"--score-mod {mod.name}:ARG"
    return f"--score-mod {mod.name}"


def summary_table(df: pd.DataFrame, impls: list[str] | None = None) -> str:
    """Median ms per case (rows) and impl (columns) over the whole run (a resumed run too):
    analyse/summary.py's cells; impls that are unsupported in every case are named below,
    not tabulated."""
    if df.empty:
        return "no rows were run"
    table = summary(df, impls)
    text = (
        "time_ms (median; '!' = disagrees with the reference; 'c' = contended: the CPU was "
        "busy; '~' = noisy or a wide speedup interval)\n"
    )
    text += table.cells.to_string() if len(table.cells.columns) else ""
    if table.never:
        text += f"\nunsupported in every case (reasons in the report): {', '.join(table.never)}"
    return text
