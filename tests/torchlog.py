"""stderr without the torch build's own log lines, for tests that count what a program wrote.

Some torch builds log at import, in glog's format ("W1123 21:55:22.911000 19708 file.py:140]
..."): PyPI's CUDA build on a machine without a driver says it found no CUDA runtime. Such a
line is not the program's; a test of "one clear line" counts the others."""

import re

TORCH_LOG_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] ")


def own_lines(stderr: str) -> list[str]:
    """stderr's lines that the program wrote: not the torch build's log lines."""
    return [ln for ln in stderr.strip().splitlines() if not TORCH_LOG_LINE.match(ln)]
