"""Mask document: several documents packed into one sequence (self-attention, Sq = Skv = S);
query i keeps the keys of its own document, and with causal j <= i. Document lengths come
from ``--docs``: ``fixed:512``, ``uniform:64-2048`` (drawn from the seed, stream "documents")
or ``300+200+512`` (cycled); a sequence is filled document by document, the last one cut to
fit. Impls read ``doc_lens``, ``doc_ids``, ``doc_bounds`` or ``cu_seqlens``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnbench.masks.kind import Layout, MaskKind, register_kind
from attnbench.seeds import generator

if TYPE_CHECKING:
    import torch

DEFAULT_DOCS = "uniform:64-512"


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


def doc_lengths(spec: str, seq_len: int, gen: torch.Generator) -> list[int]:
    """Lengths of the documents packed into one sequence of ``seq_len`` (sum == seq_len)."""
    import torch

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


class Documents(Layout):
    """The drawn documents of one case: ``doc_lens[b]`` sums to S."""

    kind = "document"

    def __init__(self, seq_len: int, batch: int, doc_lens: list[list[int]]):
        super().__init__(seq_len, batch)
        self.doc_lens = doc_lens

    @property
    def rows(self) -> int:
        return self.batch

    def draws(self) -> dict:
        return {"doc_lens": self.doc_lens}

    def doc_bounds(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Start and end of each position's document: (B, S) int64 each, on the CPU."""

        def make():
            import torch

            starts, ends = [], []
            for lens in self.doc_lens:
                n = torch.tensor(lens)
                end = n.cumsum(0)
                starts.append((end - n).repeat_interleave(n))
                ends.append(end.repeat_interleave(n))
            return torch.stack(starts), torch.stack(ends)

        return self.cached(("bounds",), make)

    def doc_ids(self, device) -> torch.Tensor:
        """Index of each position's document in its row: (B, S) int64."""

        def make():
            import torch

            ids = [torch.arange(len(n)).repeat_interleave(torch.tensor(n)) for n in self.doc_lens]
            return torch.stack(ids).to(device)

        return self.cached(("ids", str(device)), make)

    def cu_seqlens(self, device) -> torch.Tensor:
        """Offsets of every document in the flattened (B * S) sequence: (ndocs + 1,) int32."""
        import torch

        flat = torch.tensor([0, *(n for lens in self.doc_lens for n in lens)])
        return flat.cumsum(0).to(device=device, dtype=torch.int32)

    def rule(self, b, i, j, causal):
        ids = self.doc_ids(i.device)
        same = ids[b, i] == ids[b, j]
        return same & (j <= i) if causal else same

    def hidden(self, i, j, causal):
        import torch

        # every position's document, laid end to end from the lengths: (B, S)
        rows = []
        for lens in self.doc_lens:
            doc = torch.empty(sum(lens), dtype=torch.int64)
            start = 0
            for number, length in enumerate(lens):
                doc[start : start + length] = number
                start += length
            rows.append(doc)
        doc = torch.stack(rows).to(i.device)
        out = doc[:, i] != doc[:, j]  # (B, c, Skv)
        return out | (j > i) if causal else out

    def tile(self, q0, q1, k0, k1, causal) -> str:
        if causal and k0 > q1 - 1:
            return "empty"
        start, end = self.doc_bounds()
        start, end = start[:, q0:q1], end[:, q0:q1]  # (B, bq)
        lo, hi = start.clamp(min=k0), end.clamp(max=k1)
        if not bool((lo < hi).any()):
            return "empty"
        full = bool((start <= k0).all() and (end >= k1).all())
        diag_cut = causal and k1 - 1 > q0  # the causal mask cuts into the tile
        return "full" if full and not diag_cut else "partial"

    def pairs(self, causal: bool) -> int:
        import torch

        lens = torch.tensor([n for row in self.doc_lens for n in row])
        return int((lens * (lens + 1) // 2).sum() if causal else (lens * lens).sum())


class Document(MaskKind):
    name = "document"
    meaning = "packed documents (--docs)"
    short = "doc"
    default_spec = DEFAULT_DOCS
    spec_flag = "--docs"
    self_only = True

    def canonical(self, spec):
        return parse_docs(DEFAULT_DOCS if spec is None else spec)

    def layout(self, case, seed):
        gen = generator("documents", seed)
        lens = [doc_lengths(case.pattern, case.seq_q, gen) for _ in range(case.batch)]
        return Documents(case.seq_q, case.batch, lens)

    def from_draws(self, case, record):
        return Documents(case.seq_q, case.batch, record["doc_lens"])


register_kind(Document())
