"""The sweep spec: presets, and their expansion into validated cases."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

from attnbench.case import MODES, PHASES, Case, CaseError, canonical_dtype
from attnbench.dims import DIMS
from attnbench.masks import ALIGNS, KINDS, MASKS, MODS, canonical_mod
from attnbench.masks.blocks import block_kinds, fits
from attnbench.models import model as find_model
from attnbench.plugins import unknown_hint

# --mask values: the masks (KIND or KIND:SPEC), and "causal" for mask none with causal true
MASK_CHOICES = ("none", "causal", *MASKS[1:])

PRESETS: dict[str, dict] = {
    # seconds, for tests and a first look: torch.compile impls only when named in --impls
    "smoke": dict(
        batch=[1],
        heads=[2],
        seq_len=[64, 128],
        head_dim=[32],
        dtype=["float32"],
        causal=[False, True],
        mode=["fwd", "fwd_bwd"],
        rep_ms=[10.0],
        compiled=False,
    ),
    # under 3 minutes on 2 cores, long enough (2048) to show naive's N^2 memory; the
    # torch.compile impls (compiling each shape takes seconds) only when named in --impls
    "cpu": dict(
        batch=[1],
        heads=[4],
        seq_len=[128, 256, 512, 1024, 2048],
        head_dim=[64],
        dtype=["float32"],
        causal=[False, True],
        mode=["fwd", "bwd"],
        compiled=False,
    ),
    # the full GPU picture: every impl but the torch.compile ones (a new graph per shape) and
    # tiled (a Python loop over tiles: minutes per row at 16k); name them in --impls to add them
    "gpu": dict(
        batch=[2],
        heads=[16],
        seq_len=[512, 1024, 2048, 4096, 8192, 16384],
        head_dim=[64, 128],
        dtype=["bfloat16"],
        causal=[False, True],
        mode=["fwd", "bwd"],
        impls=[
            "naive",
            "sdpa",
            "sdpa_flash",
            "sdpa_efficient",
            "sdpa_cudnn",
            "sdpa_math",
            "xformers",
            "triton_flash",
            "triton_flash_fa2",
        ],
    ),
    # a first look at a new GPU in a few minutes: SDPA and each backend, xformers, our kernel
    "first-light": dict(
        batch=[2],
        heads=[16],
        seq_len=[1024, 4096, 16384],
        head_dim=[128],
        dtype=["bfloat16"],
        causal=[False, True],
        mode=["fwd", "bwd"],
        rep_ms=[50.0],
        impls=[
            "sdpa",
            "sdpa_flash",
            "sdpa_efficient",
            "sdpa_cudnn",
            "sdpa_math",
            "xformers",
            "triton_flash",
            "triton_flash_fa2",
        ],
    ),
    # the kernel race: fixed tokens (B x N = 16384) and hidden size (heads x D = 2048), as
    # FlashAttention's published benchmarks use, so batch and heads follow from N and D
    "race": dict(
        batch=[1],
        heads=[1],
        seq_len=[512, 1024, 2048, 4096, 8192, 16384],
        head_dim=[64, 128],
        dtype=["bfloat16"],
        causal=[False, True],
        mode=["fwd", "bwd"],
        tokens=16384,
        hidden=2048,
        impls=[
            "triton_flash",
            "triton_flash_fa2",
            "sdpa_flash",
            "sdpa_efficient",
            "sdpa_cudnn",
            "xformers",
        ],
        baseline="sdpa_flash",
    ),
}


# the options that set a Spec's grid fields (flags and sweep-file keys of the same names)
SPEC_OPTIONS = tuple(option for dim in DIMS for option in dim.options)
CASE_FIELDS = tuple(dim.name for dim in DIMS if dim.field is None)  # a case's, one per dimension

# the options that belong to mask kinds: each kind that takes one names it as its spec_flag
KIND_OPTIONS = ("docs", "sparsity", "window")

# presets sized for a GPU: on a CPU they run only when --device cpu asks for it
GPU_PRESETS = ("gpu", "first-light", "race")

# --phase decode: new tokens per step (1, and 4 as speculative decoding verifies), cache
# lengths (up to a model's context) and batch sizes
DECODE_TOKENS = [1, 4]
DECODE_CACHE = [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
DECODE_BATCH = [1, 8, 32, 64]


@dataclass(frozen=True)
class Spec:
    """A grid: every combination of the lists becomes one case. ``kv_heads`` / ``seq_len_kv``
    of None mean "same as heads" / "same as seq_len". ``mask`` "causal" is mask none with
    causal true; the other masks combine with every ``causal`` value; ``docs``, ``sparsity``
    and ``window`` list the specs of the kinds that name them as their ``spec_flag``."""

    batch: list[int]
    heads: list[int]
    seq_len: list[int]
    head_dim: list[int]
    dtype: list[str]
    causal: list[bool]
    mode: list[str]
    device: str = "cpu"
    kv_heads: list[int] | None = None
    seq_len_kv: list[int] | None = None
    rep_ms: list[float] = field(default_factory=lambda: [100.0])  # timer budget per row
    mask: list[str] = field(default_factory=lambda: ["none"])
    window: list[int] | None = None  # mask window: the widths (its specs)
    level: list[str] = field(default_factory=lambda: ["op"])
    compiled: bool = True  # with no impls named, include those that use torch.compile
    tokens: int | None = None  # B x N fixed: batch = tokens // seq_len (overrides batch)
    hidden: int | None = None  # Hq x D fixed: heads = hidden // head_dim (overrides heads)
    impls: list[str] | None = None  # the preset's impls when none are named
    # the impl speedups are relative to, where the run has it (else the registered baseline):
    # the race has no sdpa, and races against PyTorch's FlashAttention-2
    baseline: str | None = None
    causal_align: list[str] = field(default_factory=lambda: ["top_left"])
    model: list[str] | None = None  # model presets (models.py): set the shapes
    phase: list[str] | None = None  # prefill, decode, train: set mode and lengths
    explicit: frozenset[str] = frozenset()  # fields given by flags or a sweep file: they win
    docs: list[str] | None = None  # mask document: the documents specs (patterns.py)
    sparsity: list[str] | None = None  # masks block_sparse, strided: the pattern specs
    score_mod: list[str] = field(default_factory=lambda: [""])  # score modifiers, "": none

    @classmethod
    def from_preset(cls, name: str, device: str, **overrides) -> Spec:
        if name not in PRESETS:
            raise CaseError(f"unknown preset {name!r} (allowed: {', '.join(PRESETS)})")
        given = {k: v for k, v in overrides.items() if v is not None}
        unknown = set(given) - set(cls.__dataclass_fields__)
        if unknown:
            raise CaseError(f"unknown spec fields {sorted(unknown)}")
        # a batch or head count given explicitly wins over the preset's fixed tokens / hidden
        derived = {"tokens": None} if "batch" in given else {}
        derived |= {"hidden": None} if "heads" in given else {}
        spec = cls(**PRESETS[name], device=device)
        return replace(spec, **derived, **given, explicit=frozenset(given))

    def cases(self) -> list[Case]:
        """All cases, sequence length varying fastest so one impl's growth is contiguous;
        with models or phases, one grid per (model, phase) in the order given."""
        if not self.model and not self.phase:
            out = self._grid()
        else:
            out = []
            for name in self.model or [""]:
                for phase in self.phase or [""]:
                    out += self.scoped(name, phase)._grid(name, phase)
        if "causal_align" in self.explicit:
            for align in self.causal_align:
                if not any(c.causal_align == align for c in out):
                    raise CaseError(
                        f"--causal-align {align}: no case of this grid is causal or has a "
                        f"mask it places ({_aligned()}), so the alignment would change "
                        f"nothing; add --causal true (or both) or such a mask, or leave "
                        f"--causal-align out"
                    )
        return list(dict.fromkeys(out))

    def scoped(self, name: str, phase: str) -> Spec:
        """This spec with a model's shapes and a phase's mode and lengths laid over the
        preset's fields, and the explicit fields laid over both. The length flags go where
        they mean something: with decode and another phase in one run, --seq-len sets the
        prefill/train lengths (decode keeps its 1 and 4 new tokens) and --seq-len-kv the
        decode cache (prefill and train stay self-attention)."""
        fields: dict = {"tokens": None, "hidden": None}
        m = find_model(name) if name else None
        if m:
            fields.update(
                heads=[m.heads],
                kv_heads=[m.kv_heads],
                head_dim=[m.head_dim],
                causal=[m.causal],
                mask=list(m.masks),
                seq_len=list(m.lengths),
                seq_len_kv=[m.seq_kv] if m.seq_kv else None,
                score_mod=[m.score_mod],
            )
        if phase and phase not in PHASES:
            raise CaseError(f"unknown phase {phase!r} (allowed: {', '.join(PHASES)})")
        mixed = "decode" in (self.phase or []) and len(self.phase) > 1
        keep = set()  # phase fields that an explicit flag meant for another phase leaves alone
        if phase in ("prefill", "train"):
            fields["mode"] = ["fwd" if phase == "prefill" else "fwd_bwd"]
            keep |= {"seq_len_kv"} if mixed else set()
        elif phase == "decode":
            if m and not m.decoder:
                raise CaseError(
                    f"model {m.name} is an encoder: it has no decode phase (use --phase "
                    f"prefill or train)"
                )
            # without a model, decoding is self-attention over a cache: causal (each new token
            # sees the cache and the tokens before it); a model says what its decoder does
            causal = [m.causal] if m else [True]
            if not m and not mixed and "causal" in self.explicit and False in self.causal:
                raise CaseError(
                    "--phase decode is causal (each new token sees the cache and the tokens "
                    "before it): leave --causal out, or add another --phase for the "
                    "non-causal cases"
                )
            fields.update(
                mode=["fwd"],
                seq_len=list(DECODE_TOKENS),
                batch=list(DECODE_BATCH),
                causal=causal,
                causal_align=["bottom_right"],
            )
            if not (m and m.seq_kv):  # a cross-attention cache is the encoder's length
                fields["seq_len_kv"] = [s for s in DECODE_CACHE if not m or s <= m.context]
            keep |= ({"seq_len"} if mixed else set()) | (set() if m else {"causal"})
        if phase in ("prefill", "train") and not (m and m.seq_kv):
            fields["seq_len_kv"] = None  # self-attention
        for name_ in self.explicit - keep:
            fields.pop(name_, None)
        return replace(self, **fields)

    def _grid(self, model: str = "", phase: str = "") -> list[Case]:
        for mode in self.mode:
            if mode not in MODES:
                raise CaseError(f"unknown mode {mode!r} (allowed: {', '.join(MODES)})")
        for align in self.causal_align:
            if align not in ALIGNS:
                raise CaseError(f"unknown causal_align {align!r} (allowed: {', '.join(ALIGNS)})")
        out = []
        axes = {  # the grid's lists, the last varying fastest (seq_len fastest of all, below)
            "mode": self.mode,
            "dtype": [canonical_dtype(d) for d in self.dtype],
            "level": self.level,
            "mask": self._masks(),  # (mask, causal, its specs)
            "head_dim": self.head_dim,
            "batch": self.batch,
            "heads": self.heads,
            "score_mod": [self._score_mod(text) for text in self.score_mod],
        }
        for combo in itertools.product(*axes.values()):
            point = dict(zip(axes, combo), device=self.device, model=model, phase=phase)
            point["mask"], point["causal"], specs = point["mask"]
            if self.hidden:
                point["heads"] = self.hidden // point["head_dim"]
            # the alignment moves only a causal mask or a kind it places: others stay top-left
            aligned = point["causal"] or KINDS[point["mask"]].aligned
            aligns = self.causal_align if aligned else ["top_left"]
            kv_heads = self.kv_heads or [point["heads"]]
            for point["causal_align"], point["kv_heads"], s in itertools.product(
                aligns, kv_heads, self.seq_len
            ):
                point["seq_q"] = s
                point["batch"] = max(1, self.tokens // s) if self.tokens else point["batch"]
                for point["seq_kv"], point["pattern"] in itertools.product(
                    self.seq_len_kv or [s], specs
                ):
                    out.append(Case(**{name: point[name] for name in CASE_FIELDS}))
        if not out:
            raise CaseError("the grid is empty: every list needs at least one value")
        return list(dict.fromkeys(out))  # drop duplicates, keep order

    def _masks(self) -> list[tuple[str, bool, tuple[str | None, ...]]]:
        """(mask, causal, specs) combinations: a kind's specs from --mask KIND:SPEC, else
        those of its option that fit it (--docs, --window; --sparsity specs whose keys the
        kind has), else (None,): its default."""
        names = [_known_mask(text.partition(":")[0]) for text in self.mask]
        self._check_kind_options(names)
        self._check_causal(names)
        out = []
        for text in self.mask:
            mask, sep, spec = text.partition(":")
            kind = KINDS["none" if mask == "causal" else mask]
            if sep and not kind.takes_spec:
                raise CaseError(f"--mask {text}: mask {mask} takes no spec (give --mask {mask})")
            given = self._kind_option(kind.spec_flag) or []
            specs = [spec] if sep else [str(g) for g in given if fits_kind(g, mask)]
            if not specs and kind.takes_spec and kind.default_spec is None:
                raise CaseError(
                    f"mask {mask} needs its spec: give {kind.spec_flag} or --mask {mask}:SPEC"
                )
            causals = [True] if _causal_only(mask) else self.causal
            out += [(kind.name, c, tuple(specs) or (None,)) for c in causals]
        return list(dict.fromkeys(out))

    def _kind_option(self, flag: str) -> list | None:
        """The values of a kind's own option (its ``spec_flag``: --docs, --sparsity,
        --window), None for a kind without one."""
        name = flag.removeprefix("--")
        return getattr(self, name) if name in KIND_OPTIONS else None

    def _check_kind_options(self, names: list[str]) -> None:
        """An option of mask kinds (a kind's ``spec_flag``: --docs, --sparsity, --window) given
        with none of its kinds swept is refused, as is a --sparsity spec that fits none."""
        for name in KIND_OPTIONS:
            option = f"--{name}"
            takers = [k.name for k in KINDS.values() if k.spec_flag == option]
            if name in self.explicit and getattr(self, name) and not set(takers) & set(names):
                raise CaseError(
                    f"{option} needs --mask {' or '.join(takers)} (it sets nothing for mask "
                    f"{', '.join(names)}); add the mask or leave {option} out"
                )
        blocks = block_kinds()
        for spec in self.sparsity or []:
            if not [m for m in blocks if m in names and fits(spec, m)]:
                keys = "; ".join(f"{m}: {', '.join(d)}" for m, d in blocks.items())
                raise CaseError(f"--sparsity {spec!r} fits none of the masks swept ({keys})")

    def _check_causal(self, names: list[str]) -> None:
        """--causal false (or both) with only causal-only masks swept (causal, and the kinds
        that say ``needs_causal``) would have no non-causal case: refused, as decode is."""
        only = [name for name in names if _causal_only(name)]
        if "causal" in self.explicit and False in self.causal and only == names:
            raise CaseError(
                f"--mask {','.join(only)} is causal only: leave --causal out (or give "
                f"--causal true), or add another --mask for the non-causal cases"
            )

    @staticmethod
    def _score_mod(text: str) -> str:
        try:
            return canonical_mod(text)
        except ValueError as exc:
            name = text.partition(":")[0]
            hint = "" if name in MODS else unknown_hint(name, MODS)
            raise CaseError(f"--score-mod: {exc}{hint}") from None


def _known_mask(name: str) -> str:
    """A --mask name (a kind, or causal), else the one-line error with the closest."""
    allowed = ("causal", *KINDS)
    if name not in allowed:
        did = unknown_hint(name, allowed)
        raise CaseError(f"unknown mask {name!r}{did} (allowed: {', '.join(allowed)})")
    return name


def fits_kind(spec, mask: str) -> bool:
    """Whether a spec of a kind's option fits ``mask`` (a --sparsity spec: its keys)."""
    return mask not in block_kinds() or fits(str(spec), mask)


def _aligned() -> str:
    """The kinds the causal alignment places, by name."""
    return ", ".join(k.name for k in KINDS.values() if k.aligned)


def _causal_only(mask: str) -> bool:
    """Mask causal (none with causal true) and the kinds that declare ``needs_causal``."""
    return mask == "causal" or KINDS[mask].needs_causal
