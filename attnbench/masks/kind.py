"""The registry of mask kinds. A kind is one file (attnbench/masks/<name>.py, or a plugin's
file) declaring a ``MaskKind``: its name and meaning, its spec (parsing and the message that
says how to fix a bad one), its checks on a case, the data it draws from the seed (a
``Layout``), its exact pair count and its label. A kind with drawn or structured data keeps
its rules in its ``Layout``: ``rule`` (what impls run: dense, per tile, or as a FlexAttention
mask_mod) and ``hidden`` (the float64 reference's rule, written out on its own, on purpose).

The interval kinds (none, padding, window) share one layout (interval.py's ``Interval``): its
keys are one interval per query, whose geometry (rules.py) impls may use directly.

A kind is checked when it is registered (its name, every method taking what the harness
passes: contract.py); ``try_kind`` runs a plugin's kind on a small case when its file loads.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from attnbench.masks.contract import (
    GUIDE,
    ContractError,
    attempt,
    check_calls,
    check_defined,
    check_name,
    expect,
    tensor_of,
)

if TYPE_CHECKING:
    import torch

KINDS: dict[str, MaskKind] = {}

# what the harness calls on a kind: method -> (arguments passed, how the guide writes it)
CALLS = {
    "canonical": (1, "canonical(self, spec)"),
    "check": (1, "check(self, case)"),
    "layout": (2, "layout(self, case, seed)"),
    "from_draws": (2, "from_draws(self, case, record)"),
    "pairs": (2, "pairs(self, case, layout)"),
    "label": (1, "label(self, case)"),
}


class MaskKind:
    """One kind of mask; subclass it and ``register_kind`` an instance."""

    name = ""
    meaning = ""  # one phrase: --mask's help and the mask column's meaning (docs/columns.md)
    short = ""  # its name in the terminal's narrow tables (blank: the name)
    default_spec: str | None = None  # the spec when none is given (None: see takes_spec)
    spec_flag = ""  # where its spec is given: its own option, else --mask KIND:SPEC
    self_only = False  # needs seq_q == seq_kv
    needs_causal = False  # only defined with causal true
    aligned = False  # the causal alignment places it (as it places a causal mask)

    @property
    def takes_spec(self) -> bool:
        """Whether the kind takes a spec: those with a default; a kind whose spec must be
        given (no default) sets this True."""
        return self.default_spec is not None

    def canonical(self, spec: str | None) -> str | None:
        """The canonical spec (defaults filled in); ValueError saying how to fix a bad one."""
        if spec is not None:
            raise ValueError(f"mask {self.name} takes no spec (got {spec!r})")
        return None

    def check(self, case) -> None:
        """ValueError naming the problem and the fix when ``case`` cannot have this mask."""
        if self.needs_causal and not case.causal:
            raise ValueError(f"mask {self.name} is causal: set causal true (--causal true)")
        if self.self_only and case.cross:
            raise ValueError(
                f"mask={self.name} is self-attention: seq_q={case.seq_q} and "
                f"seq_kv={case.seq_kv} must be equal"
            )

    def layout(self, case, seed: int) -> Layout:
        """The case's mask data, drawn from ``seed`` where it draws any."""
        raise NotImplementedError(f"{type(self).__name__} defines no layout(self, case, seed)")

    def from_draws(self, case, record: dict) -> Layout | None:
        """The layout from a run's draws-file record (``Layout.draws``'s fields)."""
        return self.layout(case, 0)

    def pairs(self, case, layout: Layout) -> int:
        """Kept (query, key) pairs per head, summed over the batch, exactly."""
        if layout is None:
            raise ValueError(f"mask={self.name}: the pair count needs the case's drawn layout")
        return layout.pairs(case.causal)

    # the conventions next to this kind's that an impl may have taken by mistake, by name
    # (measure/diagnose.py tries each on an output that disagrees): see ``near_miss``
    near_misses: tuple[str, ...] = ()

    def near_miss(self, name: str, layout: Layout) -> tuple[Layout, str] | None:
        """The layout the near miss ``name`` would have used instead of ``layout``, and what
        it is in a note ("window 5; declared window 4"); None where it would change nothing."""
        return None

    def label(self, case) -> str:
        """Its part of the case label, leading space included (it never changes for a case)."""
        return f" {self.name}" + (f" {case.pattern}" if case.pattern else "")


def register_kind(kind: MaskKind) -> MaskKind:
    """Add a kind to the registry (a plugin's file calls this at import) once its name and
    methods are checked; a name taken by a different kind is an error."""
    if not isinstance(kind, MaskKind):
        hint = f": register_kind({kind.__name__}())" if isinstance(kind, type) else ""
        raise ContractError(f"register_kind takes a MaskKind instance{hint} ({GUIDE})")
    check_name("mask kind", kind.name, reserved="causal")
    check_calls(f"mask kind {kind.name!r}", type(kind), CALLS)
    check_defined(f"mask kind {kind.name!r}", type(kind), MaskKind, {"layout": CALLS["layout"][1]})
    old = KINDS.get(kind.name)
    if old is not None and type(old) is not type(kind):
        raise ValueError(f"mask kind {kind.name!r} is already registered ({type(old).__name__})")
    KINDS[kind.name] = kind
    return kind


def try_kind(kind: MaskKind, case) -> None:
    """Run ``kind`` on one small case as a sweep does: its layout drawn, its rule over the
    case, the reference's rule, the pair count and the label; ContractError naming what failed
    (whether rule and hidden agree is the reference's to find, row by row)."""
    import torch

    run = functools.partial(attempt, f"mask kind {kind.name!r}", type(kind))
    name, Sq, Skv, causal = type(kind).__name__, case.seq_q, case.seq_kv, case.causal
    layout = run(f"{name}.layout", lambda: kind.layout(case, 0), _a_layout)
    rows, shown = layout.rows, type(layout).__name__
    i, j = torch.arange(Sq)[:, None], torch.arange(Skv)[None, :]  # (Sq, 1), (1, Skv)
    keep = lambda: layout.keep(0, Sq, 0, Skv, causal, "cpu")
    run(f"{shown}.rule", keep, tensor_of((rows, Sq, Skv), torch.bool))
    run(f"{shown}.hidden", lambda: layout.hidden(i, j, causal), _hidden(rows, Sq, Skv))
    run(f"{name}.pairs", lambda: kind.pairs(case, layout), _count)
    run(f"{name}.label", lambda: kind.label(case), _text)


def _a_layout(out) -> None:
    expect(isinstance(out, Layout), f"returned {out!r}, expected a Layout")


def _hidden(rows: int, Sq: int, Skv: int):
    """hidden's (Bm, Sq, Skv): Bm the layout's rows, or 1 where every row is alike."""
    import torch

    one, each = tensor_of((1, Sq, Skv), torch.bool), tensor_of((rows, Sq, Skv), torch.bool)
    return lambda out: (one if getattr(out, "shape", (0,))[:1] == (1,) else each)(out)


def _count(out) -> None:
    expect(int(out) == out >= 0, f"returned {out!r}, expected a count (an int >= 0)")


def _text(out) -> None:
    expect(isinstance(out, str), f"returned {out!r}, expected a str")


def find_kind(name: str) -> MaskKind:
    """The kind named ``name``; ValueError listing the kinds."""
    if name not in KINDS:
        raise ValueError(f"unknown mask {name!r} (allowed: {', '.join(KINDS)})")
    return KINDS[name]


class Layout:
    """A kind's mask for one case (S = seq_len, B = batch): what impls run and what the
    reference checks them against. Subclasses give ``rule`` and ``hidden``; the rest follows
    from ``rule`` unless a kind has a faster exact way."""

    kind = ""

    def __init__(self, seq_len: int, batch: int):
        self.seq_len, self.batch = seq_len, batch
        self._cache: dict = {}

    def rule(self, b, i, j, causal: bool):
        """True where query i keeps key j in batch row b, causal combined as the kind says;
        b, i, j broadcast (tensors: index grids, or FlexAttention's scalars)."""
        raise NotImplementedError(f"{type(self).__name__} defines no rule(self, b, i, j, causal)")

    def hidden(self, i: torch.Tensor, j: torch.Tensor, causal: bool) -> torch.Tensor:
        """The reference's rule: True where key j is hidden from query i, (Bm, c, Skv) for
        query indices i (c, 1) and key indices j (1, Skv); written apart from ``rule``."""
        raise NotImplementedError(f"{type(self).__name__} defines no hidden(self, i, j, causal)")

    def draws(self) -> dict:
        """What the layout drew from the seed, JSON-ready, for the run's draws file."""
        return {}

    @property
    def rows(self) -> int:
        """Bm: B when the mask differs between batch rows, else 1."""
        return 1

    def keep(self, q0: int, q1: int, k0: int, k1: int, causal: bool, device) -> torch.Tensor:
        """True = attend, for queries q0..q1-1 and keys k0..k1-1: (Bm, bq, bk)."""
        import torch

        b = torch.arange(self.rows, device=device)[:, None, None]
        i = torch.arange(q0, q1, device=device)[None, :, None]
        j = torch.arange(k0, k1, device=device)[None, None, :]
        out = self.rule(b, i, j, causal)
        return out.expand(self.rows, q1 - q0, k1 - k0)

    def dense(self, causal: bool, device) -> torch.Tensor:
        """The whole mask, True = attend: (Bm, 1, S, S), cached."""
        S = self.seq_len
        return self.cached(
            ("dense", causal, str(device)), lambda: self.keep(0, S, 0, S, causal, device)[:, None]
        )

    def tile(self, q0: int, q1: int, k0: int, k1: int, causal: bool) -> str:
        """Whether the tile (queries q0..q1-1, keys k0..k1-1) is 'empty', 'full' (every pair
        kept, in every batch row) or 'partial'."""
        keep = self.keep(q0, q1, k0, k1, causal, "cpu")
        return "empty" if not bool(keep.any()) else "full" if bool(keep.all()) else "partial"

    def pairs(self, causal: bool) -> int:
        """Kept pairs per head, summed over the batch: counted from ``rule`` by row chunks."""
        S, step = self.seq_len, max(1, 2**24 // max(self.seq_len * self.rows, 1))
        kept = sum(
            int(self.keep(q0, min(q0 + step, S), 0, S, causal, "cpu").sum())
            for q0 in range(0, S, step)
        )
        return kept * (self.batch // self.rows)

    def cached(self, key, make):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]
