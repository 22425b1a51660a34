"""Packed documents and sparse patterns: the masks that are not one formula of (i, j).

Three masks, all for self-attention (seq_q == seq_kv == S), each combined with ``causal``
(j <= i) element by element:

    document      several documents packed into one sequence; query i keeps the keys of its
                  own document. Document lengths come from ``--docs``: ``fixed:512``,
                  ``uniform:64-2048`` (drawn from the seed) or ``300+200+512`` (cycled);
                  a sequence is filled document by document, the last one cut to fit.
    block_sparse  BigBird: keys and queries in blocks of ``block``; query block a keeps key
                  block c if |a - c| <= (local - 1) / 2 (a window of ``local`` blocks), if a or
                  c is one of the first ``global`` blocks (global tokens: they see and are
                  seen by every block), or if c is one of the ``random`` blocks drawn for a
                  (from the seed, among the blocks not kept otherwise).
    strided       Sparse Transformer's strided pattern, by blocks: query block a keeps key
                  block c if |a - c| < stride (the local band) or (a - c) % stride == 0 (every
                  stride-th block).

The case carries the mask's spec as text (``Case.pattern``, canonical form); the seeded draw
(document lengths, random blocks) is a ``Pattern``, made once per case like padding's key
lengths. Impls use ``Pattern.keep`` (dense or per tile), ``Pattern.tile`` (which tiles are
empty, full or partial) and ``Pattern.pairs``; the float64 reference (measure/reference.py)
writes the rules out element by element on its own, from the same drawn data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from attnbench.seeds import generator

PATTERN_MASKS = ("document", "block_sparse", "strided")
DEFAULT_DOCS = "uniform:64-512"
SPARSITY_DEFAULTS = {
    "block_sparse": {"block": 64, "local": 3, "global": 1, "random": 2},
    "strided": {"block": 64, "stride": 4},
}
SPARSITY_KEYS = tuple(dict.fromkeys(k for d in SPARSITY_DEFAULTS.values() for k in d))
ZERO_OK = ("global", "random")  # keys that may be 0


def parse_docs(text: str) -> str:
    """The canonical form of a --docs spec; ValueError naming the fix."""
    text = text.strip().replace(" ", "")
    kind, sep, rest = text.partition(":")
    try:
        if sep and kind == "fixed":
            length = int(rest)
            if length > 0:
                return f"fixed:{length}"
        elif sep and kind == "uniform":
            low, high = (int(x) for x in rest.split("-"))
            if 0 < low <= high:
                return f"uniform:{low}-{high}"
        elif not sep:
            lengths = [int(x) for x in text.split("+")]
            if all(n > 0 for n in lengths):
                return "+".join(map(str, lengths))
    except ValueError:
        pass
    raise ValueError(
        f"{text!r} is not a documents spec (give fixed:LEN, uniform:MIN-MAX or "
        f"LEN+LEN+..., lengths positive, MIN <= MAX)"
    )


def parse_sparsity(text: str, kind: str | None = None) -> str:
    """The canonical form of a --sparsity spec ``key=value:key=value`` for mask ``kind``
    (defaults filled in), or, without a kind, the spec checked for syntax only."""
    given = {}
    for item in filter(None, text.strip().replace(" ", "").split(":")):
        key, sep, value = item.partition("=")
        allowed = SPARSITY_DEFAULTS[kind] if kind else SPARSITY_KEYS
        if not sep or key not in allowed:
            where = f"mask {kind}" if kind else "--sparsity"
            raise ValueError(
                f"{item!r} is not a key=value of {where} (keys: {', '.join(allowed)}; e.g. "
                f"block=64:local=3:global=1:random=2 or block=64:stride=4)"
            )
        try:
            number = int(value)
        except ValueError:
            raise ValueError(f"{key}={value!r} is not an integer") from None
        if number < 0 or (number == 0 and key not in ZERO_OK):
            low = 0 if key in ZERO_OK else 1
            raise ValueError(f"{key}={number} must be an integer >= {low}")
        given[key] = number
    if kind is None:
        return ":".join(f"{k}={v}" for k, v in given.items())
    params = {**SPARSITY_DEFAULTS[kind], **given}
    if kind == "block_sparse" and params["local"] % 2 == 0:
        raise ValueError(
            f"local={params['local']} must be odd (a window of blocks centred on the query's)"
        )
    return ":".join(f"{k}={v}" for k, v in params.items())


def sparsity_params(spec: str) -> dict[str, int]:
    """A canonical --sparsity spec as a dict."""
    return {k: int(v) for k, v in (item.split("=") for item in spec.split(":"))}


def canonical(mask: str, spec: str | None) -> str:
    """The canonical pattern spec of a case with mask ``mask`` (defaults when ``spec`` is
    None); ValueError for a bad one."""
    if mask == "document":
        return parse_docs(DEFAULT_DOCS if spec is None else spec)
    return parse_sparsity(spec or "", mask)


def doc_lengths(spec: str, seq_len: int, gen: torch.Generator) -> list[int]:
    """Lengths of the documents packed into one sequence of ``seq_len`` (sum == seq_len)."""
    kind, _, rest = spec.partition(":")
    if kind == "uniform":
        low, high = (int(x) for x in rest.split("-"))
    elif kind == "fixed":
        cycle = [int(rest)]
    else:
        cycle = [int(x) for x in spec.split("+")]
    out, filled = [], 0
    while filled < seq_len:
        if kind == "uniform":
            n = int(torch.randint(low, high + 1, (1,), generator=gen))
        else:
            n = cycle[len(out) % len(cycle)]
        out.append(min(n, seq_len - filled))
        filled += out[-1]
    return out


def random_blocks(nblocks: int, local: int, n_global: int, n_random: int, seed: int):
    """Per query block, ``n_random`` key blocks drawn among those neither in its window nor
    global (fewer when fewer are left): (nblocks, n_random) int64, -1 where none."""
    gen = generator("sparse", seed)
    out = torch.full((nblocks, n_random), -1, dtype=torch.int64)
    half = (local - 1) // 2
    for a in range(nblocks):
        free = [c for c in range(n_global, nblocks) if abs(a - c) > half]
        if a < n_global or not free or not n_random:
            continue  # a global block already sees every block
        pick = torch.randperm(len(free), generator=gen)[:n_random]
        out[a, : len(pick)] = torch.tensor(free)[pick]
    return out


@dataclass(eq=False)
class Pattern:
    """The drawn data of a pattern mask for one case (S = seq_len, P = block)."""

    kind: str
    seq_len: int
    batch: int = 1  # B (the sparse layouts are the same in every batch row)
    doc_lens: list[list[int]] | None = None  # document: per batch row, summing to S
    block: int | None = None  # block_sparse, strided: P
    local: int = 1  # block_sparse: window width in blocks (odd)
    n_global: int = 0  # block_sparse: the first blocks are global
    random: torch.Tensor | None = None  # block_sparse: (nblocks, r) drawn key blocks, -1 none
    stride: int | None = None  # strided
    _cache: dict = field(default_factory=dict, repr=False)

    @classmethod
    def make(cls, mask: str, spec: str, batch: int, seq_len: int, seed: int) -> Pattern:
        """The pattern of a case, its data drawn from ``seed`` (streams "documents" and
        "sparse", seeds.py)."""
        if mask == "document":
            gen = generator("documents", seed)
            lens = [doc_lengths(spec, seq_len, gen) for _ in range(batch)]
            return cls.from_draws(mask, spec, batch, seq_len, doc_lens=lens)
        random = None
        if mask == "block_sparse":
            p = sparsity_params(spec)
            nblocks = -(-seq_len // p["block"])
            n_global = min(p["global"], nblocks)
            random = random_blocks(nblocks, p["local"], n_global, p["random"], seed)
        return cls.from_draws(mask, spec, batch, seq_len, random=random)

    @classmethod
    def from_draws(
        cls,
        mask: str,
        spec: str,
        batch: int,
        seq_len: int,
        doc_lens: list[list[int]] | None = None,
        random: torch.Tensor | None = None,
    ) -> Pattern:
        """The pattern from its spec and its drawn data (``make``'s, or a run's draws file):
        the document lengths of mask document, the random blocks of block_sparse."""
        if mask == "document":
            return cls(mask, seq_len, batch, doc_lens=doc_lens)
        p = sparsity_params(spec)
        if mask == "strided":
            return cls(mask, seq_len, batch, block=p["block"], stride=p["stride"])
        return cls(
            mask,
            seq_len,
            batch,
            block=p["block"],
            local=p["local"],
            n_global=min(p["global"], -(-seq_len // p["block"])),
            random=torch.as_tensor(random, dtype=torch.int64),
        )

    @property
    def nblocks(self) -> int:
        return -(-self.seq_len // self.block)

    # -- documents: one interval of keys per query, per batch row ------------------------
    def doc_bounds(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Start and end of each position's document: (B, S) int64 each, on the CPU."""

        def make():
            starts, ends = [], []
            for lens in self.doc_lens:
                n = torch.tensor(lens)
                end = n.cumsum(0)
                starts.append((end - n).repeat_interleave(n))
                ends.append(end.repeat_interleave(n))
            return torch.stack(starts), torch.stack(ends)

        return self._cached(("bounds",), make)

    def doc_ids(self, device) -> torch.Tensor:
        """Index of each position's document in its row: (B, S) int64."""

        def make():
            ids = [torch.arange(len(n)).repeat_interleave(torch.tensor(n)) for n in self.doc_lens]
            return torch.stack(ids).to(device)

        return self._cached(("ids", str(device)), make)

    def cu_seqlens(self, device) -> torch.Tensor:
        """Offsets of every document in the flattened (B * S) sequence: (ndocs + 1,) int32."""
        flat = torch.tensor([0, *(n for lens in self.doc_lens for n in lens)])
        return flat.cumsum(0).to(device=device, dtype=torch.int32)

    # -- sparse: a (nblocks, nblocks) boolean layout of blocks ---------------------------
    def layout(self, device="cpu") -> torch.Tensor:
        """Kept blocks: (nblocks, nblocks) bool, query block a (rows), key block c (cols)."""

        def make():
            a = torch.arange(self.nblocks)[:, None]
            c = torch.arange(self.nblocks)[None, :]
            if self.kind == "strided":
                keep = ((a - c).abs() < self.stride) | ((a - c) % self.stride == 0)
            else:
                keep = ((a - c).abs() <= (self.local - 1) // 2) | (a < self.n_global)
                keep |= c < self.n_global
                rows, picks = torch.nonzero(self.random >= 0, as_tuple=True)
                keep[rows, self.random[rows, picks]] = True
            return keep.to(device)

        return self._cached(("layout", str(device)), make)

    # -- what impls use ------------------------------------------------------------------
    def keep(self, q0: int, q1: int, k0: int, k1: int, causal: bool, device) -> torch.Tensor:
        """True = attend, for queries q0..q1-1 and keys k0..k1-1: (Bm, bq, bk), Bm = B for
        documents, 1 for sparse patterns."""
        i = torch.arange(q0, q1, device=device)[:, None]  # (bq, 1)
        j = torch.arange(k0, k1, device=device)[None, :]  # (1, bk)
        if self.kind == "document":
            ids = self.doc_ids(device)
            keep = ids[:, q0:q1, None] == ids[:, None, k0:k1]  # (B, bq, bk)
        else:
            keep = self.layout(device)[i // self.block, j // self.block][None]  # (1, bq, bk)
        return keep & (j <= i) if causal else keep

    def dense(self, causal: bool, device) -> torch.Tensor:
        """The whole mask, True = attend: (Bm, 1, S, S), cached."""
        S = self.seq_len
        return self._cached(
            ("dense", causal, str(device)), lambda: self.keep(0, S, 0, S, causal, device)[:, None]
        )

    def tile(self, q0: int, q1: int, k0: int, k1: int, causal: bool) -> str:
        """Whether the tile (queries q0..q1-1, keys k0..k1-1) is 'empty', 'full' (every
        pair kept, in every batch row) or 'partial'."""
        if causal and k0 > q1 - 1:
            return "empty"
        diag_cut = causal and k1 - 1 > q0  # the causal mask cuts into the tile
        if self.kind == "document":
            start, end = self.doc_bounds()
            start, end = start[:, q0:q1], end[:, q0:q1]  # (B, bq)
            lo, hi = start.clamp(min=k0), end.clamp(max=k1)
            if not bool((lo < hi).any()):
                return "empty"
            full = bool((start <= k0).all() and (end >= k1).all())
        else:
            sub = self.layout()[q0 // self.block : (q1 - 1) // self.block + 1][
                :, k0 // self.block : (k1 - 1) // self.block + 1
            ]
            if not bool(sub.any()):
                return "empty"
            full = bool(sub.all())
        return "full" if full and not diag_cut else "partial"

    def pairs(self, causal: bool) -> int:
        """Kept (query, key) pairs per head, summed over the batch, exactly."""
        if self.kind == "document":
            lens = torch.tensor([n for row in self.doc_lens for n in row])
            return int((lens * (lens + 1) // 2).sum() if causal else (lens * lens).sum())
        sizes = torch.full((self.nblocks,), self.block)
        sizes[-1] = self.seq_len - self.block * (self.nblocks - 1)  # the last may be short
        area = sizes[:, None] * sizes[None, :]  # (nblocks, nblocks)
        if causal:  # blocks below the diagonal whole, on it a triangle, above it nothing
            a = torch.arange(self.nblocks)
            area = torch.where(a[:, None] > a[None, :], area, 0)
            area += torch.diag(sizes * (sizes + 1) // 2)
        return self.batch * int((area * self.layout()).sum())

    def _cached(self, key, make):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]
