"""What an impl declares, in three small declarations: ``Takes`` (the call it takes: layouts,
head order, a paged KV cache, a module), ``Supports`` (the cases it supports: dtypes, head
dims, GQA, backward, masks, score modifiers, causal alignments, its own check) and ``Runs``
(where and how it runs: devices, GPUs, required modules, SDPA backend, compiler). Each is a
frozen dataclass whose defaults are the common case, so a plugin names only what differs;
``valid(name)`` checks one against what exists (the dtypes, masks, layouts, ...) and gives its
canonical form, or raises RegistryError naming the impl, the field and what is allowed.
registry.Impl is the three together; docs/plugins.md's table says what each field means."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields, replace

from attnbench.case import DEVICES, DTYPE_BYTES, Case
from attnbench.checkout import importable
from attnbench.errors import UsageError, did_you_mean
from attnbench.heads import HEAD_ORDERS
from attnbench.masks import ALIGNS, ANY, KINDS, MODS
from attnbench.masks.scores import NEEDS

LAYOUTS = ("bhsd", "bshd")


class RegistryError(UsageError):
    """A plugin that breaks the registry contract (bad capability, duplicate name)."""


@dataclass(frozen=True, kw_only=True)
class Takes:
    """What an impl takes: the call the harness makes it (registry.py: the call itself).

    ``paged``: its k and v come as a paged KV cache: pools (pages, page_tokens, Hkv, D),
    ``block_table=`` (B, pages per sequence) int32 and ``seq_kv=`` (the keys per sequence; the
    last page's tail beyond it is padding), as paged-attention servers keep them
    (run/measuring/inputs.py ``paged``; 128-token pages unless it declares ``page_tokens``).
    ``module``: fn is instead a factory ``(case, mask) -> module_layout.LayerModule``, a
    model's own attention module (its projections included) with the layout of its learned
    parts and a call x (B, S, d_model) -> (B, S, d_model); level layer only, the harness loads
    the seeded weights into it (docs/plugins.md). ``head_order``: which kv head query head h
    reads under GQA (heads.py); the harness maps the other order outside the timing."""

    layout: str = "bhsd"  # of q, k, v (and of out unless out_layout says otherwise)
    out_layout: str | None = None  # of out (and of its gradient); None: layout
    head_order: str = "grouped"  # heads.HEAD_ORDERS: which kv head query head h reads
    paged: bool = False  # takes k, v as a paged KV cache (pools + block_table)
    page_tokens: int | None = None  # tokens per page of its paged cache; None: inputs.PAGE_TOKENS
    module: bool = False  # fn is a module factory (case, mask) -> LayerModule; level layer only

    def valid(self, name: str) -> Takes:
        if self.module and self.paged:
            raise RegistryError(f"impl {name!r}: module=True takes x, not a paged KV cache")
        layout = _valid(name, "layout", [self.layout], LAYOUTS)[0]
        out = None if self.out_layout in (None, layout) else self.out_layout
        return replace(
            self,
            layout=layout,
            out_layout=out and _valid(name, "out_layout", [out], LAYOUTS)[0],
            head_order=_valid(name, "head_order", [self.head_order], HEAD_ORDERS)[0],
        )


@dataclass(frozen=True, kw_only=True)
class Supports:
    """The cases an impl supports: any other case is a row ``unsupported`` with its reasons
    (``Impl.reasons``); its own ``check`` is asked only where every declared field fits."""

    dtypes: tuple[str, ...] = tuple(DTYPE_BYTES)
    head_dims: tuple[int, ...] | None = None  # None: any head dim
    causal: bool = True
    cross: bool = True  # seq_q != seq_kv
    gqa: bool = True  # kv_heads < heads
    backward: bool | tuple[str, ...] = True  # or the devices it has a backward on
    masks: tuple[str, ...] = ("none",)  # masks.KINDS it supports (with causal); "*": all
    unmasked: bool = True  # False: it needs one of its masks (mask none is unsupported)
    score_mods: tuple[str, ...] = ()  # masks.MODS it supports; "*": all
    # what a modifier must have for it to take it (masks.scores.NEEDS): "additive" (a bias it
    # takes as a float attn_mask), "grad" (a derivative its hand-written backward calls)
    score_mod_needs: tuple[str, ...] = ()
    causal_align: tuple[str, ...] = ("top_left",)  # masks.ALIGNS it supports
    check: Callable[[Case], list[str]] | None = field(default=None, repr=False)

    def valid(self, name: str) -> Supports:
        return replace(
            self,
            dtypes=_valid(name, "dtypes", self.dtypes, DTYPE_BYTES),
            head_dims=None if self.head_dims is None else tuple(self.head_dims),
            backward=_backward(name, self.backward),
            masks=_masks(name, self.masks, self.unmasked),
            score_mods=_valid(name, "score_mods", self.score_mods, (*MODS, *ANY)),
            score_mod_needs=_valid(name, "score_mod_needs", self.score_mod_needs, tuple(NEEDS)),
            causal_align=_aligns(name, self.causal_align),
        )


@dataclass(frozen=True, kw_only=True)
class Runs:
    """Where and how an impl runs."""

    devices: tuple[str, ...] = DEVICES
    # CUDA compute capabilities it runs on, as major * 10 + minor (90: Hopper): (lowest,
    # highest), highest None for no upper limit; None: any
    sm: tuple[int, int | None] | None = None
    requires: dict[str, str] = field(default_factory=dict, repr=False)  # module -> install command
    unavailable: str | None = None  # why it cannot run at all (missing dependency, import error)
    # the SDPA backend it runs: a fixed name, or a function (call, device_type) -> name|None
    # that finds out (one extra untimed call); None: not an SDPA impl
    backend: str | Callable | None = field(default=None, repr=False)
    compiled: bool = False  # uses torch.compile: the first call's compile time is reported

    def valid(self, name: str) -> Runs:
        """A module of ``requires`` that is missing makes it unavailable, with its command."""
        requires = dict(self.requires or {})
        why = [
            f"needs {mod}, which is not installed (install: {cmd})"
            for mod, cmd in requires.items()
            if not importable(mod)
        ]
        why += [self.unavailable] if self.unavailable and not why else []
        devices = _valid(name, "devices", self.devices, DEVICES)
        return replace(self, devices=devices, requires=requires, unavailable="; ".join(why) or None)


DECLARATIONS = (Takes, Supports, Runs)


def declared(name: str, given: dict, keywords: dict) -> dict:
    """The three declarations of impl ``name`` as Impl's fields, checked: ``given`` (kind
    name -> its declaration: ``{"takes": Takes(...)}``), each amended by the ``keywords``
    that are its fields (``gqa=False``: the flat keywords of plugins written before the
    declarations); a keyword of none of them is a RegistryError naming the closest field."""
    names = {f.name for kind in DECLARATIONS for f in fields(kind)}
    for unknown in sorted(set(keywords) - names):
        raise RegistryError(
            f"impl {name!r}: register() has no argument {unknown!r}"
            f"{did_you_mean(unknown, names) or ''} (docs/plugins.md, register arguments)"
        )
    out = {}
    for kind in DECLARATIONS:
        declaration = given.get(kind.__name__.lower()) or kind()
        if not isinstance(declaration, kind):
            raise RegistryError(
                f"impl {name!r}: {kind.__name__.lower()}= takes {kind.__name__}(...)"
            )
        own = {f.name: keywords[f.name] for f in fields(kind) if f.name in keywords}
        checked = replace(declaration, **own).valid(name)
        out |= {f.name: getattr(checked, f.name) for f in fields(kind)}
    return out


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
