"""Plugins: finding and loading impls, and a run's record of the plugins it loaded.

Impls come from four places: the built-ins (the package ``attnbench.impls``, shipped in the
wheel), every module in the checkout's drop-in ``impls/`` folder (only when attnbench runs from
its checkout: an installed wheel imports no folder it was not given), each ``--plugin`` file,
folder (its modules) or module, and the entry-point group ``attnbench.impls`` of installed
packages (``discover``). A plugin that fails to import, or needs a package that is missing, is
still listed, as unavailable with a reason; ``impl_origin(impl)`` says which of the four it
came from (``registering_from`` records each impl's source as it registers). A mask kind a
plugin registers is tried on small cases as it loads.

A run's plugins are kept in env.json (``plugins``): what each ``--plugin`` loaded, a file's or a
folder's path with a sha256 of its code, or a module's name, so that ``attnbench report`` and
``attnbench repro`` load them again (the rows' mask kinds, score modifiers and impls are
theirs) and say which files they loaded, or take ``--plugin`` in their place (``records``,
``load``)."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.metadata
import importlib.util
import pkgutil
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from attnbench import checkout, registry
from attnbench.case import Case, CaseError
from attnbench.errors import UsageError, did_you_mean, one_line
from attnbench.masks import KINDS
from attnbench.masks.contract import ContractError
from attnbench.masks.kind import try_kind
from attnbench.registry import SOURCE, Impl, NameClash, RegistryError

BUILTIN_PACKAGE = "attnbench.impls"
DROP_IN = "impls"  # the checkout's folder of one-file plugins, loaded in a checkout only
ENTRY_POINT_GROUP = "attnbench.impls"
_LOADED: set[str] = set()  # the sources loaded (a module imported once never registers again)


class PluginImportError(RegistryError):
    """A plugin the user named (``--plugin``) failed to import."""


@contextlib.contextmanager
def registering_from(source: str) -> Iterator[None]:
    """The impls registered inside the block record ``source`` (a plugin's file, module or
    entry point: ``impl_origin``)."""
    token = SOURCE.set(source)
    try:
        yield
    finally:
        SOURCE.reset(token)


def impl_origin(impl: Impl) -> str:
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


def _load(
    source: str, loader: Callable[[], object], fallback_name: str, named: str | None = None
) -> None:
    """Run ``loader`` with ``source`` recorded; a failure becomes an unavailable impl, or,
    for a plugin the user ``named`` (a --plugin value), PluginImportError."""
    if source in _LOADED:
        return
    _LOADED.add(source)
    try:
        with registering_from(source):
            _run_plugin(loader)
    except NameClash:
        raise  # bad input: the user must rename one of the two
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - any other failure is reported
        error = _import_error(exc)
        if named is not None:
            _LOADED.discard(source)
            if isinstance(exc, (ContractError, RegistryError)):  # it names what and the fix
                raise PluginImportError(f"--plugin {named}: {exc}") from None
            raise PluginImportError(
                f"--plugin {named}: {source} failed to import ({error}); fix it or leave "
                f"out this --plugin"
            ) from None
        name = "".join(c if c.isalnum() else "_" for c in fallback_name.lower()) or "plugin"
        if name in registry.impls():
            name = f"{name}_plugin"
        registry.add(
            Impl(
                name=name,
                fn=None,
                source=source,
                unavailable=f"plugin {source} failed to import: {error}".strip(),
            )
        )


def _import_error(exc: BaseException) -> str:
    """A plugin's import failure on one line; a ``sys.exit`` at import (which would end the
    sweep with the plugin's exit code) says so."""
    if isinstance(exc, SystemExit):
        return f"it called sys.exit({exc.code!r}) at import"
    return one_line(f"{type(exc).__name__}: {exc}")


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
    """A ``--plugin`` value as a file or folder path or a module name; UsageError if it is
    none of them."""
    path = Path(spec)
    if path.suffix == ".py" or "/" in spec or path.exists():
        if path.is_dir():
            if not plugin_files(path):
                raise UsageError(f"--plugin {spec}: the folder holds no .py file to load")
            return path.resolve()
        if not path.is_file():
            raise UsageError(
                f"--plugin {spec}: no such file (give a .py file, a folder of them or an "
                f"importable module name)"
            )
        return path.resolve()
    if not all(part.isidentifier() for part in spec.split(".")):
        raise UsageError(f"--plugin {spec!r} is neither a file nor a module name")
    if not checkout.importable(spec):
        raise UsageError(f"--plugin {spec}: no such file or importable module")
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
    return registry.impls()


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


BUILTIN_PREFIX = f"{BUILTIN_PACKAGE}."


def _digest(path: Path) -> str:
    """sha256 of a plugin file, or of a folder's plugin files in order (names and code)."""
    files = plugin_files(path) if path.is_dir() else [path]
    h = hashlib.sha256()
    for file in files:
        h.update(file.name.encode() + b"\0" + file.read_bytes() + b"\0")
    return h.hexdigest()


def records(specs: list[str]) -> list[dict]:
    """env.json's ``plugins`` for a run's ``--plugin`` values: {"path", "sha256"} for a file
    or folder (absolute), {"module"} for a module."""
    out = []
    for spec in specs:
        src = plugin_source(spec)
        out.append(
            {"path": str(src), "sha256": _digest(src)} if isinstance(src, Path) else {"module": src}
        )
    return out


def recorded(env: dict) -> list[dict]:
    """The run's plugin records; for a run written before they were kept, the files and
    modules that registered its impls (env.json ``impls``: built-ins and entry points load by
    themselves)."""
    if "plugins" in env:
        return list(env["plugins"] or [])
    sources = dict.fromkeys(str(i.get("source") or "") for i in (env.get("impls") or {}).values())
    out = []
    for source in sources:
        if source.startswith("module "):
            out.append({"module": source.removeprefix("module ")})
        elif source and not source.startswith((BUILTIN_PREFIX, "entry point ")):
            out.append({"path": source})
    return out


def load(env: dict, given: list[str]) -> tuple[list[str], str | None]:
    """Load the plugins a run used, or ``given`` (--plugin values) in their place: (the
    --plugin values a reproducer passes, the line that says what was loaded; None when
    nothing was). A recorded file that is gone is a UsageError naming it and the fix."""
    if given:
        paths = [str(plugin_source(spec)) for spec in given]
        discover(paths)
        return paths, f"plugins: loaded {', '.join(paths)} (--plugin)"
    specs, shown, kept = [], [], recorded(env)
    for record in kept:
        if "module" in record:
            specs.append(record["module"])
            shown.append(f"module {record['module']}")
            continue
        path = Path(record["path"])
        if not path.exists():
            others = len(kept) - 1
            raise UsageError(
                f"the run's plugin {path} is gone (moved or deleted): give its file with "
                f"--plugin PATH"
                + (
                    f" (and the run's {others} other plugin(s): --plugin replaces them all)"
                    if others
                    else ""
                )
            )
        changed = record.get("sha256") not in (None, _digest(path))
        specs.append(str(path))
        shown.append(
            f"{path}" + (" (changed since the run: its sha256 differs)" if changed else "")
        )
    if specs:
        discover(specs)
    return specs, f"plugins: loaded {', '.join(shown)} (recorded by the run)" if shown else None
