"""What a mask kind or a score modifier must be for the harness to call it, checked when one is
registered (its name, the methods it must define, the arguments each method is called with)
and tried on a small case before any row runs (a plugin's kind when its file loads, a modifier
when its spec is parsed), so that a bad one is one line naming the method and the fix instead
of a crash in every row. Also where one came from (``attnbench list``)."""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from attnbench.errors import one_line

if TYPE_CHECKING:
    import torch

GUIDE = "docs/plugins.md: A mask kind or a score modifier of your own"


class ContractError(ValueError):
    """A kind or a modifier the harness cannot call: its message names the fix."""


def defined_in(cls: type) -> str:
    """Where a mask kind or a score modifier is defined: 'built-in' for attnbench's own, else
    the file (or the module) that defines ``cls``."""
    module = cls.__module__
    if module.startswith("attnbench."):
        return "built-in"
    return getattr(sys.modules.get(module), "__file__", None) or module


def check_name(what: str, name: object, reserved: str) -> None:
    """ContractError unless ``name`` is a short lowercase name (a CSV value and a flag value)
    other than ``reserved`` (a word the flag gives another meaning)."""
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", name) or name == reserved:
        raise ContractError(
            f"{what} name {name!r} must be lowercase letters, digits and _ (not {reserved!r}): "
            f"set the class attribute name ({GUIDE})"
        )


def check_defined(what: str, cls: type, base: type, methods: dict[str, str]) -> None:
    """ContractError when ``cls`` leaves one of ``methods`` (name -> how the guide writes it) as
    ``base`` has it (a stub that raises NotImplementedError)."""
    for method, written in methods.items():
        if getattr(cls, method) is getattr(base, method):
            raise ContractError(f"{what} ({defined_in(cls)}): define {written} ({GUIDE})")


def check_calls(
    what: str, cls: type, calls: dict[str, tuple[int, str]], on_class: tuple[str, ...] = ()
) -> None:
    """ContractError when a method the harness calls cannot take what the harness passes.
    ``calls``: method -> (the number of arguments passed, how the guide writes the method);
    ``on_class``: the methods called on the class itself (``__init__`` as ``cls(...)``), the
    others are called on an instance."""
    for method, (count, written) in calls.items():
        target = cls if method == "__init__" else getattr(cls, method)
        static = isinstance(inspect.getattr_static(cls, method), (staticmethod, classmethod))
        slots = count + (0 if method in on_class or static else 1)  # + self
        try:
            inspect.signature(target).bind(*range(slots))
        except ValueError:  # no signature to read (a builtin): nothing to check
            continue
        except TypeError:
            shown = inspect.signature(getattr(cls, method))
            raise ContractError(
                f"{what} ({defined_in(cls)}): {cls.__name__}.{method}{shown} cannot take the "
                f"{count} argument(s) the harness passes; write {written} ({GUIDE})"
            ) from None


def attempt(
    what: str, cls: type, call: str, step: Callable[[], object], check: Callable = lambda out: None
) -> object:
    """``step()``, its result passed to ``check`` (which raises when it is wrong); what either
    raises becomes a ContractError naming ``call``."""
    try:
        out = step()
        check(out)
        return out
    except Exception as exc:  # noqa: BLE001 - whatever a plugin raises, said in one line
        error = one_line(f"{type(exc).__name__}: {exc}")
        raise ContractError(
            f"{what} ({defined_in(cls)}): {call} failed on a small case ({error}) ({GUIDE})"
        ) from None


def expect(ok: bool, what: str) -> None:
    """A trial's check of a method's result; TypeError saying what was expected."""
    if not ok:
        raise TypeError(what)


def tensor_of(shape: tuple, dtype: torch.dtype | None) -> Callable[[object], None]:
    """A trial's check: a tensor of ``shape`` and ``dtype`` (None: any floating dtype)."""

    def check(out) -> None:
        import torch

        expect(isinstance(out, torch.Tensor), f"returned {type(out).__name__}, expected a tensor")
        wanted = "a floating dtype" if dtype is None else str(dtype)
        ok = out.is_floating_point() if dtype is None else out.dtype == dtype
        expect(
            tuple(out.shape) == shape and ok,
            f"returned {out.dtype} {tuple(out.shape)}, expected {wanted} {shape}",
        )

    return check


def broadcasting_to(shape: tuple) -> Callable[[object], None]:
    """A trial's check: None (where a method may say 'nothing'), or a tensor that broadcasts to
    ``shape``."""

    def check(out) -> None:
        import torch

        if out is None:
            return
        expect(isinstance(out, torch.Tensor), f"returned {type(out).__name__}, expected a tensor")
        try:
            ok = torch.broadcast_shapes(out.shape, shape) == shape
        except RuntimeError:
            ok = False
        expect(ok, f"returned shape {tuple(out.shape)}, which does not broadcast to {shape}")

    return check


def agreeing(ref: torch.Tensor, other: str, rtol: float = 1e-4) -> Callable[[object], None]:
    """A trial's check: float64 scores (1, H, Sq, Skv) that agree with ``ref``, ``other``'s
    (within ``rtol`` of 1 + |ref|: one computed in float32 inside passes, a slip does not)."""

    def check(out) -> None:
        bad = ~((out - ref).abs() <= rtol * (1 + ref.abs()))  # NaN is bad too
        if bad.any():
            at = tuple(int(i) for i in bad.nonzero()[0])
            raise ValueError(
                f"disagrees with {other} in float64: at head {at[1]}, query {at[2]}, key "
                f"{at[3]} it gives {float(out[at]):.6g} where {other} gives {float(ref[at]):.6g}"
            )

    return check
