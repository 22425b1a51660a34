"""The registry of score modifiers: a function of the scaled score s of query position p, key
j and query head h, applied before the mask and the softmax (FlexAttention's score_mod).
A modifier is one file (attnbench/masks/<name>.py, or a plugin's) declaring a ``ScoreMod``:
``apply`` is what impls run (torch ops that broadcast, and serve as a FlexAttention
score_mod body), ``grad`` its derivative for hand-written backwards, and ``reference`` the
float64 reference's version, written out on its own, on purpose. A case names one modifier
in its ``score_mod`` column (``softcap:50``, ``alibi``; blank: none); it combines with every
mask. Modifiers do not change the pair count or the FLOPs (matmul work only)."""

from __future__ import annotations

MODS: dict[str, type[ScoreMod]] = {}


class ScoreMod:
    """One modifier of one case; subclass it and ``register_mod`` the class."""

    name = ""
    meaning = ""  # one phrase: --score-mod's help
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

    def apply(self, s, h, p, j):
        """The modified scores; s, h, p, j broadcast (tensors)."""
        raise NotImplementedError

    def grad(self, s, h, p, j):
        """d apply / d s, or None where it is 1."""
        return None

    def reference(self, s, h, p, j):
        """The reference's version, in s's dtype (float64)."""
        raise NotImplementedError

    def bias(self, h, p, j):
        """The additive bias of an ``additive`` modifier, float32."""
        raise NotImplementedError


def register_mod(cls: type[ScoreMod]) -> type[ScoreMod]:
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
    return name if arg is None else f"{name}:{arg}"


def make_mod(text: str, heads: int, device="cpu") -> ScoreMod | None:
    """The modifier of a case's (canonical) score_mod text for ``heads`` query heads, its
    tensors on ``device``; None for none."""
    if not text:
        return None
    name, _, arg = text.partition(":")
    return MODS[name](arg or None, heads, device)
