"""Score modifier softcap (logit soft-capping, Gemma 2: 50 in attention, Grok-1: 30):
s -> cap · tanh(s / cap), which bounds every score to (-cap, cap). ``--score-mod softcap:50``."""

from __future__ import annotations

from attnbench.masks.scores import ScoreMod, register_mod


@register_mod
class Softcap(ScoreMod):
    name = "softcap"
    short = "cap"
    meaning = "logit soft-capping, cap · tanh(s / cap) (softcap:CAP, default 50: Gemma 2)"
    default_arg = "50"

    def __init__(self, arg, heads, device="cpu"):
        super().__init__(arg, heads, device)
        self.cap = float(arg)

    @classmethod
    def canonical(cls, arg):
        try:
            cap = float(arg)
        except (TypeError, ValueError):
            cap = float("nan")
        if not cap > 0 or cap == float("inf"):
            raise ValueError(f"softcap:{arg} needs a positive cap (e.g. softcap:50)")
        return f"{cap:g}"

    def apply(self, s, h, p, j):
        return (s / self.cap).tanh() * self.cap

    def grad(self, s, h, p, j):
        return 1 - (s / self.cap).tanh().square()

    def reference(self, s, h, p, j):
        # tanh(x) = sign(x) (1 - 2 / (e^{2|x|} + 1)), which stays finite for any x
        x = s / self.cap
        return self.cap * x.sign() * (1 - 2 / ((2 * x.abs()).exp() + 1))
