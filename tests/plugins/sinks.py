"""A plugin's mask kind in one file: a sliding window with attention sinks (StreamingLLM, Xiao
et al. 2023): query i keeps the first S keys (the sinks) and the W keys ending at itself.
Spec W:S (``--plugin sinks.py --mask sliding_window_with_sinks:8:2``); causal only."""

from attnbench.masks import Layout, MaskKind, register_kind


class WindowAndSinks(Layout):
    kind = "sliding_window_with_sinks"

    def __init__(self, seq_len: int, batch: int, window: int, sinks: int):
        super().__init__(seq_len, batch)
        self.window, self.sinks = window, sinks

    def rule(self, b, i, j, causal):
        return ((j < self.sinks) | (i - j < self.window)) & (j <= i)

    def hidden(self, i, j, causal):
        ahead = j > i  # (c, Skv)
        too_far = (i - j >= self.window) & (j >= self.sinks)
        return (ahead | too_far)[None]


class SlidingWindowWithSinks(MaskKind):
    name = "sliding_window_with_sinks"
    meaning = "a causal window of W keys plus the first S keys (W:S)"
    default_spec = "64:4"
    self_only = True
    needs_causal = True

    def canonical(self, spec):
        text = self.default_spec if spec is None else str(spec)
        parts = text.split(":")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"{text!r} is not W:S, two positive integers (e.g. 64:4)")
        return ":".join(str(int(p)) for p in parts)

    def layout(self, case, seed):
        window, sinks = (int(p) for p in case.pattern.split(":"))
        return WindowAndSinks(case.seq_q, case.batch, window, sinks)


register_kind(SlidingWindowWithSinks())
