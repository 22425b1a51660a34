"""The exceptions attnbench raises on purpose. Every one is an ``AttnbenchError``; a
``UsageError`` is bad input, printed as one line with exit code 2 and nothing written."""


class AttnbenchError(Exception):
    """Base of attnbench's own exceptions."""


class UsageError(AttnbenchError, ValueError):
    """Bad input (a flag, a sweep file, a plugin, a run folder): one line, exit code 2."""
