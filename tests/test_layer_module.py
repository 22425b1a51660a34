"""Level layer around a model's own attention module (register(..., module=True)): the harness
loads the seeded weights into the module, so a correct module agrees with the float64 layer
reference, a planted bug disagrees, learned parts its layout does not declare are unsupported
with a reason, and transformers' LlamaAttention (impls/hf_llama.py) agrees. Biases, fused
weights, q/k norms and head orders: tests/test_layer_parts.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from attnbench import plugins, registry
from attnbench.case import Case
from attnbench.cli import main
from attnbench.module_layout import LayerModule
from attnbench.run.measuring.call import Call
from attnbench.run.measuring.inputs import make_inputs
from attnbench.testing import run_row


def case(**kw) -> Case:
    base = dict(batch=2, heads=4, kv_heads=2, seq_q=24, seq_kv=24, head_dim=8, level="layer")
    return Case(**{**base, "causal": True, "mode": "fwd_bwd", **kw})


class TinyAttention(torch.nn.Module):
    """transformers' calling convention: forward(hidden_states, attention_mask) -> (out,
    weights), projections q_proj, k_proj, v_proj, o_proj; ``bug`` plants one mistake."""

    def __init__(self, c: Case, bias: bool = False, bug: str | None = None):
        super().__init__()
        dm, dkv = c.d_model, c.kv_heads * c.head_dim
        self.heads, self.head_dim, self.causal, self.bug = c.heads, c.head_dim, c.causal, bug
        self.q_proj = torch.nn.Linear(dm, dm, bias=bias)
        self.k_proj = torch.nn.Linear(dm, dkv, bias=bias)
        self.v_proj = torch.nn.Linear(dm, dkv, bias=bias)
        self.o_proj = torch.nn.Linear(dm, dm, bias=bias)

    def forward(self, hidden_states, attention_mask=None):
        B, S, _ = hidden_states.shape
        q, k, v = (
            p(hidden_states).view(B, S, -1, self.head_dim).transpose(1, 2)  # (B, H, S, D)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        scale = 1.0 if self.bug == "scale" else self.head_dim**-0.5
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=self.causal, scale=scale, enable_gqa=True
        )
        out = out.transpose(1, 2).reshape(B, S, -1)  # (B, S, Hq·D)
        return (out if self.bug == "no_o_proj" else self.o_proj(out)), None


@pytest.fixture
def register(monkeypatch):
    """Registers a TinyAttention factory under a test name; no impl is left behind."""
    monkeypatch.setattr(registry, "_IMPLS", dict(registry._IMPLS))

    def make(name="tiny", **module_kw):
        def factory(c: Case, mask) -> LayerModule:
            module = TinyAttention(c, **module_kw).to(device=c.device, dtype=c.torch_dtype)
            return LayerModule.of(module, lambda x: module(x, None)[0])

        registry.register(name, module=True, masks=())(factory)
        return registry._IMPLS[name]

    return make


@pytest.mark.parametrize(
    "c", [case(), case(causal=False, mode="fwd"), case(dtype="bfloat16")], ids=Case.label
)
def test_a_hosted_module_runs_with_the_seeded_weights_and_agrees(register, c):
    impl = register()
    r = run_row(impl, c)
    assert r["status"] == "ok" and r["agrees"] is True, r["reason"]
    assert r["time_ms"] > 0
    inputs = make_inputs(c, 0)
    call = Call.prepare(impl, c, inputs)
    for w, seeded in zip(call.leaves[1:], inputs.weights):  # the module holds the seed's weights
        assert torch.equal(w, seeded)
    out, grads = call.check()
    assert out.shape == (c.batch, c.seq_q, c.d_model)
    assert (grads is None) == (not c.backward)


@pytest.mark.parametrize(
    "bug, mode", [("scale", "fwd_bwd"), ("no_o_proj", "fwd")], ids=["scale", "no_o_proj"]
)
def test_a_planted_bug_in_the_module_disagrees(register, bug, mode):
    r = run_row(register(f"tiny_{bug}", bug=bug), case(mode=mode))
    assert r["status"] == "ok" and r["agrees"] is False, r["reason"]
    assert "disagrees with the float64 reference" in r["reason"]


def test_a_module_with_biases_runs_as_it_is_and_agrees(register):
    r = run_row(register("tiny_bias", bias=True), case())
    assert r["status"] == "ok" and r["agrees"] is True, r["reason"]


def test_a_learned_part_its_layout_does_not_declare_is_unsupported(register):
    impl = register("tiny_gate")
    gated = registry.Impl(name="gated", fn=lambda c, m: gate(impl.fn(c, m)), module=True)
    r = run_row(gated, case())
    assert r["status"] == "unsupported" and r["time_ms"] is None
    assert r["reason"].startswith("module parameters gate (supported: the learned parts its")


def gate(made: LayerModule) -> LayerModule:
    """``made`` with a learned parameter no layout declares."""
    made.module.gate = torch.nn.Parameter(torch.ones(1))
    return made


def test_a_module_in_another_dtype_is_an_error_never_a_number(register):
    impl = register()
    c = case(dtype="bfloat16")
    wrong = registry.Impl(name="fp32_module", fn=lambda cc, m: impl.fn(case(), m), module=True)
    r = run_row(wrong, c)
    assert r["status"] == "error" and r["time_ms"] is None and r["agrees"] is None
    assert "q_proj.weight is (32, 32) torch.float32 on cpu, expected" in r["reason"]


def test_a_module_impl_runs_at_level_layer_only(register):
    impl = register()
    assert impl.reasons(case(level="op")) == [
        "level=op (supported: layer; a module brings its own projections)"
    ]
    with pytest.raises(registry.RegistryError, match="module=True"):
        registry.register("paged_module", module=True, paged=True)(lambda c, m: None)


@pytest.mark.parametrize(
    "c",
    [case(), case(causal=False, mask="padding"), case(mask="window", pattern="5", mode="fwd")],
    ids=Case.label,
)
def test_transformers_llama_attention_agrees(impls, c):
    pytest.importorskip("transformers", reason="transformers is not installed (pip install .[hf])")
    for name in ("hf_llama_eager", "hf_llama_sdpa"):
        r = run_row(impls[name], c)
        assert r["status"] == "ok" and r["agrees"] is True, (name, r["reason"])


def test_the_plugin_guide_module_example_agrees(register, tmp_path):
    text = (Path(__file__).resolve().parent.parent / "docs" / "plugins.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "module=" in b)
    path = tmp_path / "module_example.py"
    path.write_text(block)
    plugins._load_file(path)
    for c in (case(), case(causal=False, mode="fwd")):
        r = run_row(registry._IMPLS["my_module"], c)
        assert r["status"] == "ok" and r["agrees"] is True, r["reason"]


OLD_API = """
import torch
from attnbench import LayerModule, ModuleLayout, register


@register("old_mha", module=True, gqa=False)
def old_mha(case, mask):
    mha = torch.nn.MultiheadAttention(case.d_model, case.heads, batch_first=True)
    forward = lambda x: mha(x, x, x, need_weights=False)[0]
    return LayerModule.of({call})
"""


@pytest.mark.parametrize(
    "call,said",
    [
        (
            "mha, forward, names={'q': 'q_proj'}",
            "LayerModule.of() was given names=, which it does not take (an earlier API); "
            "declare the parts' paths in a ModuleLayout: LayerModule.of(module, forward, "
            "layout=ModuleLayout(...))",
        ),
        (
            "mha, forward, forward",
            "LayerModule's layout is the function old_mha.<locals>.<lambda>, not a "
            "ModuleLayout (forward and layout swapped?)",
        ),
        ("forward, mha", "LayerModule's module is the function old_mha.<locals>.<lambda>, not"),
        ("mha", "LayerModule.of() was given no forward; build it as LayerModule.of("),
        ("mha, forward, None, 3", "LayerModule.of() was given 4 arguments; build it as"),
        (
            "mha, forward, ModuleLayout(qkv=('in_proj_weight', 'in_proj_bias'), o='out')",
            "the module's layout names 'out', which MultiheadAttention does not have",
        ),
        (
            "mha, forward, ModuleLayout(qkv='out_proj', o='out_proj')",
            "the fused qkv weight has 16 out_features, expected 48 = Hq·D + 2·Hkv·D",
        ),
    ],
    ids=["names", "function-as-layout", "swapped", "no-forward", "four", "path", "fused-size"],
)
def test_a_layer_module_of_the_wrong_kinds_is_one_line_exit_2_before_any_row(
    registered, tmp_path, capsys, call, said
):
    path = tmp_path / "old_api.py"
    path.write_text(OLD_API.format(call=call))
    code = main(["sweep", "--device", "cpu", "--plugin", str(path), "--impls", "old_mha",
                 "--level", "layer", "--seq-len", "32", "--heads", "2", "--head-dim", "8",
                 "--results-dir", str(tmp_path / "res")])  # fmt: skip
    assert code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"attnbench sweep: error: impl old_mha ({path}): {said}"), line
    assert not (tmp_path / "res").exists()


def test_the_conformance_grid_of_a_module_impl_is_its_own_level_and_it_checks_something(register):
    """docs/plugins.md's "Testing your impl" recipe on a module impl: its cases are level layer
    (self-attention), so it runs them, and a planted bug fails the recipe."""
    from attnbench.testing import conformance_cases

    good, bad = register(), register("tiny_scale", bug="scale")
    cases = conformance_cases(good)
    assert {c.level for c in cases} == {"layer"} and all(c.seq_q == c.seq_kv for c in cases)
    ran = [c for c in cases if not good.reasons(c)]
    assert ran and all(run_row(good, c)["agrees"] is True for c in ran)
    assert not all(run_row(bad, c)["agrees"] is True for c in ran)
