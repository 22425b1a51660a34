"""The plugin registry: capabilities as data, ``reasons(case)``, and discovery.

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

Impls come from four places: the built-ins (the package ``attnbench.impls``, shipped in the
wheel), every module in the checkout's drop-in ``impls/`` folder (only when attnbench runs from
its checkout: an installed wheel imports no folder it was not given), each ``--plugin`` file,
folder (its modules) or module, and the entry-point group ``attnbench.impls`` of installed
packages. A plugin that fails to import, or needs a package that is missing, is still listed,
as unavailable with a reason. ``origin(impl)`` says which of the four it came from.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import pkgutil
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attnbench import checkout
from attnbench.case import DEVICES, DTYPES, Case, CaseError
from attnbench.errors import AttnbenchError, UsageError, did_you_mean, one_line
from attnbench.heads import HEAD_ORDERS
from attnbench.masks import ALIGNS, ANY, KINDS, MODS
from attnbench.masks.contract import ContractError
from attnbench.masks.kind import try_kind
from attnbench.masks.scores import NEEDS, lacking

BUILTIN_PACKAGE = "attnbench.impls"
DROP_IN = "impls"  # the checkout's folder of one-file plugins, loaded in a checkout only
ENTRY_POINT_GROUP = "attnbench.impls"
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
        """Why this impl cannot run ``case``; empty when it can."""
        if self.unavailable:
            return [self.unavailable]
        out = []
        if case.device_type not in self.devices:
            out.append(f"device={case.device_type} (supported: {', '.join(self.devices)})")
        if case.dtype not in self.dtypes:
            out.append(f"dtype={case.dtype} (supported: {', '.join(self.dtypes)})")
        if self.head_dims is not None and case.head_dim not in self.head_dims:
            out.append(
                f"head_dim={case.head_dim} (supported: {', '.join(map(str, self.head_dims))})"
            )
        if case.causal and not self.causal:
            out.append("causal=True (supported: False)")
        if case.cross and not self.cross:
            out.append(f"seq_q={case.seq_q} != seq_kv={case.seq_kv} (supported: equal lengths)")
        if case.gqa and not self.gqa:
            out.append(
                f"kv_heads={case.kv_heads} < heads={case.heads} (supported: kv_heads == heads)"
            )
        if case.backward and not self.backward_on(case.device_type):
            out.append(self._backward_reason(case))
        if case.mask not in self.masks and ANY[0] not in self.masks:
            out.append(f"mask={case.mask} (supported: {', '.join(self.masks)})")
        modifier = case.score_mod.partition(":")[0]
        if modifier and modifier not in self.score_mods and ANY[0] not in self.score_mods:
            out.append(
                f"score_mod={case.score_mod} (supported: {', '.join(self.score_mods) or 'none'})"
            )
        elif modifier:
            out += lacking(MODS[modifier], self.score_mod_needs, case.score_mod, case.backward)
        if case.causal_align not in self.causal_align and aligned_differently(case):
            out.append(
                f"causal_align={case.causal_align} (supported: {', '.join(self.causal_align)})"
            )
        if self.module and case.level != "layer":
            out.append(
                f"level={case.level} (supported: layer; a module brings its own projections)"
            )
        if self.paged and case.level != "op":
            out.append(f"level={case.level} (supported: op; a paged KV cache is an op input)")
        if self.paged and case.backward and self.backward_on(case.device_type):
            out.append(f"mode={case.mode} (supported: fwd; a paged KV cache is read-only)")
        out.extend(self._sm_reasons(case))
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
_LOADED: set[str] = set()
_current_source = ""


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
        missing = [(mod, cmd) for mod, cmd in (requires or {}).items() if not _importable(mod)]
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


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


class PluginImportError(RegistryError):
    """A plugin the user named (``--plugin``) failed to import."""


def _load(
    source: str, loader: Callable[[], object], fallback_name: str, named: str | None = None
) -> None:
    """Run ``loader`` with ``source`` recorded; a failure becomes an unavailable impl, or,
    for a plugin the user ``named`` (a --plugin value), PluginImportError."""
    global _current_source
    if source in _LOADED:
        return
    _LOADED.add(source)
    _current_source = source
    try:
        _run_plugin(loader)
    except NameClash:
        raise  # bad input: the user must rename one of the two
    except Exception as exc:  # noqa: BLE001 - any other plugin failure is reported, not raised
        error = one_line(f"{type(exc).__name__}: {exc}")
        if named is not None:
            _LOADED.discard(source)
            if isinstance(exc, (ContractError, RegistryError)):  # it names what and the fix
                raise PluginImportError(f"--plugin {named}: {exc}") from None
            raise PluginImportError(
                f"--plugin {named}: {source} failed to import ({error}); fix it or leave "
                f"out this --plugin"
            ) from None
        name = "".join(c if c.isalnum() else "_" for c in fallback_name.lower()) or "plugin"
        if name in _IMPLS:
            name = f"{name}_plugin"
        _IMPLS[name] = Impl(
            name=name,
            fn=None,
            source=source,
            unavailable=f"plugin {source} failed to import: {error}".strip(),
        )
    finally:
        _current_source = ""


def _run_plugin(loader: Callable[[], object]) -> None:
    """Run a plugin's ``loader``, then each mask kind it registered on a small case (a bad one
    is taken out of the registry again, and its ContractError raised)."""
    before = set(KINDS)
    loader()
    added = [KINDS[name] for name in KINDS if name not in before]
    try:
        for kind in added:
            for case in _small_cases(kind.name):
                try_kind(kind, case)
    except ContractError:
        for kind in added:
            KINDS.pop(kind.name, None)
        raise


def _small_cases(mask: str) -> list[Case]:
    """Small self-attention cases of ``mask``, without and with causal, that its own checks
    accept (none for a kind that needs more, such as a spec without a default: its rows say
    what fails)."""
    out = []
    for causal in (False, True):
        try:
            out.append(
                Case(batch=2, heads=2, kv_heads=2, seq_q=16, seq_kv=16, head_dim=8,
                     causal=causal, mask=mask)
            )  # fmt: skip
        except CaseError:
            continue
    return out


def _load_file(path: Path) -> None:
    module_name = f"attnbench_plugin_{path.stem}_{abs(hash(str(path))) % 10**8}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)


def plugin_source(spec: str) -> Path | str:
    """A ``--plugin`` value as a file or folder path or a module name; CaseError if it is
    none of them."""
    path = Path(spec)
    if path.suffix == ".py" or "/" in spec or path.exists():
        if path.is_dir():
            if not plugin_files(path):
                raise CaseError(f"--plugin {spec}: the folder holds no .py file to load")
            return path.resolve()
        if not path.is_file():
            raise CaseError(
                f"--plugin {spec}: no such file (give a .py file, a folder of them or an "
                f"importable module name)"
            )
        return path.resolve()
    if not all(part.isidentifier() for part in spec.split(".")):
        raise CaseError(f"--plugin {spec!r} is neither a file nor a module name")
    if not _importable(spec):
        raise CaseError(f"--plugin {spec}: no such file or importable module")
    return spec


def discover(
    plugins: Iterable[str] = (), *, builtin: bool = True, entry_points: bool = True
) -> dict[str, Impl]:
    """Load the built-in impls, the drop-in folders, entry points and ``plugins``; return the
    registry by name."""
    if builtin:
        package = importlib.import_module(BUILTIN_PACKAGE)
        for info in pkgutil.iter_modules(package.__path__):
            module = f"{BUILTIN_PACKAGE}.{info.name}"
            _load(
                f"{BUILTIN_PACKAGE}.{info.name}",
                lambda m=module: importlib.import_module(m),
                info.name,
            )
        root = checkout.root()
        for path in plugin_files(root / DROP_IN) if root else []:
            _load(str(path), lambda p=path: _load_file(p), path.stem)
    if entry_points:
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            _load(f"entry point {ep.name} ({ep.value})", ep.load, ep.name)
    for spec in plugins:
        src = plugin_source(spec)
        if isinstance(src, Path):
            for path in plugin_files(src) if src.is_dir() else [src]:
                _load(str(path), lambda p=path: _load_file(p), path.stem, named=spec)
        else:
            _load(f"module {src}", lambda m=src: importlib.import_module(m), src, named=spec)
    return dict(_IMPLS)


def unknown_hint(name: str, known: Iterable[str]) -> str:
    """What to add to "unknown impl (or mask, score_mod) NAME": a close known name; else the
    file of the working folder's impls/ that names it, where that folder is not loaded (an
    installed attnbench, or another folder than the checkout's); else the --plugin hint."""
    close = did_you_mean(name, known)
    if close:
        return close
    here, root = Path(DROP_IN), checkout.root()
    loaded = root is not None and here.resolve() == (root / DROP_IN).resolve()
    for path in [] if loaded else plugin_files(here):
        text = path.read_text(errors="replace")
        if f'"{name}"' in text or f"'{name}'" in text:
            return (
                f"; {DROP_IN}/{path.name} names it, but only attnbench's own checkout loads "
                f"its {DROP_IN}/ folder unasked: add --plugin {DROP_IN}/{path.name}"
            )
    return "; did you forget --plugin FILE (the file that registers it)?"


def plugin_files(folder: Path) -> list[Path]:
    """A plugin folder's modules: its .py files, but those named _*.py."""
    return sorted(folder.resolve().glob("[!_]*.py")) if folder.is_dir() else []


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
