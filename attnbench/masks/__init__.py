"""Mask kinds and score modifiers, each declared once in a file of its own (kind.py and
scores.py say what a file declares; a plugin registers its own the same way), the geometry
the interval kinds share (rules.py), and the ``Mask`` an impl receives (mask.py).

A mask is a case dimension next to ``causal``, which combines with every kind as the kind
says (most keep a key only if causal keeps it too; prefix_lm needs causal). A score modifier
is a case dimension of its own (``score_mod``) and combines with every mask.
"""

# isort: off
# each file registers itself, in this order (the order --mask's help and the tables list them)
from attnbench.masks import none, padding, window  # noqa: F401
from attnbench.masks import document, block_sparse, strided, prefix_lm  # noqa: F401
from attnbench.masks import softcap, alibi  # noqa: F401

# isort: on
from attnbench.masks.kind import KINDS, Layout, MaskKind, find_kind, register_kind
from attnbench.masks.mask import Mask
from attnbench.masks.rules import ALIGNS, FAR, block_keep, interval, key_bounds, offset, reach
from attnbench.masks.scores import MODS, ScoreMod, canonical_mod, make_mod, register_mod

MASKS = tuple(KINDS)  # the built-in kinds; KINDS also holds those plugins register
ANY = ("*",)  # an impl's masks= or score_mods=: every registered kind or modifier

__all__ = [
    "ALIGNS",
    "ANY",
    "FAR",
    "KINDS",
    "MASKS",
    "MODS",
    "Layout",
    "Mask",
    "MaskKind",
    "ScoreMod",
    "block_keep",
    "canonical_mod",
    "find_kind",
    "interval",
    "key_bounds",
    "make_mod",
    "offset",
    "reach",
    "register_kind",
    "register_mod",
]
