"""Mask window (local attention of width W, the kind's spec: ``--mask window:W``, or
``--window W``): query i at position p keeps keys |p - j| < W (2W - 1 keys around p), or with
causal p - W < j <= p (a sliding window of W keys ending at p). The causal alignment places it
(rules.py); docs/method.md maps W to other libraries' window conventions."""

from attnbench.masks.interval import IntervalKind
from attnbench.masks.kind import register_kind


class Window(IntervalKind):
    name = "window"
    meaning = "local attention of width W (--window W or --mask window:W)"
    short = "win"
    spec_flag = "--window"
    takes_spec = True  # and has no default: the width must be given
    aligned = True

    def canonical(self, spec):
        text = "" if spec is None else str(spec).strip()
        if not text.isdigit() or int(text) <= 0:
            got = "none" if spec is None else repr(spec)
            raise ValueError(
                f"needs the window width W, a positive integer (got {got}; e.g. --window 64 "
                f"or --mask window:64)"
            )
        return str(int(text))

    def check(self, case) -> None:
        super().check(case)
        W = int(self.canonical(case.pattern))
        if case.seq_q + case.shift > case.seq_kv + W - 1:
            raise ValueError(
                f"mask=window with window={W}: queries i >= seq_kv + window - 1 = "
                f"{case.seq_kv + W - 1} would see no key (seq_q={case.seq_q}); use a wider "
                f"window or more keys"
            )

    def limits(self, case, seed):
        return {"window": int(case.pattern)}

    near_misses = ("window_minus_1", "window_plus_1")  # W - 1 and W + 1: off-by-one widths

    def near_miss(self, name, layout):
        delta = -1 if name == "window_minus_1" else 1
        near = layout.moved(widen=delta)
        return near and (near, f"window {near.window}; declared window {layout.window}")

    def label(self, case) -> str:
        return f" window{case.pattern}"


register_kind(Window())
