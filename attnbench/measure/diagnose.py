"""Disagreements that explain themselves (docs/method.md, "The agreement rule"): when a call's
output disagrees with the float64 reference, the row's reason says what the disagreement is.

An impl that uses torch.compile is called once more with torch.compile off
(measure/compiling.eagerly) and judged by the same rule: "eager agrees: the compiled output is
wrong (torch.compile, torch X)" puts the fault on the compiler, "eager disagrees too" on the
impl.

Then the few neighbouring conventions users get wrong are tried on the same output, and each
one it matches within the rule's bound gives the row a one-line note, e.g. "out matches
bottom-right causal; declared top-left". Each convention is a row of ``conventions()`` (a
mask kind declares its own: ``MaskKind.near_misses``): its
name, whether it applies to the case, and ``alternative`` (case, inputs, out, truth) -> (out',
ref', magnitude' or a function making it, message), or None where it changes nothing.
Alternatives are the float64 reference (measure/reference.py) with changed arguments, or a
transform of the output. Only the forward output is tried, only on rows whose output
disagrees, and no impl is called for them; an alternative's magnitude only where the output
lies within FAR of it. ``inputs`` is the case's run.inputs.Inputs (q, k, v, scale, mask), read by
attribute.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import torch

from attnbench.case import Case
from attnbench.errors import one_line
from attnbench.masks import KINDS, offset
from attnbench.masks.interval import Interval, IntervalKind
from attnbench.measure import agreement
from attnbench.measure.agreement import Truth, Verdict
from attnbench.measure.reference import Magnitude, magnitude, reference

# An output further than this share of an alternative's norm from it is no match (a match is
# within the rule's bound, a few u); its magnitude, the costlier half, is then not computed.
FAR = 0.5
EAGER_ERROR_CHARS = 200  # of an eager call's error in its note
HYPHEN = {"top_left": "top-left", "bottom_right": "bottom-right"}


class Convention(NamedTuple):
    name: str
    applies: Callable[[Case], bool]
    alternative: Callable  # (case, inputs, out, truth) -> (out, ref, Magnitude | maker, str) | None


def judge(case: Case, inputs, got: list[torch.Tensor], truth: Truth, eager=None) -> Verdict:
    """agreement.judge, plus, when it disagrees, what the disagreement is: for an impl that
    uses torch.compile (``eager``: its call with torch.compile off, () -> (out, grads or
    None) as run.call.Call.check makes them) whether its eager form agrees, and a note per
    convention the output matches."""
    verdict = agreement.judge(case, got, truth)
    found = []
    if verdict.agrees is False and eager is not None:
        found.append(eager_note(case, eager, truth))
    if verdict.failures and verdict.failures[0] and truth.mag is not None:
        found += explain(case, inputs, got[0], truth)
    elif verdict.failures and verdict.failures[0] and truth.explain is not None:
        found += truth.explain(got[0])  # level layer: the conventions its reference knows
    return dataclasses.replace(verdict, notes=[*verdict.notes, *found]) if found else verdict


def eager_note(case: Case, eager, truth: Truth) -> str:
    """Who is at fault when a compiled impl disagrees: the same call with torch.compile off,
    judged by the same rule. Its failure (out of memory: eager FlexAttention holds the whole
    score matrix) is a note; the row's verdict stands."""
    try:
        out, grads = eager()
    except Exception as exc:  # noqa: BLE001 - a failed diagnosis is a note, never the row's
        text = one_line(f"{type(exc).__name__}: {exc}", EAGER_ERROR_CHARS)
        return f"eager not checked: {text}"
    compiler = f"torch.compile, torch {torch.__version__}"
    if agreement.judge(case, [out, *(grads or ())], truth).agrees:
        return f"eager agrees: the compiled output is wrong ({compiler})"
    return f"eager disagrees too: the impl is wrong with torch.compile off as well ({compiler})"


def explain(case: Case, inputs, out: torch.Tensor, truth: Truth) -> list[str]:
    """The notes of the conventions ``out`` (the call's forward output) matches. Out of
    memory stops the search with a note (the row's verdict stands)."""
    notes = []
    for convention in conventions():
        if not convention.applies(case):
            continue
        try:
            alt = convention.alternative(case, inputs, out, truth)
        except (torch.OutOfMemoryError, MemoryError):
            return [*notes, f"no diagnosis past {convention.name}: out of memory"]
        if alt is None:
            continue
        got, ref, mag, message = alt
        if _far(got, ref) or _alike(ref, truth, case):
            continue
        mag = mag() if callable(mag) else mag
        if agreement.agrees(agreement.error(got, ref, mag, "out", case.torch_dtype)):
            notes.append(f"out matches {message}")
    return notes


def _alike(ref: torch.Tensor, truth: Truth, case: Case) -> bool:
    """The alternative's reference agrees with the case's by the rule: within the rounding a
    correct computation may show, it tells nothing apart (a scale 1 under a modifier that
    makes the softmax one-hot gives the same output), so a match would explain nothing."""
    if ref is truth.ref[0]:  # the alternative transforms the output, not the reference
        return False
    alike = agreement.error(ref, truth.ref[0], truth.mag[0], "out", case.torch_dtype)
    return agreement.agrees(alike)


def _far(got: torch.Tensor, ref: torch.Tensor) -> bool:
    """||got - ref|| > FAR ||ref||, or got is not finite: no match, by far."""
    gap = torch.linalg.vector_norm(got.detach().to(ref.dtype) - ref).item()
    return not gap <= FAR * torch.linalg.vector_norm(ref).item()


def _recomputed(case: Case, inputs, truth: Truth, k=None, v=None, **changed):
    """The float64 reference of ``out`` with ``changed`` arguments (scale=, mask=; k, v
    replaced where given) and a function computing its magnitude, or None when they leave the
    reference as it was (or a changed mask is None: the case has no such neighbour)."""
    if "mask" in changed and changed["mask"] is None:
        return None
    args = dict(causal=case.causal, scale=inputs.scale, mask=inputs.mask)
    args.update(changed)
    k = inputs.k if k is None else k
    v = inputs.v if v is None else v
    ref, _ = reference(inputs.q, k, v, **args)
    if torch.equal(ref, truth.ref[0]):
        return None
    return ref, lambda: magnitude(inputs.q, k, v, **args)[0]


def _moved(inputs, delta: int = 0, widen: int = 0, align: str | None = None):
    """The case's mask with its interval's query positions moved by ``delta`` and its far
    edge widened by ``widen`` (and, with ``align``, its score modifier's positions on that
    alignment); None for a mask that is not one interval per query, or an empty interval."""
    mask = inputs.mask
    moved = mask.layout.moved(delta, widen) if isinstance(mask.layout, Interval) else None
    if moved is None:
        return None
    return dataclasses.replace(mask, layout=moved, align=align or mask.align, _cache={})


def _other_align(case, inputs, out, truth):
    other = "top_left" if case.causal_align == "bottom_right" else "bottom_right"
    delta = offset(other, case.seq_q, case.seq_kv) - case.shift
    found = _recomputed(case, inputs, truth, mask=_moved(inputs, delta, align=other))
    what = "causal" if case.causal else case.mask
    message = f"{HYPHEN[other]} {what}; declared {HYPHEN[case.causal_align]}"
    return None if found is None else (out, *found, message)


def _kv_head_mod(case, inputs, out, truth):
    group = case.heads // case.kv_heads
    # query head h reads kv head h % Hkv: (B, Hkv, Skv, D) -> (B, Hq, Skv, D)
    k, v = inputs.k.repeat(1, group, 1, 1), inputs.v.repeat(1, group, 1, 1)
    found = _recomputed(case, inputs, truth, k=k, v=v)
    message = (
        f"kv head h % Hkv for query head h; the convention is h // {group} "
        f"(Hq/Hkv = {group} consecutive query heads per kv head); an impl of that order "
        f'declares head_order="interleaved"'
    )
    return None if found is None else (out, *found, message)


def _near_miss(name: str):
    """A near miss the case's mask kind declares (masks.MaskKind.near_miss)."""

    def alternative(case, inputs, out, truth):
        found = case.kind.near_miss(name, inputs.mask.layout)
        if found is None:
            return None
        layout, message = found
        near = dataclasses.replace(inputs.mask, layout=layout, _cache={})
        found = _recomputed(case, inputs, truth, mask=near)
        return None if found is None else (out, *found, message)

    return alternative


def _diagonal(delta: int):
    """The causal diagonal moved by ``delta`` (``triu(2)`` or ``triu(0)`` where the mask is
    ``triu(1)``): query i at position p sees keys j <= p + delta. As the reference's query
    positions moved by ``delta`` (shift), with the interval's far edge kept where it has one.
    Rows the move leaves with no key (delta -1) may be NaN in ``out`` (a softmax over
    nothing): they are read as zero, the reference's value there, and the note says so."""

    def alternative(case, inputs, out, truth):
        found = _recomputed(case, inputs, truth, mask=_moved(inputs, delta, widen=delta))
        if found is None:
            return None
        ref, mag = found
        what = "also sees the next key" if delta > 0 else "misses its own key"
        message = f"the causal diagonal shifted by {delta:+d}: each query {what}"
        nan = out.isnan().all(-1, keepdim=True)  # (B, Hq, Sq, 1)
        if nan.any() and (ref.masked_select(nan) == 0).all():
            out = out.masked_fill(nan, 0.0)
            message += f", NaN in the {int(nan.sum())} rows it leaves with no key"
        return out, ref, mag, message

    return alternative


def _keyless(fill: str):
    """Rows with no visible key (zero in the reference) as ``fill``: uniform over all keys
    (a finite mask value) or NaN (a softmax over nothing)."""

    def alternative(case, inputs, out, truth):
        empty = truth.mag[0].terms == 0  # (B, Hq, Sq, 1): queries that see no key
        if not empty.any():
            return None
        rows = int(empty.sum())  # (batch, head, query) rows
        ref, mag = truth.ref[0], truth.mag[0]
        if fill == "nan":
            if not (out.isnan().all(-1, keepdim=True) == empty).all():
                return None
            message = f"NaN in the {rows} rows with no visible key; the convention is zero there"
            return out.masked_fill(empty, 0.0), ref, mag, message
        group = case.heads // case.kv_heads
        v = inputs.v.detach().to(torch.float64).repeat_interleave(group, 1)  # (B, Hq, Skv, D)
        n = v.shape[2]
        mean = v.mean(2, keepdim=True)  # (B, Hq, 1, D): each key weighted 1 / Skv
        m = mean.abs() + v.square().sum(2, keepdim=True).sqrt() / n
        uniform = Magnitude(
            torch.where(empty, m, mag.m), torch.where(empty, n, mag.terms), mag.under, mag.mod
        )
        message = (
            f"the mean of all keys' values in the {rows} rows with no visible key; "
            f"the convention is zero there"
        )
        return out, torch.where(empty, mean, ref), uniform, message

    return alternative


def _scale(which: str):
    def alternative(case, inputs, out, truth):
        value = 1.0 if which == "1" else case.head_dim**-0.5
        if inputs.scale == value:
            return None
        found = _recomputed(case, inputs, truth, scale=value)
        rsqrt = " = 1/sqrt(D)" if inputs.scale == case.head_dim**-0.5 else ""
        message = f"scale {which}; declared {inputs.scale:.4g}{rsqrt}"
        return None if found is None else (out, *found, message)

    return alternative


def _unmodified(case, inputs, out, truth):
    unmodified = dataclasses.replace(inputs.mask, score_mod=None, _cache={})
    found = _recomputed(case, inputs, truth, mask=unmodified)
    message = f"without score_mod {case.score_mod}; declared {case.score_mod}"
    return None if found is None else (out, *found, message)


def _transposed(case, inputs, out, truth):
    B, Hq, Sq, D = out.shape
    read = out.reshape(B, Sq, Hq, D).transpose(1, 2)  # its values in (B, S, H, D) order
    message = "when read in (B, S, H, D) order: a missing transpose; declared (B, H, S, D)"
    return read, truth.ref[0], truth.mag[0], message


def _masked(case: Case) -> bool:
    return case.causal or case.mask != "none"


def _plain_causal(case: Case) -> bool:
    """Causal, its mask an interval kind (none, padding, ...), no score modifier: the
    cases whose diagonal the reference's shift moves alone."""
    return case.causal and isinstance(case.kind, IntervalKind) and not case.score_mod


GEOMETRY = (
    Convention(
        "causal_align",
        lambda c: (c.causal or c.kind.aligned) and c.seq_q != c.seq_kv,
        _other_align,
    ),
    Convention("kv_head_mod", lambda c: c.gqa, _kv_head_mod),
    Convention("diagonal_plus_1", _plain_causal, _diagonal(+1)),
    Convention("diagonal_minus_1", _plain_causal, _diagonal(-1)),
)
OTHERS = (
    Convention("keyless_uniform", _masked, _keyless("uniform")),
    Convention("keyless_nan", _masked, _keyless("nan")),
    Convention("scale_1", lambda c: True, _scale("1")),
    Convention("scale_rsqrt_d", lambda c: True, _scale("1/sqrt(D)")),
    Convention("transpose", lambda c: c.heads > 1 and c.seq_q > 1, _transposed),
    Convention("score_mod_missing", lambda c: bool(c.score_mod), _unmodified),
)


def conventions() -> list[Convention]:
    """Every convention tried, in order: the geometry's, those each registered mask kind
    declares (its ``near_misses``), the others."""
    kinds = [
        Convention(name, lambda c, k=kind.name: c.mask == k, _near_miss(name))
        for kind in KINDS.values()
        for name in kind.near_misses
    ]
    return [*GEOMETRY, *kinds, *OTHERS]
