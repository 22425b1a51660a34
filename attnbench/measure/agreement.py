"""The agreement rule: a call's errors against the float64 reference (measure/reference.py),
the rule's bounds on them, the criteria they fail and the row's verdict.

The rule, its constants and the magnitude's formulas are written once, in docs/method.md ("The
agreement rule"); scripts/calibrate_accuracy.py derives the constants and
docs/accuracy_calibration.md holds its table. Level ``layer`` keeps the legacy rule
(``legacy_error``, ``legacy_bound``, ``legacy_agrees``; also in docs/method.md), because the
magnitude is defined for the attention op only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from attnbench.case import Case
from attnbench.measure import precision
from attnbench.measure.reference import Magnitude

# The rule's constants (docs/method.md), calibrated by scripts/calibrate_accuracy.py
# (docs/accuracy_calibration.md). u = unit roundoff = eps / 2.
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
ACC_UNIT_ROUNDOFF = 2.0**-24  # float32's: the type kernels add their long sums in
C_NORM = {
    torch.float32: {"out": 32.0, "grad": 32.0},
    torch.bfloat16: {"out": 2.25, "grad": 2.5},
    torch.float16: {"out": 2.5, "grad": 3.5},
}  # (norm): ||d|| <= min(C_NORM u ||r|| + C_UNDER u ||under|| + C_MOD u ||mod||
#                  + C_GROUP u ||group|| + C_ACC u_acc ||sqrt(n) m||, FAR ||r||)
C_ZERO = {torch.float32: 4.0, torch.bfloat16: 0.5, torch.float16: 0.5}  # ||d|| <= C_ZERO u ||m||
C_ELEM = {
    torch.float32: {"out": 32.0, "grad": 512.0},
    torch.bfloat16: {"out": 4.0, "grad": 32.0},
    torch.float16: {"out": 4.0, "grad": 32.0},
}  # (elem): |d_e| <= (C_ELEM u + C_ACC_ELEM u_acc sqrt(n_e)) max(m_e, TAU rms(m))
#                     + sqrt(2 ln N) u mod_e
C_BIAS = {torch.bfloat16: 1.0}  # (bias): |<d, r>| / ||r||^2 <= C_BIAS u + the modifier's terms
#                                 other dtypes: none
C_UNDER = 1.0  # probabilities below the smallest normal number: their rounding's size
C_MOD = 1.0  # a score modifier's rounding, on the grid it lands on (calibrated, docs/method.md)
C_MOD_BIAS = 1.0  # and along the reference: a walk over rows (row_walk), plus its second
#                   order (u ||mod|| / ||r||)^2 / 2, the mean of e^delta - 1 - delta
C_ACC = 0.25  # the accumulation's share of (norm), any dtype (the sums are float32)
C_ACC_ELEM = 1.0  # and of (elem)
C_GROUP = 1.0  # a GQA kv head's gradient summed over its query heads in the case dtype
BETA = 0.02  # ||r|| < BETA ||scale||: the reference is (near) zero, (norm) becomes absolute
N_STAT = 256  # (norm) and (bias) are statistics of this many elements or more; below, the floor
FAR = 0.5  # the floor: no bound passes an error of FAR ||r|| (a zero output errs by ||r||)
TAU = 0.1  # (elem) divides by max(m_e, TAU * rms(m)): no bound below a tenth of the typical


def unit_roundoff(dtype: torch.dtype) -> float:
    return UNIT_ROUNDOFF.get(dtype, torch.finfo(dtype).eps / 2)


def _kind(tensor: str) -> str:
    return "out" if tensor == "out" else "grad"


@dataclass(frozen=True)
class Error:
    """Errors of one tensor against its reference, with the rule's bounds on them.

    err_norm: ||d||; norm_bound: what (norm) allows it (the rel form, or the absolute one when
    the reference is near zero). rel: ||d|| / ||r||, or None when the reference is near zero
    (||r|| < BETA ||m||). elem_err: |d_e| at the element e nearest (or furthest past) its own
    bound, elem_bound that bound, elem_index its index. bias: <d, r> / ||r||^2, the error's
    share along the reference (a wrong scale is all along it; rounding mostly across it),
    bias_bound what (bias) allows its size (None: not checked in this dtype, or the reference
    is near zero). max_abs: max |d| over the tensor (for the CSV). terms: the most terms any
    element's sum adds. under_norm, acc_norm: ||under|| and u_acc ||sqrt(n) m||, the parts
    of norm_bound the constants multiply, mod_norm ||mod|| (the score modifier's part) and
    group_norm ||group|| (a GQA kv head's sum over its query heads); mod_walk the modifier's
    walk along the reference (``row_walk``), the part of bias_bound that C_MOD_BIAS u /
    ||r||^2 multiplies. scale_norm: ||scale||, the size of the terms that says whether the
    reference is near zero. statistical: the tensor has N_STAT elements or more, so (norm)
    and (bias) hold as statistics; below, (norm) is its floor alone and (bias) is not
    checked."""

    max_abs: float
    rel: float | None
    ref_norm: float
    mag_norm: float
    err_norm: float
    norm_bound: float
    elem_err: float
    elem_bound: float
    elem_index: tuple = ()
    terms: int = 1
    bias: float = 0.0
    bias_bound: float | None = None
    under_norm: float = 0.0
    acc_norm: float = 0.0
    mod_norm: float = 0.0
    group_norm: float = 0.0
    mod_walk: float = 0.0
    scale_norm: float | None = None
    statistical: bool = True

    @property
    def finite(self) -> bool:
        return math.isfinite(self.max_abs)

    @property
    def near_zero(self) -> bool:
        """The reference is (near) zero: (norm) is the absolute one, from ||m||."""
        scale = self.mag_norm if self.scale_norm is None else self.scale_norm
        return _near_zero(self.ref_norm, scale)

    @property
    def abs_ratio(self) -> float:
        """||d|| / ||m||."""
        if self.mag_norm:
            return self.err_norm / self.mag_norm
        return 0.0 if self.err_norm == 0 else math.inf

    @property
    def rel_bound(self) -> float | None:
        """(norm) as a bound on ``rel``; None when the reference is near zero."""
        return None if self.near_zero else self.norm_bound / self.ref_norm

    @property
    def norm_share(self) -> float:
        """||d|| / its bound (1.0: at the bound)."""
        return _share(self.err_norm, self.norm_bound)

    @property
    def elem_share(self) -> float:
        """|d_e| / its bound at the element nearest its bound."""
        return _share(self.elem_err, self.elem_bound)


def _near_zero(ref_norm: float, scale_norm: float) -> bool:
    """||r|| < BETA ||scale||, or r is all zero."""
    return ref_norm < BETA * scale_norm or ref_norm == 0


def _share(err: float, bound: float) -> float:
    """err / bound, where a zero bound holds only a zero error."""
    if bound > 0:
        return err / bound
    return 0.0 if err == 0 else math.inf


def error(
    x: torch.Tensor,
    ref: torch.Tensor,
    mag: Magnitude,
    tensor: str = "out",
    dtype: torch.dtype | None = None,
) -> Error:
    """Errors of ``x`` against ``ref`` (float64) and the rule's bounds, given ``mag``
    (``magnitude``'s entry for the same tensor), for tensor ``tensor`` ("out", "dq", "dk",
    "dv") of a case in ``dtype`` (default: x's). Computed in float64; NaN/Inf in x give inf."""
    dtype = x.dtype if dtype is None else dtype
    u, kind, f64 = unit_roundoff(dtype), _kind(tensor), torch.float64
    x64, r64, m64 = (t.detach().to(f64) for t in (x, ref, mag.m))
    root_n = mag.terms.to(f64).sqrt()  # broadcasts against m
    ref_norm, mag_norm = _norm(r64), _norm(m64)
    parts = {p: _norm(getattr(mag, p)) for p in ("under", "mod", "group")}
    scale = mag_norm if mag.scale is None else _norm(mag.scale)
    accumulated = ACC_UNIT_ROUNDOFF * _norm(root_n * m64)
    statistical = int((m64 > 0).sum()) >= N_STAT
    near_zero = _near_zero(ref_norm, scale)
    if near_zero:  # the absolute form, and its floor from the terms' size
        base, floor_norm = C_ZERO[dtype] * u * mag_norm, FAR * scale
    else:
        base, floor_norm = C_NORM[dtype][kind] * u * ref_norm, FAR * ref_norm
    norm_bound = base + _walks(parts, accumulated, u)
    norm_bound = min(norm_bound, floor_norm) if statistical else floor_norm
    terms = int(mag.terms.max().item()) if mag.terms.numel() else 0
    extra = dict(
        under_norm=parts["under"], acc_norm=accumulated, mod_norm=parts["mod"],
        group_norm=parts["group"], mod_walk=row_walk(mag.mod, r64), scale_norm=scale,
        statistical=statistical,
    )  # fmt: skip
    if not torch.isfinite(x64).all():
        inf = math.inf
        return Error(
            inf, inf, ref_norm, mag_norm, inf, norm_bound, inf, math.nan, (), terms, **extra
        )
    bias = 0.0 if near_zero else ((x64 - r64) * r64).sum().item() / ref_norm**2
    bias_bound = None
    if statistical and not near_zero and dtype in C_BIAS:
        walk = C_MOD_BIAS * u * extra["mod_walk"] / ref_norm**2
        bias_bound = C_BIAS[dtype] * u + walk + (u * parts["mod"] / ref_norm) ** 2 / 2
    d = (x64 - r64).abs()
    b = _elem_bound(m64, root_n, mag, u, dtype, kind).expand_as(d)
    ratio = torch.where(d == 0, torch.zeros_like(d), d / b)
    at = int(ratio.flatten().argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(at), d.shape))
    err_norm = _norm(d)
    return Error(
        d.max().item(),
        None if near_zero else (err_norm / ref_norm if err_norm else 0.0),
        ref_norm,
        mag_norm,
        err_norm,
        norm_bound,
        d.flatten()[at].item(),
        b.flatten()[at].item(),
        index,
        terms,
        bias,
        bias_bound,
        **extra,
    )


def _walks(parts: dict, accumulated: float, u: float) -> float:
    """(norm)'s terms beyond the dtype's constant: the long sums' and the random walks of
    underflow, a score modifier and a GQA kv head's sum over its query heads."""
    walks = C_UNDER * parts["under"] + C_MOD * parts["mod"] + C_GROUP * parts["group"]
    return C_ACC * accumulated + u * walks


def row_walk(mod: torch.Tensor | None, r64: torch.Tensor) -> float:
    """The random walk of a score modifier's rounding along the reference, over the rows
    (the last dim: one query's output, one key's gradient): sqrt(sum_rows ||mod_row||^2
    ||r_row||^2). A row's rounding may lie wholly along its own reference (a near one-hot
    softmax moves its output towards or away from the dominant value), and rows add as a
    random walk: over R alike rows it is ||mod|| ||r|| / sqrt(R). 0 without a modifier."""
    if mod is None:
        return 0.0
    per_row = mod.to(torch.float64).square().sum(-1) * r64.square().sum(-1)
    return per_row.sum().sqrt().item()


def _norm(t: torch.Tensor | None) -> float:
    """||t|| in float64 (0 for None)."""
    return 0.0 if t is None else torch.linalg.vector_norm(t.to(torch.float64)).item()


def _elem_bound(m64, root_n, mag: Magnitude, u: float, dtype, kind: str) -> torch.Tensor:
    """(elem)'s bound per element: (C_ELEM u + C_ACC_ELEM u_acc sqrt(n_e)) max(m_e, TAU rms m),
    plus the score modifier's rounding at the element, sqrt(2 ln N) u mod_e: mod_e is the
    size (standard deviation) of a random walk, and the largest of N such errors stays within
    sqrt(2 ln N) of it."""
    floor = TAU * m64.square().mean().sqrt().item()
    per_elem = C_ELEM[dtype][kind] * u + C_ACC_ELEM * ACC_UNIT_ROUNDOFF * root_n
    b = per_elem * torch.clamp(m64, min=floor)
    if mag.mod is not None:
        b = b + math.sqrt(2 * math.log(max(m64.numel(), 2))) * u * mag.mod.to(torch.float64)
    return b


def bound(err: Error) -> tuple[float | None, float]:
    """(rel bound, max-abs bound): ``err.rel`` must stay within the first (None when the
    reference is near zero: then ``err.err_norm`` within ``err.norm_bound``) and
    ``err.elem_err`` (|d| at the element nearest its own bound) within the second."""
    return err.rel_bound, err.elem_bound


def failed(err: Error) -> list[str]:
    """The criteria ``err`` fails ([] when it agrees): 'non-finite', 'rel', 'abs (reference
    near zero)', 'bias' (the error along the reference), 'max-abs' (the element-wise one)."""
    if not err.finite:
        return ["non-finite"]
    out = []
    if err.err_norm > err.norm_bound:
        out.append("abs (reference near zero)" if err.near_zero else "rel")
    if err.bias_bound is not None and abs(err.bias) > err.bias_bound:
        out.append("bias")
    if err.elem_err > err.elem_bound:
        out.append("max-abs")
    return out


def agrees(err: Error) -> bool:
    """The rule (docs/method.md)."""
    return not failed(err)


@dataclass(frozen=True)
class Verdict:
    """A rule's verdict on one call: per checked tensor its errors (``Error``, or
    ``LegacyError`` at level layer) and failed criteria, the row's accuracy columns, and the
    notes for its ``reason``."""

    errors: list
    failures: list[list[str]]
    columns: dict
    notes: list[str]

    @property
    def agrees(self) -> bool | None:
        """The row's ``agrees``; None when there was no reference to judge against."""
        return self.columns.get("agrees")


class Shown(NamedTuple):
    """One tensor's numbers as a row shows them, by either rule: ``rel`` (None where it is
    not defined) against ``rel_bound``, ``abs_err`` against ``abs_bound``; the shares (error
    / bound) pick the tensor that speaks for each pair of columns."""

    rel: float | None
    rel_bound: float | None
    rel_share: float
    abs_err: float
    abs_bound: float
    abs_share: float


def _verdict(errs: list, fails: list, shown: list[Shown], notes: list[str], bad, header) -> Verdict:
    """Both rules' tail: the disagreement note, and the row's columns from the tensor nearest
    to (or furthest past) each bound; only ``agrees`` when some tensor is not finite."""
    if bad:
        notes.append(f"{header}: " + "; ".join(bad))
    if not all(e.finite for e in errs):
        return Verdict(errs, fails, {"agrees": False}, notes)
    with_rel = [k for k in range(len(shown)) if shown[k].rel is not None]
    i = max(with_rel, key=lambda k: shown[k].rel_share, default=None)
    j = max(range(len(shown)), key=lambda k: shown[k].abs_share)
    columns = {
        "max_abs_err": shown[j].abs_err,
        "max_abs_bound": shown[j].abs_bound,
        "rel_err": None if i is None else shown[i].rel,
        "err_bound": None if i is None else shown[i].rel_bound,
        "agrees": not bad,
    }
    return Verdict(errs, fails, columns, notes)


@dataclass
class Truth:
    """Per case: the float64 reference and what its rule needs (docs/method.md): at level op
    the float64 magnitudes, at level layer the legacy rule's baseline (the textbook formula's
    error in the case dtype); or why there is none (``failure``)."""

    ref: list[torch.Tensor] | None  # out (+ its grads), canonical layout, float64
    mag: list[Magnitude] | None = None  # level op: reference.magnitude, as ref
    baseline: list[LegacyError] | None = None  # level layer only
    failure: str | None = None
    names: list[str] | None = None  # of ref's tensors; None: checked_names(case)
    # level layer: out (disagreeing) -> notes on a convention it matches (run/measuring/layer.py)
    explain: Callable[[torch.Tensor], list[str]] | None = None
    # level op, low precision: out of a float32-accumulating kernel (measure/precision.py)
    fp32_acc: torch.Tensor | None = None


def checked_names(case: Case) -> list[str]:
    """The tensors compared with the reference, in Call.check's order."""
    grads = ["dq", "dk", "dv"] if case.level == "op" else ["dx", "dwq", "dwk", "dwv", "dwo"]
    return ["out", *(grads if case.backward else [])]


def judge(case: Case, got: list[torch.Tensor], truth: Truth) -> Verdict:
    """The verdict a row gets (and the calibration counts) on the checked tensors ``got``
    (``checked_names``) of one call: the rule at level op, the legacy rule at level layer,
    none (a note, blank columns) when the case has no reference. At level op a low-precision
    row also gets its precision figure against a float32-accumulating kernel
    (measure/precision.py), apart from the verdict."""
    if truth.failure:
        return Verdict([], [], {}, [truth.failure])
    names, dtype = truth.names or checked_names(case), case.torch_dtype
    if truth.baseline is not None:
        return legacy_rule(names, got, truth.ref, truth.baseline, dtype)
    verdict = rule(names, got, truth.ref, truth.mag, dtype)
    columns, note = precision.judged(
        got[0], truth.ref[0], truth.fp32_acc, truth.mag[0].m, verdict.agrees
    )
    verdict.columns.update(columns)
    verdict.notes.extend([note] if note else [])
    return verdict


def rule(
    names: list[str],
    got: list[torch.Tensor],
    ref: list[torch.Tensor],
    mags: list[Magnitude],
    dtype: torch.dtype,
) -> Verdict:
    """The rule (docs/method.md) on the checked tensors ``names`` (out, dq, dk, dv) of one
    call, in the case's ``dtype``. ``columns`` are the row's max_abs_err, max_abs_bound,
    rel_err, err_bound and agrees."""
    errs = [error(x, r, m, n, dtype) for n, x, r, m in zip(names, got, ref, mags)]
    fails = [failed(e) for e in errs]
    notes, bad = [], []
    for n, e, why in zip(names, errs, fails):
        if e.finite and e.near_zero:
            notes.append(
                f"{n}: the reference is zero (||ref|| < {BETA:g} ||magnitude||), so rel_err "
                f"is not defined; judged by ||err|| = {e.abs_ratio:.3g} ||magnitude|| <= "
                f"{_share(e.norm_bound, e.mag_norm):.3g} ||magnitude||"
            )
        for criterion in why:
            if criterion == "non-finite":
                bad.append(f"{n} non-finite (NaN/Inf)")
            elif criterion == "rel":
                bad.append(f"{n} rel {e.rel:.3g} > {e.rel_bound:.3g}")
            elif criterion == "max-abs":
                bad.append(f"{n} max-abs {e.elem_err:.3g} > {e.elem_bound:.3g} at {e.elem_index}")
            elif criterion == "bias":
                bad.append(
                    f"{n} bias (the error along the reference, <err, ref> / ||ref||^2) "
                    f"{e.bias:.3g}, beyond +-{e.bias_bound:.3g}"
                )
            else:
                bad.append(
                    f"{n} abs (reference zero): ||err|| = {e.abs_ratio:.3g} ||magnitude|| > "
                    f"{_share(e.norm_bound, e.mag_norm):.3g} ||magnitude||"
                )
    shown = [
        Shown(e.rel, e.rel_bound, e.norm_share, e.elem_err, e.elem_bound, e.elem_share)
        for e in errs
    ]
    return _verdict(errs, fails, shown, notes, bad, "disagrees with the float64 reference")


# --- level layer: the legacy rule (docs/method.md) -----------------------------------------
AGREE_FACTOR = 2.0  # within 2x the same-dtype textbook baseline's error
ABS_FLOOR_EPS = 4.0  # plus 4 eps max|ref| on the max abs error (one eps on the relative one)


@dataclass(frozen=True)
class LegacyError:
    """Level layer only: errors for the legacy rule (docs/method.md)."""

    max_abs: float
    rel: float
    ref_max_abs: float

    @property
    def finite(self) -> bool:
        return math.isfinite(self.max_abs) and math.isfinite(self.rel)


def legacy_error(x: torch.Tensor, ref: torch.Tensor) -> LegacyError:
    """Errors of ``x`` against ``ref``, computed in float64; NaN/Inf in x give inf."""
    x64, r64 = x.detach().to(torch.float64), ref.detach().to(torch.float64)
    if not torch.isfinite(x64).all():
        return LegacyError(math.inf, math.inf, r64.abs().max().item())
    diff = x64 - r64
    ref_norm = torch.linalg.vector_norm(r64).item()
    return LegacyError(
        diff.abs().max().item(),
        torch.linalg.vector_norm(diff).item() / max(ref_norm, 1e-300),
        r64.abs().max().item(),
    )


def legacy_bound(baseline: LegacyError, dtype: torch.dtype) -> tuple[float, float]:
    """(rel bound, max-abs bound) for a tensor whose baseline error is ``baseline``."""
    eps = torch.finfo(dtype).eps
    return (
        AGREE_FACTOR * baseline.rel + eps,
        AGREE_FACTOR * baseline.max_abs + ABS_FLOOR_EPS * eps * baseline.ref_max_abs,
    )


def legacy_agrees(err: LegacyError, baseline: LegacyError, dtype: torch.dtype) -> bool:
    rel_bound, abs_bound = legacy_bound(baseline, dtype)
    return err.finite and err.rel <= rel_bound and err.max_abs <= abs_bound


def legacy_rule(
    names: list[str],
    got: list[torch.Tensor],
    ref: list[torch.Tensor],
    baseline: list[LegacyError],
    dtype: torch.dtype,
) -> Verdict:
    """Level layer: the legacy rule (docs/method.md), within 2x the error of the textbook
    formula in the case dtype plus a floor. A non-finite tensor is the whole verdict (the
    others' criteria are not listed)."""
    errs = [legacy_error(x, r) for x, r in zip(got, ref)]
    if not all(e.finite for e in errs):
        fails = [[] if e.finite else ["non-finite"] for e in errs]
        bad = [f"{n} non-finite (NaN/Inf)" for n, e in zip(names, errs) if not e.finite]
        return _verdict(errs, fails, [], [], bad, "disagrees with the float64 reference")
    bounds = [legacy_bound(b, dtype) for b in baseline]
    notes, bad, fails, shown = [], [], [], []
    for n, e, (rel_b, abs_b), r in zip(names, errs, bounds, ref):
        zero = not bool(r.any())  # rel_err is not defined for it
        why = []
        if zero:
            notes.append(f"{n}: the reference is exactly zero, so rel_err is not defined")
        elif e.rel > rel_b:
            why.append("rel")
            bad.append(f"{n} rel {e.rel:.3g} > {rel_b:.3g}")
        if e.max_abs > abs_b:
            why.append("max-abs")
            bad.append(f"{n} max-abs {e.max_abs:.3g} > {abs_b:.3g}")
        fails.append(why)
        rel = None if zero else e.rel
        shown.append(Shown(rel, rel_b, e.rel / rel_b, e.max_abs, abs_b, _share(e.max_abs, abs_b)))
    within = f"over {AGREE_FACTOR:g}x the error of the textbook layer in {str(dtype)[6:]}"
    header = f"disagrees with the float64 reference (level layer: {within})"
    return _verdict(errs, fails, shown, notes, bad, header)
