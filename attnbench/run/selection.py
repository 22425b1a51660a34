"""Which impls a sweep runs: those named, or the preset's (or every impl) that can run some
case of the grid, and those left out with why; and that a --profile filter matches a pair."""

from __future__ import annotations

import difflib

from attnbench.case import Case
from attnbench.errors import UsageError
from attnbench.spec import Spec


def select_impls(
    names: list[str] | None, impls: dict, spec: Spec, cases: list[Case]
) -> tuple[list, dict[str, str]]:
    """The impls to run, and those left out (name -> why). Named impls all run (their rows
    say what they cannot do); without names, the preset's impls (or every impl) that can run
    some case of the grid, so that no preset fills its rows with 'unsupported'."""
    if names is None:
        if spec.impls is not None:  # the preset's own
            pool = [impls[n] for n in spec.impls if n in impls]
            left_out = {n: "not registered here" for n in spec.impls if n not in impls}
        else:
            pool = [i for i in impls.values() if spec.compiled or not i.compiled]
            left_out = {
                i.name: "uses torch.compile (a compile per shape): name it in --impls"
                for i in impls.values()
                if i not in pool
            }
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
            close = difflib.get_close_matches(name, list(impls), n=1)
            did = f"; did you mean {close[0]!r}?" if close else ""
            raise UsageError(
                f"--impls: unknown impl {name!r}{did} "
                f"(known: {', '.join(impls)}; see attnbench list)"
            )
    return [impls[n] for n in names], {}


def left_out_text(left_out: dict[str, str]) -> str:
    lines = ["not run, as no --impls named them (name them to record their rows anyway):"]
    return "\n".join(lines + [f"  {name}: {why}" for name, why in left_out.items()])


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
