"""Mask window (local attention, width W = the case's ``window``): query i at position p keeps
keys |p - j| < W (2W - 1 keys around p), or with causal p - W < j <= p (a sliding window of W
keys ending at p). The causal alignment places it (rules.py); docs/method.md maps W to other
libraries' window conventions."""

from attnbench.masks.interval import IntervalKind
from attnbench.masks.kind import register_kind


class Window(IntervalKind):
    name = "window"
    meaning = "local attention of width W (--window)"
    spec_flag = "--window"
    aligned = True

    def check(self, case) -> None:
        W = case.window
        if isinstance(W, bool) or not isinstance(W, int) or W <= 0:
            raise ValueError(
                f"mask=window needs a positive integer window (got {W!r}; set --window)"
            )
        if case.seq_q + case.shift > case.seq_kv + W - 1:
            raise ValueError(
                f"mask=window with window={W}: queries i >= seq_kv + window - 1 = "
                f"{case.seq_kv + W - 1} would see no key (seq_q={case.seq_q}); use a wider "
                f"window or more keys"
            )

    def label(self, case) -> str:
        return f" window{case.window}"


register_kind(Window())
