"""Whose kernels ``xformers`` runs: its own, or PyTorch's; and whether it can run at all.

xformers.ops.memory_efficient_attention dispatches each call to one of its operators. Some are
xformers' own builds (FlashAttention-3 ``fa3F``/``fa3B`` and the split-K kernels, from its
C++/CUDA extension or its Triton code), or the flash-attn package it wraps (``fa2F@<version>``).
Others only call PyTorch's own kernels: their names end in ``-pt`` (``cutlassF-pt`` is
``aten::_efficient_attention_forward``, ``fa2F@<version>-pt`` is PyTorch's flash kernel).

``build_mismatch()`` says, in one line and before any call, why no xformers operator can run
under this torch (its build record names another torch: the extension does not load, and then
xformers' own check refuses every operator, those that need no extension too); the impl is
registered unavailable with that reason. ``xformers_kernels()`` is env.json's record of what
loaded; ``dispatched(run)`` names the operators that one call used, which becomes the row's
``backend``: ``pytorch:flash`` / ``pytorch:efficient`` for PyTorch's kernels,
``xformers:<operator>`` for the others (lower case, without the version and the F/B direction:
``xformers:triton_splitk``, ``xformers:fa3``). xformers' own 6-line ``WARNING[XFORMERS]`` log
block is kept off the terminal (``quiet``).

No registration here (importing this module has no side effect on the registry)."""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import importlib.util
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path

import torch

from attnbench.errors import one_line
from attnbench.measure.backends import PYTORCH_PREFIX

INSTALL = "pip install 'xformers>=0.0.28'"


@contextlib.contextmanager
def quiet():
    """xformers' logger held for the duration: its records (the extension's warning) are kept
    in the list this yields instead of printed."""
    logger, records = logging.getLogger("xformers"), []
    keep = logging.Handler()
    keep.emit = records.append
    propagate, logger.propagate = logger.propagate, False
    logger.addHandler(keep)
    try:
        yield records
    finally:
        logger.removeHandler(keep)
        logger.propagate = propagate


def build_mismatch() -> str | None:
    """Why no xformers attention can run under this torch, in one line, read from xformers' own
    build record (``cpp_lib.json``, written when its wheel was built) without importing it or
    touching a GPU; None where xformers is not installed, has no record, or was built for this
    torch's minor version and CUDA major.

    The rule, from xformers' source: its C++/CUDA extension links against the libtorch and the
    CUDA runtime it was built with, so it loads only under that torch minor version and CUDA
    major. Without it ``_cpp_lib._built_with_cuda`` is False, and the base check every
    attention operator runs (``AttentionOpBase.not_supported_reasons``) adds "xFormers wasn't
    build with CUDA support" on CUDA inputs: the dispatcher and an explicit ``op=`` both refuse
    every operator, the Triton split-K and the PyTorch-backed ``-pt`` ones included."""
    record = _build_record()
    if record is None:
        return None
    built, cuda = record.get("torch"), record.get("cuda")
    if not built or cuda is None:  # a ROCm or CPU build: the dispatcher decides
        return None
    have_cuda = torch.version.cuda
    same = _minor(built) == _minor(torch.__version__) and (
        have_cuda is not None and int(have_cuda.split(".")[0]) == cuda // 100
    )
    if same:
        return None
    try:
        version = f" {importlib.metadata.version('xformers')}"
    except importlib.metadata.PackageNotFoundError:  # importable without its metadata
        version = ""
    return (
        f"xformers{version}'s CUDA kernels were built for torch {built}; this torch is "
        f"{torch.__version__}: xformers refuses every operator (its extension loads only under "
        f"the torch it was built for; install an xformers built for torch "
        f"{'.'.join(map(str, _minor(torch.__version__)))}: {INSTALL})"
    )


def _build_record() -> dict | None:
    """xformers' ``cpp_lib.json`` "version" entry ({"cuda": 1208, "torch": "2.10.0+cu128",
    ...}), found without importing xformers (seconds: scipy, torch._dynamo)."""
    spec = importlib.util.find_spec("xformers")
    folders = (spec.submodule_search_locations or []) if spec else []
    path = Path(folders[0]) / "cpp_lib.json" if folders else None
    if path is None or not path.is_file():
        return None
    try:
        return json.loads(path.read_text())["version"]
    except (OSError, ValueError, KeyError, TypeError):  # a record we cannot read decides nothing
        return None


def _minor(version: str) -> tuple[int, ...]:
    """(major, minor) of a torch version: '2.10.0+cu128' -> (2, 10)."""
    return tuple(int(x) for x in re.findall(r"\d+", version)[:2])


def label(op_name: str) -> str:
    """A backend label for an xformers operator name: ``triton_splitKF`` ->
    ``xformers:triton_splitk``, ``cutlassF-pt`` -> ``pytorch:efficient``."""
    if not op_name.endswith("-pt"):
        name = op_name.split("@")[0]
        return "xformers:" + (name[:-1] if name[-1:] in ("F", "B") else name).lower()
    # PyTorch's kernels, called by xformers: cutlass* is PyTorch's efficient backend's
    # kernel, fa2* its flash kernel
    family = {"cutlass": "efficient", "fa2": "flash"}
    return PYTORCH_PREFIX + next(
        (f for prefix, f in family.items() if op_name.startswith(prefix)), op_name
    )


@functools.cache
def xformers_kernels() -> dict:
    """For env.json: whether xformers' C++/CUDA extension loaded (and why not), and which of
    its attention operators are available, split into its own and PyTorch's."""
    with quiet():  # the extension's warning: extension_error below, and the impl's reason
        import xformers
        from xformers import _cpp_lib
        from xformers.ops.common import OPERATORS_REGISTRY

    failure = _cpp_lib._cpp_library_load_exception
    names = sorted(
        {
            op.NAME
            for op in OPERATORS_REGISTRY
            if op.OPERATOR_CATEGORY == "memory_efficient_attention" and _available(op)
        }
    )
    return {
        "version": getattr(xformers, "__version__", None),
        "extension_loaded": failure is None,
        "extension_error": None if failure is None else one_line(failure)[:300],
        "own_ops": [n for n in names if not label(n).startswith(PYTORCH_PREFIX)],
        "pytorch_ops": [n for n in names if label(n).startswith(PYTORCH_PREFIX)],
    }


def _available(op) -> bool:
    try:
        return bool(op.is_available())
    except Exception:  # noqa: BLE001 - an operator that cannot even say is not available
        return False


def dispatched(run: Callable[[], object], fmha=None) -> str | None:
    """Run ``run`` once and name the operators xformers dispatched it to (forward, and
    backward when ``run`` includes one), as backend labels joined with '+'. ``fmha``: the
    module whose dispatchers are watched (xformers.ops.fmha)."""
    if fmha is None:
        from xformers.ops import fmha

    seen: list[str] = []
    with _recording(fmha, "_dispatch_fw", seen), _recording(fmha, "_dispatch_bw", seen):
        run()
    return "+".join(sorted(dict.fromkeys(label(n) for n in seen))) or None


@contextlib.contextmanager
def _recording(module, name: str, seen: list[str]):
    """``module.name`` (a dispatcher) wrapped so that each operator it returns is noted."""
    original = getattr(module, name)

    def wrapper(*args, **kwargs):
        op = original(*args, **kwargs)
        seen.append(op.NAME)
        return op

    setattr(module, name, wrapper)
    try:
        yield
    finally:
        setattr(module, name, original)
