"""Level layer with the parts models ship: PyTorch's nn.MultiheadAttention (fused qkv weight,
biases; docs/plugins.md's example) hosted as it is, transformers' Qwen2 (biases), Qwen3 and
Gemma-3 (RMSNorm on each head of q and k), OLMo-2 (RMSNorm on the whole projections) and GPT-2
(a fused, transposed Conv1D weight) agree with the float64 layer reference; a dropped bias or a
skipped norm disagrees; x-transformers' GQA head order (query head h reads kv head h % Hkv)
agrees once declared and is named when it is not, at level op and layer."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from attnbench import plugins, registry
from attnbench.case import Case
from attnbench.module_layout import LayerModule, ModuleLayout, QKNorm
from attnbench.run.measuring.call import Call
from attnbench.run.measuring.inputs import layer_parts, make_inputs
from attnbench.run.measuring.layer import EXTRAS, UNCHECKED, Parts, layer_reference
from attnbench.testing import run_row

NORMS = ModuleLayout(q_norm=QKNorm("q_norm"), k_norm=QKNorm("k_norm"))
HEAD_MOD = "out matches kv head h % Hkv for query head h (head_order='interleaved')"


def case(**kw) -> Case:
    base = dict(batch=2, heads=4, kv_heads=2, seq_q=12, seq_kv=12, head_dim=8, level="layer")
    return Case(**{**base, "causal": True, "mode": "fwd_bwd", **kw})


@pytest.fixture
def register(monkeypatch):
    """Registers ``fn`` under a test name with ``kw``; no impl is left behind."""
    monkeypatch.setattr(registry, "_IMPLS", dict(registry._IMPLS))

    def make(name, fn, **kw):
        registry.register(name, **kw)(fn)
        return registry._IMPLS[name]

    return make


def expand(t: torch.Tensor, group: int, order: str) -> torch.Tensor:
    """kv (B, Hkv, S, D) -> (B, Hq, S, D): query head h reads kv head h // group (grouped) or
    h % Hkv (interleaved, x-transformers)."""
    return t.repeat(1, group, 1, 1) if order == "interleaved" else t.repeat_interleave(group, 1)


class Block(torch.nn.Module):
    """A model's attention module: biases, an RMSNorm (torch.nn.RMSNorm; ``layer_norm``: a
    LayerNorm, with a bias) over each head of q and of k, GQA in ``order``; ``bug`` plants one
    mistake."""

    def __init__(
        self, c: Case, norm: bool = True, order: str = "grouped", bug: str = "", layer_norm=False
    ):
        super().__init__()
        dm, dkv, D = c.d_model, c.kv_heads * c.head_dim, c.head_dim
        self.group, self.D, self.causal = c.heads // c.kv_heads, D, c.causal
        self.order, self.bug = order, bug
        self.q_proj, self.o_proj = torch.nn.Linear(dm, dm), torch.nn.Linear(dm, dm)
        self.k_proj, self.v_proj = torch.nn.Linear(dm, dkv), torch.nn.Linear(dm, dkv)
        kind = torch.nn.LayerNorm if layer_norm else torch.nn.RMSNorm
        self.q_norm = kind(D, eps=1e-6) if norm else None
        self.k_norm = kind(D, eps=1e-6) if norm else None

    def forward(self, x):  # (B, S, d_model) -> (B, S, d_model)
        B, S, _ = x.shape
        q = F.linear(x, self.q_proj.weight) if self.bug == "drop_q_bias" else self.q_proj(x)
        q, k, v = (t.view(B, S, -1, self.D) for t in (q, self.k_proj(x), self.v_proj(x)))
        if self.q_norm is not None:
            q = q if self.bug == "skip_q_norm" else self.q_norm(q)
            k = self.k_norm(k)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, S, D)
        k, v = (expand(t, self.group, self.order) for t in (k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.o_proj(out.transpose(1, 2).reshape(B, S, -1))


def blocks(**kw):
    def factory(c: Case, mask) -> LayerModule:
        module = Block(c, **kw).to(device=c.device, dtype=c.torch_dtype)
        layout = NORMS if kw.get("norm", True) else ModuleLayout()
        return LayerModule.of(module, module, layout)

    return factory


def test_the_layer_reference_with_its_parts_is_the_layer_written_out():
    """Biases on all four projections, an RMSNorm over each head of q, a LayerNorm over the
    whole k projection, x-transformers' head order: against autograd of the same layer
    written with torch's own functions, in float64."""
    c = case()
    inputs, drawn = make_inputs(c, 3), layer_parts(c, 3)
    extras = {n: drawn[n] for n in ("bq", "bk", "bv", "bo", "k_norm_w", "k_norm_b")}
    extras["q_norm_w"] = drawn["q_norm_w"][: c.head_dim]
    rms = QKNorm("q_norm", kind="rms", eps=1e-5)
    layer = QKNorm("k_norm", kind="layer", scope="projection", eps=1e-5)
    out, grads = layer_reference(
        inputs.x, inputs.weights, heads=4, kv_heads=2, causal=True, scale=inputs.scale,
        dout=inputs.dout, parts=Parts(extras, rms, layer, "interleaved"),
    )  # fmt: skip
    x, wq, wk, wv, wo = (t.double().requires_grad_() for t in (inputs.x, *inputs.weights))
    e = {n: t.double().requires_grad_() for n, t in extras.items()}
    q = F.rms_norm(F.linear(x, wq, e["bq"]).unflatten(-1, (4, 8)), (8,), e["q_norm_w"], 1e-5)
    q = q.flatten(-2)  # (B, S, Hq·D), each head normalised
    k = F.layer_norm(F.linear(x, wk, e["bk"]), (16,), e["k_norm_w"], e["k_norm_b"], 1e-5)
    v = F.linear(x, wv, e["bv"])
    q, k, v = (t.unflatten(-1, (-1, 8)).transpose(1, 2) for t in (q, k, v))  # (B, H, S, D)
    k, v = (expand(t, 2, "interleaved") for t in (k, v))
    attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    want = F.linear(attn.transpose(1, 2).flatten(2), wo, e["bo"])
    checked = [e[n] for n in EXTRAS if n in e and n not in UNCHECKED]
    want_grads = torch.autograd.grad(want, (x, wq, wk, wv, wo, *checked), inputs.dout.double())
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    assert len(grads) == 5 + 6  # dbq, dbv, dbo, dq_norm_w, dk_norm_w, dk_norm_b (no dbk)
    for got, exp in zip(grads, want_grads):
        torch.testing.assert_close(got, exp, rtol=1e-10, atol=1e-10)


@pytest.fixture
def torch_mha(register, tmp_path):
    """docs/plugins.md's nn.MultiheadAttention example, registered as a plugin file."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "plugins.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    path = tmp_path / "torch_mha.py"
    path.write_text(next(b for b in blocks if "@register(" in b and "MultiheadAttention(" in b))
    plugins._load_file(path)
    return registry._IMPLS["torch_mha"]


@pytest.mark.parametrize(
    "c, path",
    [
        (case(kv_heads=4, mode="fwd"), "fast path (aten::_native_multi_head_attention)"),
        (case(kv_heads=4, mode="fwd", dtype="bfloat16", causal=False), "fast path"),
        (case(kv_heads=4), "Python path"),  # with grad: the fast path does not apply
    ],
    ids=["fwd", "fwd-bf16", "fwd_bwd"],
)
def test_pytorch_multihead_attention_runs_as_it_is_and_agrees(torch_mha, c, path):
    r = run_row(torch_mha, c)
    assert r["status"] == "ok" and r["agrees"] is True, r["reason"]
    assert f"nn.MultiheadAttention ran its {path}" in r["reason"]
    inputs = make_inputs(c, 0)
    call = Call.prepare(torch_mha, c, inputs)
    module = call.hosted.module
    assert [n for n, _ in module.named_parameters()] == [
        "in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"
    ]  # fmt: skip
    assert call.leaves[1] is module.in_proj_weight  # its own fused weight, the leaf timed
    for got, seeded in zip(module.in_proj_weight.split(c.d_model), inputs.weights[:3]):
        assert torch.equal(got, seeded)
    assert module.in_proj_bias.abs().min() > 0  # drawn, so that a dropped bias would show


def test_a_fused_weight_of_the_wrong_size_is_an_error_never_a_number(torch_mha):
    gqa = registry.Impl(name="torch_mha_gqa", fn=torch_mha.fn, module=True)
    r = run_row(gqa, case())  # Hkv 2: no nn.MultiheadAttention has that
    assert r["status"] == "error" and r["time_ms"] is None and r["agrees"] is None
    assert "the fused qkv weight has 96 out_features, expected 64 = Hq·D + 2·Hkv·D" in r["reason"]


@pytest.mark.parametrize(
    "c",
    [case(), case(mode="fwd", dtype="bfloat16", causal=False)],
    ids=Case.label,
)
def test_a_module_with_biases_and_qk_norms_agrees(register, c):
    r = run_row(register("block", blocks(), module=True), c)
    assert r["status"] == "ok" and r["agrees"] is True, r["reason"]


def test_a_module_whose_qk_norms_have_biases_agrees(register):
    """LayerNorms over each head of q and k: their weights and biases are seeded and hosted
    like every other part, so the module and the reference share them."""
    r = run_row(register("block_ln", blocks(layer_norm=True), module=True), case())
    assert r["status"] == "ok" and r["agrees"] is True, r["reason"]


@pytest.mark.parametrize(
    "bug, dtype",
    [("drop_q_bias", "float32"), ("skip_q_norm", "float32"), ("drop_q_bias", "bfloat16")],
)
def test_a_dropped_bias_or_a_skipped_norm_disagrees(register, bug, dtype):
    r = run_row(
        register(f"block_{bug}", blocks(bug=bug), module=True), case(dtype=dtype, mode="fwd")
    )
    assert r["status"] == "ok" and r["agrees"] is False, r["reason"]
    assert (
        f"disagrees with the float64 reference (level layer: over 2x the error of the textbook "
        f"layer in {dtype}): out rel"
    ) in r["reason"]


def test_a_norm_of_another_scope_than_declared_is_an_error(register):
    wrong = ModuleLayout(q_norm=QKNorm("q_norm", scope="projection"), k_norm=QKNorm("k_norm"))

    def factory(c, mask):
        return LayerModule.of(blocks()(c, mask).module, lambda x: x, wrong)

    r = run_row(register("block_scope", factory, module=True), case())
    assert r["status"] == "error" and r["time_ms"] is None
    assert "q_norm.weight is (8,) torch.float32 on cpu, expected (32,)" in r["reason"]
    assert (
        r["reason"].endswith(
            "(the module's norm is over 8 features: declare QKNorm(.., scope='head'), over "
            "head_dim, each head alike)"
        )
        and "dtype" not in r["reason"].split("expected")[1]
    )


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "olmo2", "gemma3"])
def test_transformers_modules_with_biases_and_qk_norms_agree(register, family):
    pytest.importorskip("transformers", reason="transformers is not installed (pip install .[hf])")
    from attnbench.impls.hf_llama import HF_MASKS, hf_attention

    impl = register(
        f"hf_{family}",
        lambda c, m: hf_attention(family, "sdpa", c, m),
        module=True,
        masks=HF_MASKS,
    )
    cases = (
        [case(), case(mode="fwd", dtype="bfloat16")] if family in ("qwen2", "qwen3") else [case()]
    )
    for c in cases:
        r = run_row(impl, c)
        assert r["status"] == "ok" and r["agrees"] is True, (c.label(), r["reason"])


@pytest.mark.parametrize("transposed", [True, False])
def test_gpt2_attention_with_its_transposed_fused_weight_agrees(register, transposed):
    pytest.importorskip("transformers", reason="transformers is not installed (pip install .[hf])")
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    def gpt2(c: Case, mask) -> LayerModule:
        config = GPT2Config(n_embd=c.d_model, n_head=c.heads, attn_pdrop=0.0, resid_pdrop=0.0)
        config._attn_implementation = "sdpa"
        module = GPT2Attention(config, layer_idx=0).to(device=c.device, dtype=c.torch_dtype)
        layout = ModuleLayout(qkv="c_attn", o="c_proj", transposed=transposed)  # Conv1D: (in, out)
        return LayerModule.of(module, lambda x: module(x)[0], layout)

    r = run_row(register("gpt2", gpt2, module=True, gqa=False), case(kv_heads=4))
    if transposed:
        assert r["status"] == "ok" and r["agrees"] is True, r["reason"]
        return
    assert r["status"] == "error" and r["reason"].endswith(  # left out: the fix, named
        "the fused qkv weight has 32 out_features, expected 96 = Hq·D + 2·Hkv·D; its weights "
        "are stored (in_features, out_features), as GPT-2's Conv1D: declare "
        "ModuleLayout(..., transposed=True)"
    ), r["reason"]


def test_an_interleaved_module_agrees_once_declared_and_is_named_when_not(register):
    xt = blocks(norm=False, order="interleaved")
    undeclared = run_row(register("xt_undeclared", xt, module=True), case(mode="fwd"))
    assert undeclared["status"] == "ok" and undeclared["agrees"] is False
    assert HEAD_MOD in undeclared["reason"], undeclared["reason"]
    declared = register("xt", xt, module=True, head_order="interleaved")
    r = run_row(declared, case())
    assert r["status"] == "ok" and r["agrees"] is True, r["reason"]
    wrong = register("grouped", blocks(norm=False), module=True, head_order="interleaved")
    grouped = run_row(wrong, case(mode="fwd"))
    assert grouped["agrees"] is False  # a wrong declaration is caught too
    assert "out matches kv head h // (Hq/Hkv) for query head h" in grouped["reason"]


def interleaved(q, k, v, *, causal, scale):
    """x-transformers' GQA order: query head h reads kv head h % Hkv."""
    group = q.shape[1] // k.shape[1]
    k, v = expand(k, group, "interleaved"), expand(v, group, "interleaved")
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


@pytest.mark.parametrize("level", ["op", "layer"])
def test_an_interleaved_impl_agrees_once_declared_and_is_named_when_not(register, level):
    c = case(level=level, seq_q=16, seq_kv=16)
    r = run_row(register("xt_op", interleaved, head_order="interleaved"), c)
    assert r["status"] == "ok" and r["agrees"] is True, r["reason"]
    r = run_row(register("xt_op_undeclared", interleaved), c)
    assert r["status"] == "ok" and r["agrees"] is False
    said = 'declares head_order="interleaved"' if level == "op" else HEAD_MOD
    assert said in r["reason"], r["reason"]


def test_a_head_order_must_be_one_the_harness_knows(register):
    with pytest.raises(registry.RegistryError, match=r"head_order \['mod'\] not in"):
        register("bad_order", interleaved, head_order="mod")


class CrossStyle(torch.nn.Module):
    """lucidrains' modules and many cross-attention ones: to_q, a fused to_kv (k then v, as
    .chunk(2) splits it), to_out; no biases. ``bug`` "swap_kv" reads v then k."""

    def __init__(self, c: Case, bug: str = ""):
        super().__init__()
        dm, dkv = c.d_model, c.kv_heads * c.head_dim
        self.group, self.D, self.causal, self.bug = c.heads // c.kv_heads, c.head_dim, c.causal, bug
        self.to_q = torch.nn.Linear(dm, dm, bias=False)
        self.to_kv = torch.nn.Linear(dm, 2 * dkv, bias=False)
        self.to_out = torch.nn.Linear(dm, dm, bias=False)

    def forward(self, x):  # (B, S, d_model) -> (B, S, d_model)
        B, S, _ = x.shape
        k, v = self.to_kv(x).chunk(2, dim=-1)
        k, v = (v, k) if self.bug == "swap_kv" else (k, v)
        q, k, v = (t.view(B, S, -1, self.D).transpose(1, 2) for t in (self.to_q(x), k, v))
        k, v = (expand(t, self.group, "grouped") for t in (k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.to_out(out.transpose(1, 2).reshape(B, S, -1))


def cross_style(bug: str = "", order: str = "qkv"):
    def factory(c: Case, mask) -> LayerModule:
        module = CrossStyle(c, bug).to(device=c.device, dtype=c.torch_dtype)
        layout = ModuleLayout(q="to_q", k="to_kv", v="to_kv", o="to_out", qkv_order=order)
        return LayerModule.of(module, module, layout)

    return factory


@pytest.mark.parametrize(
    "bug,order,agrees",
    [("", "qkv", True), ("swap_kv", "qkv", False), ("swap_kv", "qvk", True)],
    ids=["k-then-v", "swapped-undeclared", "swapped-declared"],
)
def test_a_fused_kv_projection_beside_q_is_hosted_in_its_declared_order(
    register, bug, order, agrees
):
    impl = register("cross_style", cross_style(bug, order), module=True)
    r = run_row(impl, case())
    assert r["status"] == "ok" and r["agrees"] is agrees, r["reason"]
    call = Call.prepare(impl, case(), make_inputs(case(), 0))
    assert call.leaves[2] is call.hosted.module.to_kv.weight  # one leaf: its own fused weight


def test_a_declared_bias_forward_never_uses_is_named_with_backward(register):
    r = run_row(register("block_unused", blocks(bug="drop_q_bias"), module=True), case())
    assert r["status"] == "error" and r["time_ms"] is None
    assert r["reason"] == (
        "bad output: out does not depend on q_proj.bias: its forward never uses it, so there "
        "is no gradient to check; use it in forward, or leave it out of the module (its layout "
        "declares every parameter)"
    )
