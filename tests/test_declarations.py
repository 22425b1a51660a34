"""Declarations real libraries need, each through a plugin wrapping a small stand-in for such a
library's calling convention: a bottom-right-only causal alignment (FlashAttention >= 2.1,
x-transformers), a backward on some devices only (FlexAttention: CUDA), and an output layout
other than the input's (transformers' attention functions: (B, H, S, D) in, (B, S, H, D) out)."""

import textwrap

import pytest

from attnbench import plugins, registry
from attnbench.case import Case
from attnbench.testing import run_row

LIBRARY = '''
import torch
from attnbench.registry import register


def library_attention(q, k, v, *, scale, causal):
    """The stand-in library: q (B, H, Sq, D), k, v (B, Hkv, Skv, D) -> (B, H, Sq, D); causal
    aligned bottom-right (query i sees keys j <= i + Skv - Sq), as the libraries document."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        Sq, Skv = q.shape[-2], k.shape[-2]
        keep = torch.ones(Sq, Skv, dtype=torch.bool).tril(Skv - Sq)
        s = s.masked_fill(~keep, float("-inf"))
    return s.softmax(-1) @ v


class _CudaOnlyBackward(torch.autograd.Function):
    """A kernel whose backward exists on CUDA only (FlexAttention's case)."""

    @staticmethod
    def forward(ctx, out):
        return out.clone()

    @staticmethod
    def backward(ctx, grad):
        if grad.device.type != "cuda":
            raise NotImplementedError("no backward on this device")
        return grad
'''

PLUGINS = {  # impl -> its plugin file's registration
    "bottom_right_only": """
@register("bottom_right_only", causal_align=("bottom_right",))
def bottom_right_only(q, k, v, *, causal, scale, mask):
    return library_attention(q, k, v, scale=scale, causal=causal)
""",
    "flash_attn_func_style": """
@register("flash_attn_func_style", causal_align=("bottom_right",))
def flash_attn_func_style(q, k, v, *, causal, scale):  # causal alone: no mask= to take
    return library_attention(q, k, v, scale=scale, causal=causal)
""",
    "cuda_backward": """
@register("cuda_backward", backward=("cuda",))
def cuda_backward(q, k, v, *, causal, scale):
    return _CudaOnlyBackward.apply(library_attention(q, k, v, scale=scale, causal=False))
""",
    "returns_bshd": """
@register("returns_bshd", layout="bhsd", out_layout="bshd")
def returns_bshd(q, k, v, *, causal, scale):
    # as transformers' attention functions: (B, H, S, D) in, (B, S, H, D) out
    return library_attention(q, k, v, scale=scale, causal=False).transpose(1, 2).contiguous()
""",
}


@pytest.fixture
def plugin(tmp_path, registered):
    """``plugin[name]``: the impl registered by its own plugin file, loaded by discovery."""

    class Loaded(dict):
        def __missing__(self, name):
            path = tmp_path / f"{name}_plugin.py"
            path.write_text(textwrap.dedent(LIBRARY + PLUGINS[name]))
            return plugins.discover([str(path)], builtin=False, entry_points=False)[name]

    return Loaded()


def case(**kw) -> Case:
    base = dict(batch=1, heads=4, kv_heads=2, seq_q=8, seq_kv=8, head_dim=16, device="cpu")
    return Case(**{**base, **kw})


@pytest.mark.parametrize("name", ["bottom_right_only", "flash_attn_func_style"])
def test_a_bottom_right_only_impl_runs_where_the_alignments_coincide(plugin, name):
    impl = plugin[name]
    # mask= only where its signature takes it: a flash_attn_func-style function needs causal
    assert impl.causal_align == ("bottom_right",)
    assert impl.takes_mask is (name == "bottom_right_only")
    top_left = run_row(impl, case(seq_q=4, seq_kv=12, causal=True))
    assert top_left["status"] == "unsupported"
    assert top_left["reason"] == "causal_align=top_left (supported: bottom_right)"
    assert top_left["time_ms"] is None  # no number for a case that did not run
    for c in (
        case(seq_q=4, seq_kv=12, causal=True, causal_align="bottom_right"),
        case(causal=True),  # top-left: the same diagonal with equal lengths
        case(seq_q=4, seq_kv=12),  # not causal: no diagonal at all
        case(seq_q=4, seq_kv=12, mode="fwd_bwd", causal=True, causal_align="bottom_right"),
    ):
        r = run_row(impl, c)
        assert r["status"] == "ok" and r["agrees"] is True, (c.label(), r["reason"])


def test_a_top_left_only_impl_runs_bottom_right_cases_of_equal_lengths(plugin):
    plain = registry.Impl(name="plain", fn=None)
    assert plain.reasons(case(causal=True, causal_align="bottom_right")) == []
    cross = case(seq_q=4, seq_kv=12, causal=True, causal_align="bottom_right")
    assert plain.reasons(cross) == ["causal_align=bottom_right (supported: top_left)"]


def test_a_backward_on_cuda_only_is_unsupported_on_the_cpu_with_its_reason(plugin):
    impl = plugin["cuda_backward"]
    assert impl.backward == ("cuda",)
    assert impl.backward_on("cuda") and not impl.backward_on("cpu")
    r = run_row(impl, case(mode="fwd_bwd"))
    assert r["status"] == "unsupported", r["reason"]
    assert r["reason"] == "mode=fwd_bwd on cpu (supported: fwd; backward on cuda only)"
    assert impl.reasons(case(device="cuda", mode="bwd")) == []
    fwd = run_row(impl, case(seq_q=4, seq_kv=12))
    assert fwd["status"] == "ok" and fwd["agrees"] is True, fwd["reason"]


def test_backward_takes_true_false_or_devices(monkeypatch):
    monkeypatch.setattr(registry, "_IMPLS", dict(registry._IMPLS))
    for name, given, kept in (
        ("bwd_all", ("cpu", "cuda"), True),
        ("bwd_none", False, False),
        ("bwd_cuda", "cuda", ("cuda",)),
    ):
        registry.register(name, backward=given)(lambda q, k, v, **kw: q)
        assert registry._IMPLS[name].backward == kept
    with pytest.raises(registry.RegistryError, match="backward"):
        registry.register("bwd_bad", backward=("tpu",))(lambda q, k, v, **kw: q)
    with pytest.raises(registry.RegistryError, match="causal_align"):
        registry.register("no_align", causal_align=())(lambda q, k, v, **kw: q)


@pytest.mark.parametrize(
    "c",
    [
        case(seq_q=4, seq_kv=12, mode="fwd_bwd"),
        case(heads=4, kv_heads=4, seq_q=8, seq_kv=8, level="layer", mode="fwd_bwd"),
    ],
    ids=["op", "layer"],
)
def test_an_output_layout_of_its_own_is_converted_by_the_harness(plugin, c):
    impl = plugin["returns_bshd"]
    assert (impl.layout, impl.output_layout) == ("bhsd", "bshd")
    r = run_row(impl, c)
    assert r["status"] == "ok" and r["agrees"] is True, r["reason"]
    # the same function declared with one layout returns the wrong shape: caught
    wrong = registry.Impl(name="same_layout", fn=impl.fn)
    bad = run_row(wrong, case(heads=4, kv_heads=2, seq_q=5, seq_kv=12))
    assert bad["status"] == "error" and "shape" in bad["reason"]


def test_masks_or_modifiers_for_a_function_without_mask_are_refused_when_registered(monkeypatch):
    monkeypatch.setattr(registry, "_IMPLS", dict(registry._IMPLS))

    def fixed(q, k, v, *, causal, scale):
        return q

    for given, said in (
        ({"masks": ("padding",)}, "masks=('padding',)"),
        ({"score_mods": ("softcap",)}, "score_mods=('softcap',)"),
        ({"causal_align": ("bottom_right", "top_left")}, "causal_align=('top_left', "),
    ):
        with pytest.raises(registry.RegistryError) as exc:
            registry.register("fixed", **given)(fixed)
        assert str(exc.value).startswith(f"impl 'fixed': {said}")
        assert str(exc.value).endswith(
            "reach it only as mask=, which fixed(q, k, v, *, causal, scale) does not take; add "
            "mask to its keyword arguments (q, k, v, *, causal, scale, mask)"
        )
    assert "fixed" not in registry._IMPLS
    registry.register("any_kw", masks=("padding",))(lambda q, k, v, **kw: q)  # **kwargs takes it
    assert registry._IMPLS["any_kw"].takes_mask


@pytest.mark.parametrize("mode", ["fwd_bwd", "bwd"])
def test_an_impl_that_checkpoints_with_use_reentrant_runs_its_backward_rows(mode):
    """Reentrant checkpointing (memory-efficient-attention-pytorch's chunked path) refuses
    torch.autograd.grad; a user's .backward() works, and so does the row."""
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    def chunked(q, k, v, *, causal, scale):
        attend = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                 scale=scale)  # fmt: skip
        return checkpoint(attend, q, k, v, use_reentrant=True)

    impl = registry.Impl(name="reentrant", fn=chunked, gqa=False)
    r = run_row(impl, case(heads=2, kv_heads=2, seq_q=16, seq_kv=16, causal=True, mode=mode))
    assert r["status"] == "ok" and r["agrees"] is True, r["reason"]
