"""Mask kinds and score modifiers as data (attnbench/masks/): the new kinds (prefix_lm) and
modifiers (softcap, alibi) agree for the impls that declare them and are refused with a
reason by those that do not; planted bugs in them are caught; every kind's impl rule and
reference rule agree; a plugin adds a kind of its own in one file; a Gemma-2 preset row
soft-caps."""

import importlib.util
from pathlib import Path

import pytest
import torch

from attnbench import masks, plugins, registry
from attnbench.case import Case, CaseError
from attnbench.masks import KINDS, MODS
from attnbench.options import OPTIONS
from attnbench.spec import Spec
from attnbench.testing import registered, run_row

BASE = dict(batch=2, heads=4, kv_heads=2, seq_q=40, seq_kv=40, head_dim=8)
CASES = {
    "prefix_lm": Case(**BASE, causal=True, mask="prefix_lm", pattern="13"),
    "softcap": Case(**BASE, causal=True, score_mod="softcap:2", mode="fwd_bwd"),
    "alibi": Case(**BASE, score_mod="alibi", mode="fwd_bwd"),
    "alibi decode": Case(
        **{**BASE, "seq_q": 4}, causal=True, causal_align="bottom_right", score_mod="alibi"
    ),
    "softcap document": Case(
        **BASE, causal=True, mask="document", pattern="fixed:12", score_mod="softcap:3"
    ),
    "alibi prefix_lm": Case(**BASE, causal=True, mask="prefix_lm", score_mod="alibi"),
}


def impl(name):
    return plugins.discover()[name]


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("impl_name", ["naive", "tiled", "sdpa"])
def test_new_kinds_and_modifiers_agree_or_are_refused_with_a_reason(impl_name, name):
    case = CASES[name]
    r = run_row(impl(impl_name), case)
    if impl_name == "sdpa" and case.score_mod.startswith("softcap"):
        assert r["status"] == "unsupported"
        assert r["reason"] == (
            f"score_mod={case.score_mod} (supported: additive modifiers, which only add a bias: "
            "additive = True and bias(self, h, p, j); softcap is not additive)"
        )
        assert r["time_ms"] is None
        return
    assert r["status"] == "ok", r["reason"]
    assert r["agrees"] is True, r["reason"]


def flex_row(seq_len: int) -> dict:
    """flex's row of the alibi prefix_lm case at ``seq_len`` (one compile: flex has no
    backward on the CPU)."""
    case = CASES["alibi prefix_lm"].as_dict()
    return run_row(
        impl("flex"), Case(**{**case, "seq_q": seq_len, "seq_kv": seq_len, "mode": "fwd"})
    )


def test_flex_runs_the_kinds_rule_and_the_modifier_as_its_mask_and_score_mod():
    # at a length where torch's compiled CPU FlexAttention is right on every x86 CPU seen
    # (docs/method.md, "Third-party bugs found"); the verdict is attnbench's
    r = flex_row(64)
    assert r["status"] == "ok", r["reason"]
    assert r["agrees"] is True, r["reason"]


@pytest.mark.slow  # a compile of its own; test_diagnose.py plants the same fault cheaply
def test_compiled_flex_at_a_known_bad_length_is_blamed_on_the_compiler():
    """Where torch's compiled CPU FlexAttention is wrong (AVX2 CPUs, torch 2.13, S40 D8:
    docs/method.md, "Third-party bugs found"), the row disagrees and its reason says that the
    same call with torch.compile off agrees. Skips where the bug does not show."""
    r = flex_row(40)
    assert r["status"] == "ok", r["reason"]
    if r["agrees"]:
        pytest.skip(
            f"compiled CPU FlexAttention is right at S40 D8 here (torch {torch.__version__}, "
            f"CPU {torch.backends.cpu.get_cpu_capability()}): the known torch bug is absent"
        )
    assert "eager agrees: the compiled output is wrong (torch.compile, torch " in r["reason"]


def planted(q, k, v, *, causal, scale, mask, bug):
    """Attention in float32 with the case's mask and modifier, right but for ``bug``."""
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    kk = k.repeat_interleave(Hq // Hkv, 1)
    vv = v.repeat_interleave(Hq // Hkv, 1)
    s = (q @ kk.transpose(-1, -2)) * scale  # (B, Hq, Sq, Skv)
    shift = mask.shift(Sq, Skv)
    p = torch.arange(Sq)[:, None] + shift
    j = torch.arange(Skv)[None, :]
    mod = mask.score_mod
    if mod is not None and mod.name == "softcap" and bug != "softcap_missing":
        cap = mod.cap * (2 if bug == "softcap_double" else 1)
        s = cap * torch.tanh(s / cap)
    if mod is not None and mod.name == "alibi":
        slopes = mod.slopes.flip(0) if bug == "alibi_heads_reversed" else mod.slopes
        distance = (p - j) if bug == "alibi_signed" else (p - j).abs()
        s = s - slopes[None, :, None, None] * distance
    keep = mask.keep(Sq, Skv, causal, q.device)  # (Bm, 1, Sq, Skv)
    if bug == "prefix_plus_1":
        keep = keep | ((j <= mask.pattern.prefix) & (j > p))  # one key more in the prefix
    return s.masked_fill(~keep, float("-inf")).softmax(-1) @ vv


BUGS = {
    "softcap_missing": CASES["softcap"],
    "softcap_double": CASES["softcap"],
    "alibi_heads_reversed": CASES["alibi"],
    "alibi_signed": CASES["alibi"],
    "prefix_plus_1": CASES["prefix_lm"],
}


@pytest.fixture
def register(monkeypatch):
    monkeypatch.setattr(registry, "_IMPLS", dict(registry._IMPLS))

    def make(bug):
        def fn(q, k, v, *, causal, scale, mask):
            return planted(q, k, v, causal=causal, scale=scale, mask=mask, bug=bug)

        registry.register(f"planted_{bug or 'none'}", masks=masks.ANY, score_mods=masks.ANY)(fn)
        return registry._IMPLS[f"planted_{bug or 'none'}"]

    return make


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_planted_bugs_in_the_new_kinds_and_modifiers_are_caught(register, bug):
    case = BUGS[bug]
    case = Case(**{**case.as_dict(), "mode": "fwd"})
    assert run_row(register(None), case)["agrees"] is True  # the planted impl without its bug
    r = run_row(register(bug), case)
    assert r["status"] == "ok"
    assert r["agrees"] is False
    assert "disagrees" in r["reason"]


@pytest.mark.parametrize("mask", list(KINDS))
@pytest.mark.parametrize("causal", [False, True])
def test_every_kinds_rule_hidden_and_pair_count_agree(mask, causal):
    kind = KINDS[mask]
    spec = "24" if kind.takes_spec and kind.default_spec is None else None  # a window's W
    shape = {**BASE, "seq_q": 150, "seq_kv": 150, "mask": mask, "pattern": spec}
    if kind.needs_causal and not causal:
        with pytest.raises(CaseError, match="is causal: set causal true"):
            Case(**shape, causal=causal)
        return
    case = Case(**shape, causal=causal)
    layout = kind.layout(case, 3)
    S = case.seq_q
    keep = layout.keep(0, S, 0, S, causal, "cpu")  # (Bm, S, S): what impls run
    hidden = layout.hidden(torch.arange(S)[:, None], torch.arange(S)[None, :], causal)
    assert torch.equal(keep, ~hidden.expand_as(keep))
    counted = int(keep.sum()) * (case.batch // keep.shape[0])
    assert case.pairs(layout=layout) == counted
    for q0, k0 in [(0, 0), (64, 0), (128, 128), (0, 96)]:  # tiles as tiled visits them
        tile = layout.tile(q0, min(q0 + 32, S), k0, min(k0 + 48, S), causal)
        part = keep[:, q0 : q0 + 32, k0 : k0 + 48]
        expect = "empty" if not part.any() else "full" if part.all() else "partial"
        assert tile == expect or (tile == "partial" and expect == "full")


def test_prefix_lm_pairs_by_hand():
    # S = 10, P = 4: rows 0-3 see the 4 prefix keys, rows 4-9 see i + 1 keys
    case = Case(batch=3, heads=1, kv_heads=1, seq_q=10, seq_kv=10, head_dim=4, causal=True,
                mask="prefix_lm", pattern="4")  # fmt: skip
    assert case.pairs(layout=case.kind.layout(case, 0)) == 3 * (4 * 4 + sum(range(5, 11)))
    pct = Case(**{**case.as_dict(), "pattern": "25%", "seq_q": 64, "seq_kv": 64})
    assert pct.kind.layout(pct, 0).prefix == 16


def test_alibi_slopes_follow_the_paper_for_any_head_count():
    assert MODS["alibi"](None, 8).slopes.tolist() == [2.0**-k for k in range(1, 9)]
    # 6 heads: the 4 slopes of 4 heads, then every other slope of 8 heads (2^-0.5·k odd)
    six = MODS["alibi"](None, 6).slopes.tolist()
    assert six == pytest.approx([2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3])


@pytest.mark.parametrize(
    ("option", "text", "message"),
    [
        ("score_mod", "softcap:-1", "softcap:-1 needs a positive cap (e.g. softcap:50)"),
        ("score_mod", "softcap:x", "needs a positive cap"),
        ("score_mod", "alibi:3", "score_mod alibi takes no argument"),
        ("mask", "prefix_lm:0", "mask prefix_lm: '0' is not a prefix length"),
        ("mask", "prefix_lm:120%", "is not a prefix length"),
        ("mask", "padding:3", "mask padding: mask padding takes no spec"),
    ],
)
def test_bad_specs_name_the_fix(option, text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        OPTIONS[option].parse(text)


def test_canonical_specs_and_labels():
    assert OPTIONS["score_mod"].parse("none,softcap,softcap:30.0,alibi") == [
        "",
        "softcap:50",
        "softcap:30",
        "alibi",
    ]
    case = Case(**BASE, causal=True, mask="prefix_lm", score_mod="softcap:30")
    assert case.pattern == "25%"
    assert case.label() == "B2 H4/2 S40 D8 float32 causal prefix_lm 25% softcap:30 fwd"


def test_a_gemma2_preset_row_soft_caps_at_50():
    spec = Spec.from_preset("cpu", "cpu", model=["gemma2-9b"], phase=["prefill"])
    cases = spec.cases()
    assert cases and {c.score_mod for c in cases} == {"softcap:50"}
    small = Case(**{**cases[0].as_dict(), "seq_q": 48, "seq_kv": 48, "pattern": "16",
                    "heads": 2, "kv_heads": 1, "head_dim": 16})  # fmt: skip
    r = run_row(impl("naive"), small)
    assert r["status"] == "ok" and r["agrees"] is True
    assert r["score_mod"] == "softcap:50"


DILATED = '''
"""A plugin's own mask kind, one file: every other key, up to the query (dilated causal)."""
from attnbench.masks import Layout, MaskKind, register_kind


class Every2(Layout):
    kind = "dilated2"

    def rule(self, b, i, j, causal):
        return ((i - j) % 2 == 0) & (j <= i)

    def hidden(self, i, j, causal):
        return ((i - j).remainder(2) != 0)[None] | (j > i)[None]


class Dilated(MaskKind):
    name = "dilated2"
    meaning = "every other key up to the query"
    self_only = True
    needs_causal = True

    def layout(self, case, seed):
        return Every2(case.seq_q, case.batch)


register_kind(Dilated())
'''


def test_a_plugin_adds_a_mask_kind_in_one_file(tmp_path, monkeypatch):
    monkeypatch.setattr(masks.kind, "KINDS", dict(KINDS))
    monkeypatch.setattr(masks, "KINDS", masks.kind.KINDS)
    for module in ("attnbench.case", "attnbench.dims", "attnbench.spec", "attnbench.declarations"):
        monkeypatch.setattr(importlib.import_module(module), "KINDS", masks.kind.KINDS)
    path = tmp_path / "dilated.py"
    path.write_text(DILATED)
    spec = importlib.util.spec_from_file_location("dilated_kind", path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    case = Case(**BASE, causal=True, mask="dilated2")
    assert case.label() == "B2 H4/2 S40 D8 float32 causal dilated2 fwd"
    assert case.pairs(layout=case.kind.layout(case, 0)) == 2 * sum(i // 2 + 1 for i in range(40))
    for name in ("naive", "tiled", "sdpa"):
        r = run_row(impl(name), case)
        assert r["status"] == "ok" and r["agrees"] is True, (name, r["reason"])
    assert "mask=dilated2 (supported:" in run_row(impl("hf_eager"), case)["reason"]


def test_a_sliding_window_with_sinks_is_one_plugin_file():
    """A kind that is no single interval per query (a window plus the first keys) needs
    nothing but its own file: the impls that take any kind run it and agree, the others say
    why not."""
    plugin = Path(__file__).parent / "plugins" / "sinks.py"
    with registered():
        plugins.discover([str(plugin)])
        # S64: where torch's compiled CPU FlexAttention is right (see the tests above)
        shape = {**BASE, "seq_q": 64, "seq_kv": 64}
        case = Case(**shape, causal=True, mask="sliding_window_with_sinks", pattern="8:2")
        assert case.label() == "B2 H4/2 S64 D8 float32 causal sliding_window_with_sinks 8:2 fwd"
        kept = sum(min(i + 1, 8) + min(max(i + 1 - 8, 0), 2) for i in range(64))
        assert case.pairs(case.kind.layout(case, 0)) == 2 * kept
        for name in ("naive", "tiled", "sdpa", "flex"):
            r = run_row(impl(name), case)
            assert r["status"] == "ok" and r["agrees"] is True, (name, r["reason"])
        assert (
            "mask=sliding_window_with_sinks (supported:"
            in run_row(impl("hf_eager"), case)["reason"]
        )
