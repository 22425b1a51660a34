"""The registry of score modifiers: a function of the scaled score s of query position p, key
j and query head h, applied before the mask and the softmax (FlexAttention's score_mod).
A modifier is one file (attnbench/masks/<name>.py, or a plugin's) declaring a ``ScoreMod``:
``apply`` is the modified scores (torch ops that broadcast, and serve as a FlexAttention
score_mod body; impls run it as ``scores``, which keeps s's dtype), ``grad`` its derivative
for hand-written backwards, and ``reference`` the float64 reference's version, written out on
its own, on purpose. A case names one modifier in its ``score_mod`` column (``softcap:50``,
``alibi``; blank: none); it combines with every mask. Modifiers do not change the pair count
or the FLOPs (matmul work only).

What an impl needs of a modifier beyond running it (``NEEDS``: only adding a bias, a declared
derivative) is data on the modifier class, read when a case is matched with an impl
(``lacking``), so a plugin's modifier is taken wherever it qualifies.

A modifier is checked when it is registered (its name, apply and reference defined, every
method taking what the harness passes: contract.py) and tried once on small scores when a
case's text names it (``canonical_mod``), in the driver, before any worker starts."""

from __future__ import annotations

import functools

from attnbench.masks.contract import (
    GUIDE,
    ContractError,
    agreeing,
    attempt,
    broadcasting_to,
    check_calls,
    check_defined,
    check_name,
    tensor_of,
)

MODS: dict[str, type[ScoreMod]] = {}

# what the harness calls on a modifier: method -> (arguments passed, how the guide writes it)
CALLS = {
    "__init__": (
        3,
        '__init__(self, arg, heads, device="cpu") calling super().__init__(arg, heads, '
        "device), or no __init__",
    ),
    "canonical": (1, "canonical(cls, arg) as a @classmethod"),
    "apply": (4, "apply(self, s, h, p, j)"),
    "grad": (4, "grad(self, s, h, p, j)"),
    "reference": (4, "reference(self, s, h, p, j)"),
    "bias": (3, "bias(self, h, p, j)"),
}
REQUIRED = {  # what a modifier must define: method -> how the guide writes it
    "apply": "apply(self, s, h, p, j), the modified scores impls run",
    "reference": "reference(self, s, h, p, j), the float64 reference's version",
}
GRAD = CALLS["grad"][1]
# what an impl may need of a modifier (register's score_mod_needs): need -> (the supported
# side of its reason, what a modifier {name} that lacks it is told); whether a modifier has a
# need is ScoreMod.has's answer
NEEDS = {
    "additive": (
        "additive modifiers, which only add a bias: additive = True and bias(self, h, p, j)",
        "{name} is not additive",
    ),
    "grad": (
        f"with backward, modifiers that declare {GRAD}, d apply / d s, which its "
        "hand-written backward calls",
        f"{{name}} declares none: add {GRAD} to it, or run mode fwd",
    ),
}


class ScoreMod:
    """One modifier of one case; subclass it and ``register_mod`` the class.

    The contract (docs/plugins.md, "A mask kind or a score modifier of your own"):
    ``apply(s, h, p, j)`` returns the modified scores with s's shape (broadcast) and in s's
    dtype, the dtype the impl computes its scores in (bfloat16 in ``naive`` for a bfloat16
    case, float32 in ``tiled``, FlexAttention's own); one that returns another dtype (a float32
    bias added to bfloat16 scores promotes them) is cast back to s's dtype by ``scores``, which
    is what impls call. ``grad`` has no default but for an ``additive`` modifier (whose
    derivative is 1): one that leaves it out runs wherever autograd differentiates ``apply``,
    and impls with a hand-written backward refuse it with backward, naming the fix
    (``NEEDS``)."""

    name = ""
    meaning = ""  # one phrase: --score-mod's help
    short = ""  # its name in the terminal's narrow tables (blank: the name)
    default_arg: str | None = None  # the argument when none is given; None: takes none
    additive = False  # s + bias(h, p, j): expressible as a float attn_mask

    def __init__(self, arg: str | None, heads: int, device="cpu"):
        self.arg, self.heads, self.device = arg, heads, device

    @classmethod
    def canonical(cls, arg: str | None) -> str | None:
        """The canonical argument; ValueError saying how to fix a bad one."""
        if arg is not None:
            raise ValueError(f"score_mod {cls.name} takes no argument (got {arg!r})")
        return None

    @classmethod
    def has(cls, need: str) -> bool:
        """Whether the modifier has ``need`` (a key of ``NEEDS``): declared data, read on the
        class (a plugin's modifier qualifies as a built-in one does)."""
        if need == "additive":
            return cls.additive
        return cls.additive or cls.grad is not ScoreMod.grad  # "grad"

    def apply(self, s, h, p, j):
        """The modified scores, in s's dtype; s, h, p, j broadcast (tensors)."""
        raise NotImplementedError

    def scores(self, s, h, p, j):
        """What impls run: ``apply``'s scores in s's dtype, whatever dtype apply returned."""
        return self.apply(s, h, p, j).to(s.dtype)

    def grad(self, s, h, p, j):
        """d apply / d s, broadcasting to s, or None where it is 1 (an additive modifier's,
        without declaring it); no default for other modifiers."""
        if self.additive:
            return None
        raise NotImplementedError(f"score_mod {self.name} declares no {GRAD}")

    def reference(self, s, h, p, j):
        """The reference's version, in s's dtype (float64)."""
        raise NotImplementedError

    def bias(self, h, p, j):
        """The additive bias of an ``additive`` modifier, float32."""
        raise NotImplementedError


def lacking(cls: type[ScoreMod], needs: tuple[str, ...], text: str, backward: bool) -> list[str]:
    """Why an impl needing ``needs`` cannot take modifier ``cls`` in a case whose score_mod
    text is ``text`` ("grad" matters with backward only): readable reasons, [] when none."""
    out = []
    for need in needs:
        if cls.has(need) or (need == "grad" and not backward):
            continue
        supported, lacks = NEEDS[need]
        out.append(f"score_mod={text} (supported: {supported}; {lacks.format(name=cls.name)})")
    return out


def register_mod(cls: type[ScoreMod]) -> type[ScoreMod]:
    """Add a modifier class to the registry (a plugin's file decorates its class with it) once
    its name and methods are checked; a name taken by a different class is an error."""
    if not (isinstance(cls, type) and issubclass(cls, ScoreMod)):
        raise ContractError(f"register_mod takes a ScoreMod subclass, not {cls!r} ({GUIDE})")
    check_name("score_mod", cls.name, reserved="none")
    what = f"score_mod {cls.name!r}"
    bias = {"bias": "bias(self, h, p, j), as additive = True says it adds one"}
    check_defined(what, cls, ScoreMod, REQUIRED | (bias if cls.additive else {}))
    check_calls(what, cls, CALLS, on_class=("__init__", "canonical"))
    old = MODS.get(cls.name)
    if old is not None and old is not cls and old.__qualname__ != cls.__qualname__:
        raise ValueError(f"score_mod {cls.name!r} is already registered ({old.__name__})")
    MODS[cls.name] = cls
    return cls


def canonical_mod(text: str | None) -> str:
    """The canonical text of a score_mod (blank or 'none': no modifier); ValueError naming the
    fix."""
    text = (text or "").strip()
    if text in ("", "none"):
        return ""
    name, sep, arg = text.partition(":")
    if name not in MODS:
        raise ValueError(f"unknown score_mod {name!r} (allowed: none, {', '.join(MODS)})")
    cls = MODS[name]
    arg = cls.canonical(arg if sep else cls.default_arg)
    tried(cls, arg)
    return name if arg is None else f"{name}:{arg}"


@functools.cache
def tried(cls: type[ScoreMod], arg: str | None) -> None:
    """Run the modifier once on small scores as impls and the reference do (2 heads, 3 queries
    at positions 1..3 among 4 keys, on the CPU); ContractError naming what failed."""
    import torch

    what, name = f"score_mod {cls.name}" + ("" if arg is None else f":{arg}"), cls.__name__
    s = torch.linspace(-4.0, 4.0, 24).view(1, 2, 3, 4)  # (1, H, Sq, Skv) float32
    s64, shape = s.double(), tuple(s.shape)
    h = torch.arange(2)[None, :, None, None]  # (1, H, 1, 1)
    p, j = torch.arange(1, 4)[:, None], torch.arange(4)[None, :]  # (Sq, 1), (1, Skv)
    run = functools.partial(attempt, what, cls)  # run(call, step, check)
    mod = run(f"{name}({arg!r}, heads=2)", lambda: cls(arg, 2, "cpu"))
    run(f"{name}.apply", lambda: mod.apply(s, h, p, j), tensor_of(shape, None))  # scores casts
    ref = run(f"{name}.reference", lambda: mod.reference(s64, h, p, j), tensor_of(shape, s64.dtype))
    # the three ways impls read a modifier say the same (a slip in one: impls disagree)
    apply64 = lambda: mod.apply(s64, h, p, j).double()  # noqa: E731
    run(f"{name}.apply", apply64, agreeing(ref, f"{name}.reference"))
    if cls.has("grad"):
        run(f"{name}.grad", lambda: mod.grad(s, h, p, j), broadcasting_to(shape))
    if cls.additive:
        bias = run(f"{name}.bias", lambda: mod.bias(h, p, j), broadcasting_to(shape))
        with_bias = lambda: s64 + bias.double()  # noqa: E731
        run(f"s + {name}.bias", with_bias, agreeing(ref, f"{name}.reference"))


def make_mod(text: str, heads: int, device="cpu") -> ScoreMod | None:
    """The modifier of a case's (canonical) score_mod text for ``heads`` query heads, its
    tensors on ``device``; None for none."""
    if not text:
        return None
    name, _, arg = text.partition(":")
    return MODS[name](arg or None, heads, device)
