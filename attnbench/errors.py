"""The exceptions attnbench raises on purpose. Every one is an ``AttnbenchError``; a
``UsageError`` is bad input, printed as one line with exit code 2 and nothing written; a
``ClusterLost`` is one line with exit code 3.
``did_you_mean`` is the one hint for a mistyped name, ``one_line`` the one way an error's
text becomes one line."""

import difflib
from collections.abc import Iterable


class AttnbenchError(Exception):
    """Base of attnbench's own exceptions."""


class UsageError(AttnbenchError, ValueError):
    """Bad input (a flag, a sweep file, a plugin, a run folder): one line, exit code 2."""


class ClusterLost(AttnbenchError):
    """Every executor of a Ray sweep was lost before its first row: one line, exit code 3."""


def did_you_mean(name: str, known: Iterable[str], cutoff: float = 0.6) -> str:
    """ "; did you mean 'X'?" for the known name closest to ``name``, or ""."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=cutoff)
    return f"; did you mean {close[0]!r}?" if close else ""


def one_line(what: BaseException | str, limit: int | None = None) -> str:
    """An exception's (or a message's) text on one line, cut at ``limit`` characters."""
    text = " ".join(str(what).split())
    if limit is not None and len(text) > limit:
        return text[:limit] + "..."
    return text
