"""A run's plugins in env.json (``plugins``): what each ``--plugin`` loaded, a file's or a
folder's path with a sha256 of its code, or a module's name, so that ``attnbench report`` and
``attnbench repro`` load them again (the rows' mask kinds, score modifiers and impls are
theirs) and say which files they loaded, or take ``--plugin`` in their place."""

from __future__ import annotations

import hashlib
from pathlib import Path

from attnbench import registry
from attnbench.errors import UsageError

BUILTIN_PREFIX = f"{registry.BUILTIN_PACKAGE}."


def _digest(path: Path) -> str:
    """sha256 of a plugin file, or of a folder's plugin files in order (names and code)."""
    files = registry.plugin_files(path) if path.is_dir() else [path]
    h = hashlib.sha256()
    for file in files:
        h.update(file.name.encode() + b"\0" + file.read_bytes() + b"\0")
    return h.hexdigest()


def records(specs: list[str]) -> list[dict]:
    """env.json's ``plugins`` for a run's ``--plugin`` values: {"path", "sha256"} for a file
    or folder (absolute), {"module"} for a module."""
    out = []
    for spec in specs:
        src = registry.plugin_source(spec)
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
        paths = [str(registry.plugin_source(spec)) for spec in given]
        registry.discover(paths)
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
        registry.discover(specs)
    return specs, f"plugins: loaded {', '.join(shown)} (recorded by the run)" if shown else None
