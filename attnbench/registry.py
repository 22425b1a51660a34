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
others never see it. An impl that declares ``paged=True`` gets its k and v as a paged KV cache:
pools (pages, page_tokens, Hkv, D), ``block_table=`` (B, pages per sequence) int32 and
``seq_kv=`` (the keys per sequence; the last page's tail beyond it is padding), as
paged-attention servers keep them (run/inputs.py ``paged``; 128-token pages unless the impl
declares ``page_tokens``).

A **module impl** (``register(..., module=True)``) is instead a factory ``(case, mask) ->
module_layout.LayerModule``: a model's own attention module (its projections included) with
the layout of its learned parts and a call x (B, S, d_model) -> (B, S, d_model). It runs at
level layer only; the harness loads the seeded weights into it (docs/plugins.md).

``head_order`` says which kv head query head h reads under GQA (attnbench/heads.py); the
harness maps an impl of the other order outside the timing (run/call.py, run/layer.py).

Impls come from four places (plugins.py): the built-ins (``attnbench.impls``), the checkout's
drop-in ``impls/`` folder, ``--plugin`` files, folders and modules, and installed packages'
entry points; ``origin(impl)`` says which it came from.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attnbench import checkout
from attnbench.case import DEVICES, DTYPES, Case
from attnbench.errors import AttnbenchError, UsageError
from attnbench.heads import HEAD_ORDERS
from attnbench.masks import ALIGNS, ANY, KINDS, MODS
from attnbench.masks.scores import NEEDS, lacking

BUILTIN_PACKAGE = "attnbench.impls"
DROP_IN = "impls"  # the checkout's folder of one-file plugins, loaded in a checkout only
LAYOUTS = ("bhsd", "bshd")


class RegistryError(UsageError):
    """A plugin that breaks the registry contract (bad capability, duplicate name)."""


class NameClash(RegistryError):
    """Two sources register the same impl name: refused, never settled silently."""


@dataclass(frozen=True)
class Impl:
    name: str
    fn: Callable | None
    devices: tuple[str, ...] = DEVICES
    dtypes: tuple[str, ...] = tuple(DTYPES)
    head_dims: tuple[int, ...] | None = None  # None: any head dim
    causal: bool = True
    cross: bool = True  # seq_q != seq_kv
    gqa: bool = True  # kv_heads < heads
    head_order: str = "grouped"  # heads.HEAD_ORDERS: which kv head query head h reads
    backward: bool | tuple[str, ...] = True  # or the devices it has a backward on
    layout: str = "bhsd"  # of q, k, v (and of out unless out_layout says otherwise)
    out_layout: str | None = None  # of out (and of its gradient); None: layout
    masks: tuple[str, ...] = ("none",)  # masks.KINDS it supports (with causal); "*": all
    score_mods: tuple[str, ...] = ()  # masks.MODS it supports; "*": all
    # what a modifier must have for it to take it (masks.scores.NEEDS): "additive" (a bias it
    # takes as a float attn_mask), "grad" (a derivative its hand-written backward calls)
    score_mod_needs: tuple[str, ...] = ()
    causal_align: tuple[str, ...] = ("top_left",)  # masks.ALIGNS it supports
    paged: bool = False  # takes k, v as a paged KV cache (pools + block_table)
    module: bool = False  # fn is a module factory (case, mask) -> LayerModule; level layer only
    page_tokens: int | None = None  # tokens per page of its paged cache; None: inputs.PAGE_TOKENS
    # CUDA compute capabilities it runs on, as major * 10 + minor (90: Hopper): (lowest,
    # highest), highest None for no upper limit; None: any
    sm: tuple[int, int | None] | None = None
    # the SDPA backend it runs: a fixed name, or a function (call, device_type) -> name|None
    # that finds out (one extra untimed call); None: not an SDPA impl
    backend: str | Callable | None = field(default=None, repr=False)
    compiled: bool = False  # uses torch.compile: the first call's compile time is reported
    baseline: bool = False  # the impl speedups are relative to (one per run)
    color: str | None = None  # a matplotlib colour for its lines; None: from the palette
    description: str = ""
    source: str = ""
    unavailable: str | None = None  # why it cannot run at all (missing dependency, import error)
    requires: dict[str, str] = field(default_factory=dict, repr=False)  # module -> install command
    check: Callable[[Case], list[str]] | None = field(default=None, repr=False)
    # work(case, mask) -> the (query, key) pairs its computation covers, masked ones included,
    # per head and summed over the batch, or None where it cannot say (work_flops)
    work: Callable | None = field(default=None, repr=False)

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

    def _backward_reason(self, case: Case) -> str:
        if self.backward is False:
            return f"mode={case.mode} (supported: fwd; no backward)"
        return (
            f"mode={case.mode} on {case.device_type} (supported: fwd; backward on "
            f"{', '.join(self.backward)} only)"
        )

    def _sm_reasons(self, case: Case) -> list[str]:
        """The GPU's compute capability against ``sm`` (only where CUDA is visible)."""
        if self.sm is None or case.device_type != "cuda" or not _cuda_visible():
            return []
        major, minor = torch.cuda.get_device_capability(case.device)
        have, (low, high) = major * 10 + minor, self.sm
        if have >= low and (high is None or have <= high):
            return []
        span = f"sm_{low} to sm_{high}" if high is not None else f"sm_{low} and newer"
        return [f"compute_capability=sm_{have} (supported: {span})"]


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
    return [impl._backward_reason(case)]


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
    return impl._sm_reasons(case)


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
    return torch.cuda.is_available()


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
_current_source = ""  # where the impls being registered come from (``registering_from``)


def register(
    name: str,
    *,
    devices: Iterable[str] = DEVICES,
    dtypes: Iterable[str] = tuple(DTYPES),
    head_dims: Iterable[int] | None = None,
    causal: bool = True,
    cross: bool = True,
    gqa: bool = True,
    head_order: str = "grouped",
    backward: bool | Iterable[str] = True,
    layout: str = "bhsd",
    out_layout: str | None = None,
    masks: Iterable[str] = ("none",),
    unmasked: bool = True,
    score_mods: Iterable[str] = (),
    score_mod_needs: Iterable[str] = (),
    causal_align: Iterable[str] = ("top_left",),
    paged: bool = False,
    page_tokens: int | None = None,
    module: bool = False,
    sm: tuple[int, int | None] | None = None,
    backend: str | Callable | None = None,
    compiled: bool = False,
    baseline: bool = False,
    color: str | None = None,
    requires: dict[str, str] | None = None,
    unavailable: str | None = None,
    check: Callable[[Case], list[str]] | None = None,
    description: str = "",
    work: Callable | None = None,
):
    """Decorator registering an attention function (or, with ``module``, a module factory)
    with what it supports. Each argument is the ``Impl`` field of its name (its comment there);
    docs/plugins.md's table of register arguments says what each means and what it changes.
    ``unmasked=False``: an impl that needs one of its ``masks`` (mask none is unsupported).
    ``requires`` maps importable module names to the command that installs them: one missing
    registers the impl as unavailable, with that command in its reason."""

    declared = dict(locals())  # the arguments as given; Impl's fields bear the same names

    def decorate(fn: Callable) -> Callable:
        if module and paged:
            raise RegistryError(f"impl {name!r}: module=True takes x, not a paged KV cache")
        missing = [(mod, cmd) for mod, cmd in (requires or {}).items() if not importable(mod)]
        why = [f"needs {mod}, which is not installed (install: {cmd})" for mod, cmd in missing]
        why += [unavailable] if unavailable and not missing else []
        fields = {k: v for k, v in declared.items() if k != "unmasked"} | dict(
            devices=_valid(name, "devices", devices, DEVICES),
            dtypes=_valid(name, "dtypes", dtypes, DTYPES),
            head_dims=None if head_dims is None else tuple(head_dims),
            backward=_backward(name, backward),
            head_order=_valid(name, "head_order", [head_order], HEAD_ORDERS)[0],
            layout=_valid(name, "layout", [layout], LAYOUTS)[0],
            out_layout=None if out_layout in (None, layout) else _out_layout(name, out_layout),
            masks=_masks(name, masks, unmasked),
            score_mods=_valid(name, "score_mods", score_mods, (*MODS, *ANY)),
            score_mod_needs=_valid(name, "score_mod_needs", score_mod_needs, tuple(NEEDS)),
            causal_align=_aligns(name, causal_align),
            description=description or (fn.__doc__ or "").strip().split("\n")[0],
            source=_current_source,
            unavailable="; ".join(why) or None,
            requires=dict(requires or {}),
        )
        impl = Impl(fn=fn, **fields)
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


@contextlib.contextmanager
def registering_from(source: str) -> Iterator[None]:
    """The impls registered inside the block record ``source`` (a plugin's file, module or
    entry point: ``origin``)."""
    global _current_source
    _current_source = source
    try:
        yield
    finally:
        _current_source = ""


def _masks(name: str, masks: Iterable[str], unmasked: bool) -> tuple[str, ...]:
    """The masks an impl runs: "none" first unless it needs a mask, then those it declared."""
    out = tuple(
        dict.fromkeys(
            (*(("none",) if unmasked else ()), *_valid(name, "masks", masks, (*KINDS, *ANY)))
        )
    )
    if not unmasked and out in ((), ("none",)):
        raise RegistryError(f"impl {name!r}: unmasked=False needs the masks it runs (masks=...)")
    return out


def _backward(name: str, backward: bool | Iterable[str]) -> bool | tuple[str, ...]:
    """True, False, or the devices it has a backward on (all of DEVICES: True)."""
    if isinstance(backward, bool):
        return backward
    if isinstance(backward, str):
        backward = (backward,)
    devices = tuple(dict.fromkeys(_valid(name, "backward", backward, DEVICES)))
    return True if set(devices) == set(DEVICES) else devices or False


def _out_layout(name: str, out_layout: str) -> str:
    return _valid(name, "out_layout", [out_layout], LAYOUTS)[0]


def _aligns(name: str, causal_align: Iterable[str]) -> tuple[str, ...]:
    """The causal alignments it supports, in ALIGNS order; at least one."""
    given = _valid(name, "causal_align", causal_align, ALIGNS)
    if not given:
        raise RegistryError(f"impl {name!r}: causal_align needs one of {list(ALIGNS)}")
    return tuple(a for a in ALIGNS if a in given)


def _valid(name: str, what: str, values: Iterable[str], allowed: Iterable[str]) -> tuple:
    values, allowed = tuple(values), tuple(allowed)
    bad = [v for v in values if v not in allowed]
    if bad:
        raise RegistryError(f"impl {name!r}: {what} {bad} not in {list(allowed)}")
    return values


def importable(module: str) -> bool:
    """Whether ``module`` can be imported (found, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def origin(impl: Impl) -> str:
    """Where an impl came from, in a word: built-in, impls/ (the checkout's drop-in folder),
    --plugin (a file, folder or module given), entry point, or register() (called by the
    program itself)."""
    source = impl.source
    if source.startswith(f"{BUILTIN_PACKAGE}."):
        return "built-in"
    if source.startswith("entry point "):
        return "entry point"
    root = checkout.root()
    if root and Path(source).parent == (root / DROP_IN).resolve():
        return f"{DROP_IN}/"
    return "--plugin" if source else "register()"


def baseline(impls: Iterable[Impl]) -> str | None:
    """The name of the impl declared ``baseline=True`` among ``impls`` (the first), or None."""
    return next((i.name for i in impls if i.baseline), None)


class Unsupported(AttnbenchError):
    """Raised by an impl at call time when the library it wraps refuses the case; the row
    becomes ``status=unsupported`` with this message as its reason."""
