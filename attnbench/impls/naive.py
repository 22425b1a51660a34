"""The textbook formula: softmax(Q K^T · scale) V, materialising the full score matrix; eager,
and compiled with torch.compile (static shapes)."""

from attnbench.masks import ALIGNS, ANY
from attnbench.measure.compiling import compile_static
from attnbench.registry import register


def formula(q, k, v, keep, scale, keyless=None, mod=None, where=()):
    # q (B, Hq, Sq, D); k, v (B, Hkv, Skv, D); keep None or bool (Bm, 1, Sq, Skv), True = attend;
    # keyless None or bool (Bm, 1, Sq, 1): rows with no visible key (their keep is all True, so
    # the softmax stays finite), whose output is zero (docs/method.md), and so are their grads;
    # mod: a score modifier's scores(s, *where), where = (heads, positions, keys) index tensors
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = (q @ k.transpose(-2, -1)) * scale  # (B, Hq, Sq, Skv)
    if mod is not None:
        s = mod(s, *where)
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    out = s.softmax(dim=-1) @ v  # (B, Hq, Sq, D)
    return out if keyless is None else out.masked_fill(keyless, 0.0)


def _keep(q, k, causal, mask):
    """(keep, keyless) for ``formula``, made once per row (mask.cached): keyless is None when
    every query sees a key (bottom-right causal with Sq > Skv leaves the first rows without)."""
    if not mask.masked(causal):
        return None, None
    Sq, Skv = q.shape[-2], k.shape[-2]

    def make():
        keep = mask.keep(Sq, Skv, causal, q.device)  # (Bm, 1, Sq, Skv)
        keyless = ~keep.any(dim=-1, keepdim=True)  # (Bm, 1, Sq, 1)
        if not bool(keyless.any()):
            return keep, None
        return keep | keyless, keyless

    return mask.cached(("naive", Sq, Skv, causal, str(q.device)), make)


def modifier(q, k, mask):
    """(mod, where) for ``formula``: the score modifier's scores and its index tensors, the
    head (1, Hq, 1, 1), the query's position (Sq, 1) and the key (1, Skv); (None, ())."""
    if mask is None or mask.score_mod is None:
        return None, ()
    return mask.score_mod.scores, mask.positions(q.shape[1], q.shape[-2], k.shape[-2], q.device)


def dense_pairs(case, mask) -> int:
    """The whole (Sq, Skv) score matrix of every batch row: masking happens after QK^T."""
    return case.batch * case.seq_q * case.seq_kv


@register(
    "naive",
    color="#1f77b4",
    masks=ANY,
    score_mods=ANY,
    causal_align=ALIGNS,
    work=dense_pairs,
    description="softmax(QK^T*scale)V in eager PyTorch; materialises the (Sq, Skv) score matrix",
)
def naive(q, k, v, *, causal, scale, mask):
    keep, keyless = _keep(q, k, causal, mask)
    return formula(q, k, v, keep, scale, keyless, *modifier(q, k, mask))


_compiled = compile_static(formula)


@register(
    "naive_compiled",
    color="#aec7e8",
    masks=ANY,
    score_mods=ANY,
    causal_align=ALIGNS,
    compiled=True,
    work=dense_pairs,
    description="the naive formula through torch.compile (dynamic=False)",
)
def naive_compiled(q, k, v, *, causal, scale, mask):
    keep, keyless = _keep(q, k, causal, mask)
    return _compiled(q, k, v, keep, scale, keyless, *modifier(q, k, mask))
