"""What the block-sparse kinds (block_sparse, strided) share: a spec of ``key=value`` pairs
joined by ':' (``--sparsity``), and a layout of kept blocks, (nblocks, nblocks) booleans
(query block a, key block c, blocks of P = ``block`` positions), the same in every batch row,
combined with causal (j <= i) element by element. A kind says how its blocks are kept
(``BlockLayout.blocks``) and, apart from it, how the reference decides (``hidden``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnbench.masks.kind import KINDS, Layout, MaskKind

if TYPE_CHECKING:
    import torch


def block_kinds() -> dict[str, dict[str, int]]:
    """Each registered block kind's --sparsity keys and defaults."""
    return {k.name: k.defaults for k in KINDS.values() if isinstance(k, BlockKind)}


def parse_sparsity(text: str, kind: str | None = None) -> str:
    """The canonical form of a --sparsity spec ``key=value:key=value`` for mask ``kind``
    (defaults filled in), or, without a kind, the spec checked for syntax only."""
    kinds = block_kinds()
    allowed = kinds[kind] if kind else {k: 0 for d in kinds.values() for k in d}
    zero_ok = {k for d in kinds.values() for k in d if k in BlockKind.ZERO_OK}
    given = {}
    for item in filter(None, text.strip().replace(" ", "").split(":")):
        key, sep, value = item.partition("=")
        if not sep or key not in allowed:
            where = f"mask {kind}" if kind else "--sparsity"
            examples = " or ".join(
                ":".join(f"{k}={v}" for k, v in d.items()) for d in kinds.values()
            )
            raise ValueError(
                f"{item!r} is not a key=value of {where} (keys: {', '.join(allowed)}; e.g. "
                f"{examples})"
            )
        try:
            number = int(value)
        except ValueError:
            raise ValueError(f"{key}={value!r} is not an integer") from None
        if number < 0 or (number == 0 and key not in zero_ok):
            raise ValueError(f"{key}={number} must be an integer >= {0 if key in zero_ok else 1}")
        given[key] = number
    if kind is None:
        return ":".join(f"{k}={v}" for k, v in given.items())
    params = {**kinds[kind], **given}
    KINDS[kind].check_params(params)
    return ":".join(f"{k}={v}" for k, v in params.items())


def sparsity_params(spec: str) -> dict[str, int]:
    """A canonical --sparsity spec as a dict."""
    return {k: int(v) for k, v in (item.split("=") for item in spec.split(":"))}


def fits(spec: str, mask: str) -> bool:
    """Whether every key of a --sparsity spec is one of mask ``mask``'s."""
    keys = [item.split("=")[0] for item in spec.split(":") if item]
    return all(key in block_kinds()[mask] for key in keys)


class BlockLayout(Layout):
    """A layout of kept blocks of ``block`` positions."""

    def __init__(self, seq_len: int, batch: int, block: int):
        super().__init__(seq_len, batch)
        self.block = block

    @property
    def nblocks(self) -> int:
        return -(-self.seq_len // self.block)

    def blocks(self, a: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """Kept blocks for query block a (n, 1) and key block c (1, n)."""
        raise NotImplementedError

    def layout(self, device="cpu") -> torch.Tensor:
        """Kept blocks: (nblocks, nblocks) bool, query block a (rows), key block c (cols)."""

        def make():
            import torch

            a = torch.arange(self.nblocks)
            return self.blocks(a[:, None], a[None, :]).to(device)

        return self.cached(("layout", str(device)), make)

    def rule(self, b, i, j, causal):
        kept = self.layout(i.device)[i // self.block, j // self.block]
        return kept & (j <= i) if causal else kept

    def tile(self, q0, q1, k0, k1, causal) -> str:
        if causal and k0 > q1 - 1:
            return "empty"
        P = self.block
        sub = self.layout()[q0 // P : (q1 - 1) // P + 1][:, k0 // P : (k1 - 1) // P + 1]
        if not bool(sub.any()):
            return "empty"
        diag_cut = causal and k1 - 1 > q0  # the causal mask cuts into the tile
        return "full" if bool(sub.all()) and not diag_cut else "partial"

    def pairs(self, causal: bool) -> int:
        import torch

        sizes = torch.full((self.nblocks,), self.block)
        sizes[-1] = self.seq_len - self.block * (self.nblocks - 1)  # the last may be short
        area = sizes[:, None] * sizes[None, :]  # (nblocks, nblocks)
        if causal:  # blocks below the diagonal whole, on it a triangle, above it nothing
            a = torch.arange(self.nblocks)
            area = torch.where(a[:, None] > a[None, :], area, 0)
            area += torch.diag(sizes * (sizes + 1) // 2)
        return self.batch * int((area * self.layout()).sum())


class BlockKind(MaskKind):
    """A block-sparse kind: self-attention, its spec from --sparsity."""

    ZERO_OK = ("global", "random")  # keys that may be 0
    defaults: dict[str, int] = {}
    spec_flag = "--sparsity"
    self_only = True

    @property
    def default_spec(self) -> str:
        return ":".join(f"{k}={v}" for k, v in self.defaults.items())

    def canonical(self, spec):
        return parse_sparsity(spec or "", self.name)

    def check_params(self, params: dict[str, int]) -> None:
        """ValueError for a combination of keys the kind cannot have."""
