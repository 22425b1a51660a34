"""Mask padding (key padding): batch row b has ``kv_lens[b]`` valid keys, keys j >= kv_lens[b]
are masked. The lengths are drawn from the seed (stream "padding"), uniform in [1, Skv] (never
0: a row with every key masked has no softmax), apart from q, k, v; the layout's reference
rule hides j >= kv_lens[b] on its own."""

from attnbench.masks.interval import IntervalKind
from attnbench.masks.kind import register_kind
from attnbench.seeds import generator


class Padding(IntervalKind):
    name = "padding"
    meaning = "per-batch valid key lengths"
    short = "pad"

    def limits(self, case, seed):
        import torch

        gen = generator("padding", seed)
        lens = torch.randint(1, case.seq_kv + 1, (case.batch,), generator=gen)
        return {"kv_lens": lens.to(case.device)}

    def from_draws(self, case, record):
        import torch

        lens = torch.tensor(record["key_lengths"], device=case.device)
        return self.interval(case, kv_lens=lens)


register_kind(Padding())
