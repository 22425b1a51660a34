"""A failed row's reason as a report's table shows it: one line naming the cause, without
tensor sizes, file paths, tracebacks or the advice libraries append (the row keeps the full
text, and errors.log the whole error), so that one cause reads the same in every case and
repeated causes group into one line with a count."""

from __future__ import annotations

import re

import pandas as pd

MAX_CHARS = 200
ELLIPSIS = "…"
# text cut out wherever it appears: (pattern, replacement), applied in order
CUTS = (
    (r"\s*\(cut short: the full error is in errors\.log in the run folder\)", ""),
    (r"\s*Set TORCHDYNAMO_VERBOSE=1.*$", ""),  # torch.compile's advice, to the end
    (r"Traceback \(most recent call last\):.*?\[\.\.\.\]\s*[a-z]*\s*", "… "),  # a cut traceback
    (r"Traceback \(most recent call last\):.*$", ""),
    (r'File "[^"]*"(, line \d+)?(, in \S+)?', ""),
    (r"(?<![\w.])/[\w.\-/]+", "<path>"),  # absolute paths (a host's, a temp file's)
    (r"\s*\[\.\.\.\]\s*[a-z]*", " … "),  # the row's own cut (run/measuring/failed.py), a cut word
    (r"SubprocException: An exception occurred in a subprocess:\s*", ""),
    (r"(?:[A-Z]\w*\.?\s?sizes\(\): \[[\d, ]*\],?\s*)+(?:instead\.?)?", ""),  # SDPA's sizes
    (r"\s*Command: .*$", ""),  # a compiler's command line, to the end
    (r"\s*Name=\S+", ""),
    (r"\s*\[\d+(?:, \d+)+\]", ""),  # any other shape
    (r"(?i)(memory efficient|flash attention|cudnn attention) kernel not used because: ", ""),
    (r"^out of memory at [^:]*: ", ""),  # the case is in the case column
)
# sentences left out: other backends switched off by forcing one, allocator statistics,
# library advice
DROP = (
    r"has been runtime disabled",
    r"^instead$",
    r"^To broadcast",
    r"GPU \d+ has a total capacity",
    r"^Including non-PyTorch memory",
    r"^Of the allocated memory",
    r"^If reserved but unallocated",
    r"^See documentation",
    r"^For even more developer context",
)


def short_reason(reason) -> str:
    """One line for a table ('' for no reason): the cause, cut to MAX_CHARS."""
    if reason is None or (not isinstance(reason, str) and pd.isna(reason)):
        return ""
    text = " ".join(str(reason).split())
    for pattern, repl in CUTS:
        text = re.sub(pattern, repl, text)
    head = re.match(r"^[^:]{1,60} refused: ", text)  # "PyTorch's flash backend refused: "
    head, text = (head.group(0), text[head.end() :]) if head else ("", text)
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+(?=[A-Za-z(])", text)]
    kept = [s for s in sentences if s and not any(re.search(p, s) for p in DROP)]
    text = head + " ".join(kept).strip(" .;:")
    return text if len(text) <= MAX_CHARS else text[: MAX_CHARS - 1].rstrip() + ELLIPSIS
