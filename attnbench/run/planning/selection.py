"""Which impls a sweep runs: those named, or the preset's (or every impl) that can run some
case of the grid, and those left out with why; and that a --profile filter matches a pair."""

from __future__ import annotations

import re
from collections import Counter

from attnbench import plugins
from attnbench.case import Case
from attnbench.dims import DIM
from attnbench.errors import UsageError
from attnbench.spec import Spec

COMPILED_LEFT_OUT = "uses torch.compile (a compile per shape): name it in --impls"
NOT_REGISTERED = "not registered here"


def select_impls(
    names: list[str] | None, impls: dict, spec: Spec, cases: list[Case]
) -> tuple[list, dict[str, str]]:
    """The impls to run, and those left out (name -> why). Named impls all run (their rows
    say what they cannot do); without names, the preset's impls (or every impl) that can run
    some case of the grid, so that no preset fills its rows with 'unsupported'."""
    if names is None:
        if spec.impls is not None:  # the preset's own
            pool = [impls[n] for n in spec.impls if n in impls]
            left_out = {n: NOT_REGISTERED for n in spec.impls if n not in impls}
        else:
            pool = [i for i in impls.values() if spec.compiled or not i.compiled]
            left_out = {i.name: COMPILED_LEFT_OUT for i in impls.values() if i not in pool}
        selected = []
        for impl in pool:
            reasons = [impl.reasons(c) for c in cases]
            if all(reasons):
                left_out[impl.name] = "; ".join(reasons[0])
            else:
                selected.append(impl)
        return selected, left_out
    for name in names:
        if name not in impls:
            raise UsageError(
                f"--impls: unknown impl {name!r}{plugins.unknown_hint(name, impls)} "
                f"(known: {', '.join(impls)}; see attnbench list)"
            )
    return [impls[n] for n in names], {}


def left_out_text(left_out: dict[str, str]) -> str:
    lines = ["not run, as no --impls named them (name them to record their rows anyway):"]
    return "\n".join(lines + [f"  {name}: {why}" for name, why in left_out.items()])


def left_out_summary(left_out: dict[str, str], impls: dict) -> str:
    """The impls left out, folded into counts by why (what a run prints as it starts;
    --dry-run names each): 'not run: 7 not installed, 5 not for device=cpu, ...'."""
    why = Counter(_why_left_out(left_out[name], impls.get(name)) for name in left_out)
    counts = ", ".join(f"{n} {what}" for what, n in why.most_common())
    return (
        f"not run: {counts}\n  (--dry-run names each and why; name them in --impls to "
        f"record their rows anyway)"
    )


def _why_left_out(reason: str, impl) -> str:
    """One left-out impl's reason as a group: 'not installed', 'not for device=cpu', ..."""
    if impl is None:
        return reason
    if impl.unavailable:
        return "not installed" if "not installed" in reason else "unavailable"
    if reason == COMPILED_LEFT_OUT:
        return "use torch.compile"
    return "not for " + reason.split(" (supported")[0].split("; ")[0]


def check_profile_filter(profile: tuple[str, ...] | None, impls: list, cases: list) -> None:
    """--profile with texts that no (impl, case) pair contains would profile nothing."""
    if not profile:
        return
    pairs = [f"{i.name} {c.label()}" for i in impls for c in cases]
    if not any(all(part in text for part in profile) for text in pairs):
        raise UsageError(
            f"--profile {','.join(profile)}: no (impl, case) pair contains all of "
            f"{list(profile)}; pairs look like {pairs[0]!r} (give parts of it, "
            f"comma separated, or 'all')"
        )


def unfit_lines(impls: list, cases: list[Case]) -> list[str]:
    """One line per impl that fits no case of the grid (every row would be unsupported):
    its first reason and the flag that would make a case it takes."""
    lines = []
    for impl in impls:
        reasons = [impl.reasons(c) for c in cases]
        if cases and all(reasons):
            first = reasons[0][0]
            hint = _flag_hint(first)
            lines.append(
                f"{impl.name} fits no case of this grid ({first}): its rows will be "
                f"unsupported" + (f"; {hint} makes cases it takes" if hint else "")
            )
    return lines


def _flag_hint(reason: str) -> str:
    """The sweep flag and value a '<field>=<value> (supported: a, b)' reason points to."""
    m = re.match(r"^(\w+)=\S+ \(supported: ([^),;]+)", reason)
    dim = DIM.get(m.group(1)) if m else None
    if dim is None or not dim.options:
        return ""
    return f"--{dim.options[0].replace('_', '-')} {m.group(2).strip()}"
