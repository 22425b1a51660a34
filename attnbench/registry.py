"""The plugin registry: ``register``, capabilities as data and ``reasons(case)``; finding and
loading plugins is plugins.py.

An impl is a function ``(q, k, v, *, causal, scale) -> out`` in the canonical layout
(q (B, Hq, Sq, D), k/v (B, Hkv, Skv, D), out (B, Hq, Sq, D)) or in the layout it declares
(``layout="bshd"``: q (B, Sq, Hq, D), ...), returning out in that layout or in the one it
declares as ``out_layout``; the harness converts outside the timed region.
An impl that declares masks beyond ``none``, score modifiers or the bottom-right causal
alignment is also called with ``mask=`` (a masks.Mask, whose ``align`` says where the diagonal
sits) where its signature takes it (``mask`` or ``**kwargs``, read once at registration): a
bottom-right-only function may take ``causal`` alone, but masks, modifiers and a choice of two
alignments reach an impl only through ``mask=``, so declaring one without it is refused. The
others never see it.

What an impl declares is three small declarations (declarations.py: ``Takes``, ``Supports``,
``Runs``); ``Impl`` is the three with the impl's name and function, and ``register`` also
takes each of their fields as a keyword of its own, as plugins written before them do. Impls
come from four places (plugins.py, which also says which one: ``plugins.impl_origin``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass, field

from attnbench.case import Case
from attnbench.declarations import RegistryError, Runs, Supports, Takes, declared
from attnbench.errors import AttnbenchError
from attnbench.masks import ANY, MODS
from attnbench.masks.scores import lacking

# where the impls being registered come from (a plugin's file, module or entry point; "": the
# program itself); plugins.registering_from sets it around a plugin's import
SOURCE: ContextVar[str] = ContextVar("source", default="")


class NameClash(RegistryError):
    """Two sources register the same impl name: refused, never settled silently."""


@dataclass(frozen=True)
class Impl(Takes, Supports, Runs):
    """A registered impl: its name, its function and what it declares."""

    name: str
    fn: Callable | None
    # work(case, mask) -> the (query, key) pairs its computation covers, masked ones included,
    # per head and summed over the batch, or None where it cannot say (work_flops)
    work: Callable | None = field(default=None, repr=False)
    baseline: bool = False  # the impl speedups are relative to (one per run)
    color: str | None = None  # a matplotlib colour for its lines; None: from the palette
    description: str = ""
    source: str = ""  # where it was registered from (SOURCE)

    @property
    def available(self) -> bool:
        return self.unavailable is None

    @property
    def output_layout(self) -> str:
        return self.out_layout or self.layout

    def backward_on(self, device_type: str) -> bool:
        """Whether it has a backward on this device type."""
        return self.backward is True or (
            not isinstance(self.backward, bool) and device_type in self.backward
        )

    @property
    def takes_mask(self) -> bool:
        """Called with ``mask=``: it declared a mask beyond none, a score modifier or the
        bottom-right alignment, and its function takes ``mask`` (``takes_keyword``)."""
        declared = (
            self.masks != ("none",) or bool(self.score_mods) or self.causal_align != ("top_left",)
        )
        return declared and takes_keyword(self.fn, "mask")

    def reasons(self, case: Case) -> list[str]:
        """Why this impl cannot run ``case``; empty when it can (its own ``check`` is asked
        only when every declared capability fits)."""
        if self.unavailable:
            return [self.unavailable]
        out = [reason for check in CHECKS for reason in check(self, case)]
        if not out and self.check is not None:
            out.extend(self.check(case))
        return out


def aligned_differently(case: Case) -> bool:
    """Whether top-left and bottom-right alignment give this case different masks: a causal
    mask, or a kind the alignment places, across unequal lengths. Elsewhere an impl of either
    alignment runs it."""
    return (case.causal or case.kind.aligned) and case.seq_q != case.seq_kv


# Impl.reasons: each capability's check, (impl, case) -> its reasons, in the order they are said


def _device(impl: Impl, case: Case) -> list[str]:
    if case.device_type in impl.devices:
        return []
    return [f"device={case.device_type} (supported: {', '.join(impl.devices)})"]


def _dtype(impl: Impl, case: Case) -> list[str]:
    if case.dtype in impl.dtypes:
        return []
    return [f"dtype={case.dtype} (supported: {', '.join(impl.dtypes)})"]


def _head_dim(impl: Impl, case: Case) -> list[str]:
    if impl.head_dims is None or case.head_dim in impl.head_dims:
        return []
    return [f"head_dim={case.head_dim} (supported: {', '.join(map(str, impl.head_dims))})"]


def _causal(impl: Impl, case: Case) -> list[str]:
    return ["causal=True (supported: False)"] if case.causal and not impl.causal else []


def _cross(impl: Impl, case: Case) -> list[str]:
    if not case.cross or impl.cross:
        return []
    return [f"seq_q={case.seq_q} != seq_kv={case.seq_kv} (supported: equal lengths)"]


def _gqa(impl: Impl, case: Case) -> list[str]:
    if not case.gqa or impl.gqa:
        return []
    return [f"kv_heads={case.kv_heads} < heads={case.heads} (supported: kv_heads == heads)"]


def _backward_pass(impl: Impl, case: Case) -> list[str]:
    if not case.backward or impl.backward_on(case.device_type):
        return []
    if impl.backward is False:
        return [f"mode={case.mode} (supported: fwd; no backward)"]
    on = ", ".join(impl.backward)
    return [f"mode={case.mode} on {case.device_type} (supported: fwd; backward on {on} only)"]


def _mask(impl: Impl, case: Case) -> list[str]:
    if case.mask in impl.masks or ANY[0] in impl.masks:
        return []
    return [f"mask={case.mask} (supported: {', '.join(impl.masks)})"]


def _score_mod(impl: Impl, case: Case) -> list[str]:
    modifier = case.score_mod.partition(":")[0]
    if not modifier:
        return []
    if modifier in impl.score_mods or ANY[0] in impl.score_mods:
        return lacking(MODS[modifier], impl.score_mod_needs, case.score_mod, case.backward)
    supported = ", ".join(impl.score_mods) or "none"
    return [f"score_mod={case.score_mod} (supported: {supported})"]


def _align(impl: Impl, case: Case) -> list[str]:
    if case.causal_align in impl.causal_align or not aligned_differently(case):
        return []
    return [f"causal_align={case.causal_align} (supported: {', '.join(impl.causal_align)})"]


def _level(impl: Impl, case: Case) -> list[str]:
    if impl.module and case.level != "layer":
        return [f"level={case.level} (supported: layer; a module brings its own projections)"]
    if impl.paged and case.level != "op":
        return [f"level={case.level} (supported: op; a paged KV cache is an op input)"]
    return []


def _paged_backward(impl: Impl, case: Case) -> list[str]:
    if not (impl.paged and case.backward and impl.backward_on(case.device_type)):
        return []
    return [f"mode={case.mode} (supported: fwd; a paged KV cache is read-only)"]


def _sm(impl: Impl, case: Case) -> list[str]:
    """The GPU's compute capability against ``sm`` (only where CUDA is visible)."""
    if impl.sm is None or case.device_type != "cuda" or not _cuda_visible():
        return []
    have, (low, high) = _capability(case.device), impl.sm
    if have >= low and (high is None or have <= high):
        return []
    span = f"sm_{low} to sm_{high}" if high is not None else f"sm_{low} and newer"
    return [f"compute_capability=sm_{have} (supported: {span})"]


CHECKS = (
    _device,
    _dtype,
    _head_dim,
    _causal,
    _cross,
    _gqa,
    _backward_pass,
    _mask,
    _score_mod,
    _align,
    _level,
    _paged_backward,
    _sm,
)


def _cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def _capability(device: str) -> int:
    """The compute capability of the GPU ``device`` as a number: sm_90 is 90."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return major * 10 + minor


@functools.cache
def takes_keyword(fn: Callable, name: str) -> bool:
    """Whether ``fn`` takes the keyword argument ``name`` (or ``**kwargs``); read once per
    function (registration reads it first). A function without a readable signature: True."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    keyword = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return any(
        p.kind is inspect.Parameter.VAR_KEYWORD or (p.name == name and p.kind in keyword)
        for p in params
    )


def _check_mask_param(impl: Impl) -> None:
    """Masks, score modifiers and a choice of two alignments reach an impl only as ``mask=``:
    declaring one with a function that does not take it is refused (a bottom-right-only impl
    needs ``causal`` alone)."""
    if impl.module or impl.fn is None or takes_keyword(impl.fn, "mask"):
        return
    extra, needs = tuple(m for m in impl.masks if m != "none"), []
    if extra:
        needs.append(f"masks={extra}")
    if impl.score_mods:
        needs.append(f"score_mods={impl.score_mods}")
    if len(impl.causal_align) > 1:
        needs.append(f"causal_align={impl.causal_align}")
    if needs:
        raise RegistryError(
            f"impl {impl.name!r}: {' and '.join(needs)} reach it only as mask=, which "
            f"{getattr(impl.fn, '__name__', 'its function')}{inspect.signature(impl.fn)} does "
            f"not take; add mask to its keyword arguments (q, k, v, *, causal, scale, mask)"
        )


def _check_call(impl: Impl) -> None:
    """The function must take the call the harness makes: ``fn(q, k, v, causal=, scale=)``
    (with ``mask=`` where it takes it, ``block_table=`` and ``seq_kv=`` when paged), or a
    module factory's ``fn(case, mask)``. One that cannot is refused at registration, not on
    every row."""
    if impl.fn is None:
        return
    try:
        sig = inspect.signature(impl.fn)
    except (TypeError, ValueError):  # no readable signature (a builtin): the rows will say
        return
    if impl.module:
        args, kwargs, call = ("case", "mask"), {}, "(case, mask)"
    else:
        args, kwargs = ("q", "k", "v"), {"causal": False, "scale": 1.0}
        if impl.takes_mask:
            kwargs["mask"] = None
        if impl.paged:
            kwargs |= {"block_table": None, "seq_kv": 1}
        call = f"(q, k, v, *, {', '.join(kwargs)})"
    try:
        sig.bind(*args, **kwargs)
    except TypeError as exc:
        raise RegistryError(
            f"impl {impl.name!r}: {getattr(impl.fn, '__name__', 'its function')}{sig} cannot be "
            f"called as {call} ({exc}); give it those parameters (docs/plugins.md)"
        ) from None


_IMPLS: dict[str, Impl] = {}


def register(
    name: str,
    *,
    takes: Takes = Takes(),
    supports: Supports = Supports(),
    runs: Runs = Runs(),
    work: Callable | None = None,
    baseline: bool = False,
    color: str | None = None,
    description: str = "",
    **keywords,
):
    """Decorator registering an attention function (or, with ``Takes(module=True)``, a module
    factory) with what it takes, supports and where it runs; ``work``, ``baseline``, ``color``
    and ``description`` are Impl's fields of those names (docs/plugins.md's table says what
    each field means and changes). ``keywords``: any field of the three declarations as a
    keyword of its own (``gqa=False``), as plugins written before them do; it amends the
    declaration given (declarations.declared)."""

    def decorate(fn: Callable) -> Callable:
        impl = Impl(
            name,
            fn,
            **declared(name, dict(takes=takes, supports=supports, runs=runs), keywords),
            work=work,
            baseline=baseline,
            color=color,
            description=description or (fn.__doc__ or "").strip().split("\n")[0],
            source=SOURCE.get(),
        )
        _check_call(impl)
        _check_mask_param(impl)
        add(impl)
        return fn

    return decorate


def impls() -> dict[str, Impl]:
    """The registered impls by name (plugins.discover loads them first)."""
    return dict(_IMPLS)


def add(impl: Impl) -> None:
    if not impl.name or impl.name != impl.name.lower() or not impl.name.replace("_", "").isalnum():
        raise RegistryError(f"impl name {impl.name!r} must be short lowercase letters, digits, _")
    old = _IMPLS.get(impl.name)
    if old is not None and old.source != impl.source:
        raise NameClash(
            f"impl name {impl.name!r} is registered twice: by {old.source} and by "
            f"{impl.source or 'this process'}; rename one of them"
        )
    _IMPLS[impl.name] = impl


def baseline(impls: Iterable[Impl]) -> str | None:
    """The name of the impl declared ``baseline=True`` among ``impls`` (the first), or None."""
    return next((i.name for i in impls if i.baseline), None)


class Unsupported(AttnbenchError):
    """Raised by an impl at call time when the library it wraps refuses the case; the row
    becomes ``status=unsupported`` with this message as its reason."""
