"""Where this attnbench runs from: its source tree (a checkout, also an editable install) or an
installed wheel. A checkout has a drop-in ``impls/`` folder and a git history; a wheel's parent
folder is site-packages, which belongs to other packages, so nothing beside it is read. Also
whether a module is installed beside it (``importable``)."""

from __future__ import annotations

import functools
import importlib.util
import re
from importlib import metadata
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
_PYPROJECT_NAME = re.compile(r'(?m)^name\s*=\s*"attnbench"\s*$')
_PYPROJECT_VERSION = re.compile(r'(?m)^version\s*=\s*"([^"]+)"\s*$')


@functools.cache
def _pyproject() -> str | None:
    try:
        text = (PACKAGE_DIR.parent / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return None
    return text if _PYPROJECT_NAME.search(text) else None


def root() -> Path | None:
    """The checkout's folder (attnbench's own pyproject.toml beside the package), or None when
    attnbench is an installed package."""
    return PACKAGE_DIR.parent if _pyproject() is not None else None


@functools.cache
def version() -> str:
    """attnbench's version: the checkout's pyproject.toml, else the installed package's."""
    text = _pyproject()
    found = _PYPROJECT_VERSION.search(text) if text else None
    if found:
        return found.group(1)
    try:
        return metadata.version("attnbench")
    except metadata.PackageNotFoundError:
        return "unknown"


def importable(module: str) -> bool:
    """Whether ``module`` can be imported (found, not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
