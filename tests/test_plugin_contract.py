"""A plugin's mask kind or score modifier is checked before any row runs (masks/contract.py):
one that the harness cannot call is refused with one line naming the method and the fix,
when it is registered or when a sweep names it, instead of crashing every row in a worker.
The guide's own examples (docs/plugins.md) are run in a sweep."""

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from attnbench import plugins, registry
from attnbench.case import Case
from attnbench.cli import main
from attnbench.masks import KINDS, MODS, Layout, MaskKind, ScoreMod, canonical_mod, register_mod
from attnbench.masks.contract import ContractError
from attnbench.masks.kind import register_kind, try_kind
from attnbench.measure import agreement
from attnbench.report.render.terminal import masks_table
from attnbench.run.measuring.call import Call
from attnbench.run.measuring.inputs import make_inputs
from attnbench.run.measuring.row import ground_truth
from attnbench.testing import run_row

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "plugins.md"


@pytest.fixture
def registries(monkeypatch):
    """Whatever a test registers (kinds, modifiers, impls, loaded plugin files) is gone after;
    the built-ins are loaded first, as a module imported once never registers again."""
    plugins.discover()
    kinds, mods = dict(KINDS), dict(MODS)
    monkeypatch.setattr(registry, "_IMPLS", dict(registry._IMPLS))
    monkeypatch.setattr(plugins, "_LOADED", set(plugins._LOADED))
    yield
    KINDS.clear()
    KINDS.update(kinds)
    MODS.clear()
    MODS.update(mods)


def guide_block(marker: str) -> str:
    """The guide's Python example that contains ``marker``."""
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    (block,) = [b for b in blocks if marker in b]
    return block


def test_the_guides_score_modifier_and_mask_kind_run_in_a_sweep(tmp_path):
    mod, kind = tmp_path / "hardcap.py", tmp_path / "dilated.py"
    mod.write_text(guide_block("register_mod"))
    kind.write_text(guide_block("register_kind("))
    proc = subprocess.run(
        [sys.executable, "-m", "attnbench", "sweep", "--device", "cpu", "--no-progress",
         "--no-report", "--plugin", str(mod), "--plugin", str(kind),
         "--impls", "naive,tiled,sdpa", "--mask", "none,dilated2", "--causal", "true",
         "--score-mod", "none,hardcap:1", "--batch", "1", "--heads", "2", "--seq-len", "32",
         "--head-dim", "16", "--mode", "fwd_bwd", "--rep-ms", "1",
         "--results-dir", str(tmp_path / "res"), "--run-id", "guide"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = pd.read_csv(tmp_path / "res" / "guide" / "results.csv", keep_default_na=False)
    assert set(df["score_mod"]) == {"", "hardcap:1"} and set(df["mask"]) == {"none", "dilated2"}
    ran = df[df["impl"] != "sdpa"]
    assert (ran["status"] == "ok").all() and (ran["agrees"] == "True").all(), ran["reason"]
    capped = df[(df["impl"] == "sdpa") & (df["score_mod"] == "hardcap:1")]
    assert list(capped["status"]) == ["unsupported"] * 2
    assert capped["reason"].str.startswith("score_mod=hardcap:1 (supported:").all()
    assert "WARNING[XFORMERS]" not in proc.stderr


def modifier(**body) -> type:
    """A ScoreMod subclass named 'trial' with a working apply and reference, ``body`` on top."""
    base = {
        "name": "trial",
        "apply": lambda self, s, h, p, j: s * 0.5,
        "reference": lambda self, s, h, p, j: s * 0.5,
    }
    return type("Trial", (ScoreMod,), base | body)


@pytest.mark.parametrize(
    "body,message",
    [
        (  # the case: an __init__ written without the harness's arguments
            {"__init__": lambda self, cap: None},
            "Trial.__init__(self, cap) cannot take the 3 argument(s) the harness passes; write "
            '__init__(self, arg, heads, device="cpu") calling super().__init__',
        ),
        ({"apply": ScoreMod.apply}, "define apply(self, s, h, p, j)"),
        ({"reference": ScoreMod.reference}, "define reference(self, s, h, p, j)"),
        ({"additive": True}, "define bias(self, h, p, j)"),
        ({"apply": lambda self, s: s}, "Trial.apply(self, s) cannot take the 4 argument(s)"),
        ({"canonical": lambda self, arg: arg}, "write canonical(cls, arg) as a @classmethod"),
        ({"name": "Trial"}, "score_mod name 'Trial' must be lowercase"),
        ({"name": "none"}, "(not 'none')"),
    ],
)
def test_a_modifier_the_harness_cannot_call_is_refused_when_registered(registries, body, message):
    with pytest.raises(ContractError) as exc:
        register_mod(modifier(**body))
    assert message in str(exc.value) and "docs/plugins.md" in str(exc.value)
    assert "trial" not in MODS


@pytest.mark.parametrize(
    "body,message",
    [
        (
            {"__init__": lambda self, arg, heads, device="cpu": float(arg)},
            "Trial(None, heads=2) failed on a small case (TypeError: float() argument must be",
        ),
        (
            {"apply": lambda self, s, h, p, j: s[0]},
            "Trial.apply failed on a small case (TypeError: returned torch.float32 (2, 3, 4), "
            "expected a floating dtype (1, 2, 3, 4))",
        ),
        ({"reference": lambda self, s, h, p, j: s.float()}, "Trial.reference failed"),
        ({"grad": lambda self, s, h, p, j: s[..., :2]}, "which does not broadcast to"),
    ],
)
def test_a_modifier_that_fails_on_small_scores_is_refused_when_a_sweep_names_it(
    registries, body, message
):
    register_mod(modifier(**body))  # the arguments fit: only trying it shows the fault
    with pytest.raises(ContractError) as exc:
        canonical_mod("trial")
    assert str(exc.value).startswith(f"score_mod trial ({__file__}): ")
    assert message in str(exc.value)


def test_the_built_in_modifiers_pass_their_own_trial():
    assert canonical_mod("softcap") == "softcap:50" and canonical_mod("alibi") == "alibi"


class Every2(Layout):
    def rule(self, b, i, j, causal):
        return ((i - j) % 2 == 0) & (j <= i)


class Dilated(MaskKind):
    name = "dilated2"
    needs_causal = self_only = True

    def layout(self, case, seed):
        return Every2(case.seq_q, case.batch)


def test_a_kind_the_harness_cannot_call_is_refused_when_registered(registries):
    with pytest.raises(ContractError, match=r"register_kind takes a MaskKind instance: "
                       r"register_kind\(Dilated\(\)\)"):  # fmt: skip
        register_kind(Dilated)
    wrong = type("Wrong", (Dilated,), {"layout": lambda self, case: None})
    with pytest.raises(ContractError, match=r"Wrong.layout\(self, case\) cannot take the 2 "):
        register_kind(wrong())
    assert "dilated2" not in KINDS


def test_a_kind_is_tried_on_a_small_case(registries):
    case = Case(batch=2, heads=2, kv_heads=2, seq_q=16, seq_kv=16, head_dim=8, causal=True,
                mask=register_kind(Dilated()).name)  # fmt: skip
    with pytest.raises(ContractError) as exc:
        try_kind(KINDS["dilated2"], case)
    assert "Every2.hidden failed on a small case (NotImplementedError: Every2 defines no " in (
        str(exc.value)
    )
    for name in ("none", "window", "document", "prefix_lm"):  # the built-ins pass
        kind = KINDS[name]
        try_kind(kind, Case(**{**case.as_dict(), "mask": name,
                               "pattern": "4" if name == "window" else None}))  # fmt: skip


BAD_KIND = """
from attnbench.masks import Layout, MaskKind, register_kind


class Every2(Layout):
    def rule(self, b, i, j, causal):
        return ((i - j) % 2 == 0) & (j <= i)


class Dilated(MaskKind):
    name = "dilated2"
    self_only = True
    needs_causal = True

    def layout(self, case, seed):
        return Every2(case.seq_q, case.batch)


register_kind(Dilated())
"""

BAD_MOD = """
import torch
from attnbench.masks import ScoreMod, register_mod


@register_mod
class Tanh(ScoreMod):
    name = "tanh"

    def __init__(self, cap):
        self.cap = cap

    def apply(self, s, h, p, j):
        return torch.tanh(s)

    def reference(self, s, h, p, j):
        return torch.tanh(s)
"""


def refused(tmp_path, capsys, text: str, impls: str = "naive") -> tuple[Path, str]:
    """The plugin file ``text`` and the one line a sweep with it answers (exit 2, nothing
    written)."""
    path = tmp_path / "plugin.py"
    path.write_text(text)
    code = main(["sweep", "--device", "cpu", "--plugin", str(path), "--impls", impls,
                 "--results-dir", str(tmp_path / "res")])  # fmt: skip
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert not (tmp_path / "res").exists()
    return path, lines[0]


@pytest.mark.parametrize(
    "text,message",
    [
        (BAD_MOD, "score_mod 'tanh' ({path}): Tanh.__init__(self, cap) cannot take"),
        (BAD_KIND, "mask kind 'dilated2' ({path}): Every2.hidden failed on a small case"),
    ],
)
def test_a_bad_plugin_kind_or_modifier_is_one_line_exit_2_nothing_written(
    registries, tmp_path, capsys, text, message
):
    path, line = refused(tmp_path, capsys, text)
    assert message.format(path=path) in line
    assert f"--plugin {path}: " in line and "docs/plugins.md" in line
    assert "dilated2" not in KINDS and "tanh" not in MODS  # a refused kind is taken out again


def test_attnbench_list_names_every_kind_and_modifier_and_where_it_came_from(registries, tmp_path):
    path = tmp_path / "hardcap.py"
    path.write_text(guide_block("register_mod"))
    plugins.discover([str(path)], builtin=False, entry_points=False)
    table = masks_table()
    lines = {line.split()[1].split("[")[0]: line for line in table.splitlines() if line[0] == "-"}
    assert set(lines) == {*KINDS, *MODS}
    assert lines["document"].split()[:3] == ["--mask", "document[:SPEC]", "built-in"]
    assert "(default uniform:64-512; seq_q = seq_kv)" in " ".join(table.split())
    assert lines["alibi"].split()[:3] == ["--score-mod", "alibi", "built-in"]
    assert lines["hardcap"].split()[:3] == ["--score-mod", "hardcap[:ARG]", "plugin"]
    assert f"[{path}]" in masks_table()


@pytest.mark.parametrize(
    "name,hint",
    [
        ("paddin", "; did you mean 'padding'?"),
        ("natten1d", "; did you forget --plugin FILE (the file that registers it)?"),
    ],
)
def test_an_unknown_name_gets_a_close_name_or_the_plugin_hint(name, hint):
    assert plugins.unknown_hint(name, KINDS) == hint


def test_a_name_in_the_working_folders_impls_that_is_not_loaded_names_the_plugin_flag(
    tmp_path, monkeypatch
):
    (tmp_path / "impls").mkdir()
    (tmp_path / "impls" / "mine.py").write_text('@register("my_attn")\ndef f(q, k, v): ...\n')
    monkeypatch.chdir(tmp_path)  # not the checkout: its impls/ is not discovered
    hint = plugins.unknown_hint("my_attn", ["naive", "sdpa"])
    assert hint.endswith("add --plugin impls/mine.py") and "impls/mine.py names it" in hint
    assert "forget --plugin" in plugins.unknown_hint("other", ["naive"])


@pytest.mark.parametrize(
    "flag,value,message",
    [
        ("--impls", "natten_attn", "unknown impl 'natten_attn'; did you forget --plugin FILE"),
        ("--mask", "natten1d", "unknown mask 'natten1d'; did you forget --plugin FILE"),
        ("--score-mod", "natten", "unknown score_mod 'natten' (allowed: none, softcap, alibi)"
         "; did you forget --plugin FILE"),
    ],
)  # fmt: skip
def test_an_unknown_plugin_name_on_the_command_line_asks_for_the_plugin(
    tmp_path, capsys, flag, value, message
):
    code = main(["sweep", "--preset", "smoke", "--results-dir", str(tmp_path), flag, value])
    assert code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines


# --- what impls need of a modifier: capabilities as data on its class ------------------------
SCRIPTS = ROOT / "scripts"


def gym_alibi() -> type:
    """attention-gym's ALiBi as its score_mod is written (scripts/calibrate_accuracy.py
    keeps it for the calibration): additive, with a float32 bias that promotes bfloat16
    scores to float32, and scores raised to +32 over 512 keys."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        from calibrate_accuracy import AlibiUp
    finally:
        sys.path.remove(str(SCRIPTS))
    return AlibiUp


def measured(name: str, case: Case) -> dict:
    """The row of impl ``name`` on ``case``, measured in this process."""
    return run_row(plugins.discover()[name], case)


def judged(name: str, case: Case) -> agreement.Verdict:
    """The verdict of impl ``name``'s checked call on ``case`` (a row's check phase, untimed)."""
    inputs = make_inputs(case, 0)
    out, grads = Call.prepare(plugins.discover()[name], case, inputs).check()
    return agreement.judge(case, [out, *(grads or ())], ground_truth(case, inputs))


SMALL = dict(batch=1, heads=2, kv_heads=2, seq_q=24, seq_kv=24, head_dim=8)


def test_a_plugins_additive_modifier_runs_on_sdpa_as_a_float_mask(registries):
    cls = register_mod(gym_alibi())
    case = Case(**SMALL, score_mod=cls.name, mode="fwd_bwd")
    r = measured("sdpa", case)
    assert r["status"] == "ok" and r["agrees"] is True, r["reason"]
    for name in ("sdpa_math", "naive", "tiled"):  # tiled: additive, its grad is 1
        assert judged(name, case).agrees is True, name
    hardcap = register_mod(modifier(name="hardcap"))
    reasons = plugins.discover()["sdpa"].reasons(Case(**SMALL, score_mod=hardcap.name))
    assert reasons == [
        "score_mod=hardcap (supported: additive modifiers, which only add a bias: additive = "
        "True and bias(self, h, p, j); hardcap is not additive)"
    ]


def test_a_modifier_without_grad_is_refused_by_a_hand_written_backward_naming_the_fix(
    registries,
):
    register_mod(modifier())  # apply s / 2, no grad: an identity default would be wrong
    fwd, bwd = (Case(**SMALL, score_mod="trial", mode=m) for m in ("fwd", "fwd_bwd"))
    tiled = plugins.discover()["tiled"]
    assert tiled.reasons(fwd) == []
    (reason,) = tiled.reasons(bwd)
    assert reason.startswith("score_mod=trial (supported: with backward, modifiers that declare")
    assert reason.endswith(
        "trial declares none: add grad(self, s, h, p, j) to it, or run mode fwd)"
    )
    assert measured("tiled", bwd)["status"] == "unsupported"
    assert judged("naive", bwd).agrees is True  # autograd differentiates apply
    register_mod(modifier(grad=lambda self, s, h, p, j: s.new_tensor(0.5)))
    assert tiled.reasons(bwd) == [] and judged("tiled", bwd).agrees is True


def test_apply_returning_float32_on_bfloat16_scores_is_cast_back(registries):
    cls = register_mod(gym_alibi())
    mod = cls(None, 2)
    s = torch.zeros(1, 2, 3, 4, dtype=torch.bfloat16)
    h, p, j = torch.arange(2)[None, :, None, None], torch.arange(3)[:, None], torch.arange(4)
    assert mod.apply(s, h, p, j).dtype == torch.float32  # as attention-gym's, promoted
    assert mod.scores(s, h, p, j).dtype == torch.bfloat16  # what impls run
    assert judged("naive", Case(**SMALL, dtype="bfloat16", score_mod=cls.name)).agrees is True


def test_scores_a_modifier_raises_count_in_the_bound_by_their_rounding(registries, monkeypatch):
    """attention-gym's ALiBi without causal raises scores to +32 over 512 keys, where bfloat16
    rounds them in steps of 1/8: naive (scores in bfloat16) errs about three times past a
    bound made for scores near 1, tiled (float32 scores) does not. The modifier's term of
    (norm) (C_MOD, docs/method.md) counts that rounding; without it naive is flagged. The
    verdict a row's check phase gets (agreement.judge), untimed."""
    cls = register_mod(gym_alibi())
    case = Case(batch=1, heads=2, kv_heads=2, seq_q=512, seq_kv=512, head_dim=64,
                dtype="bfloat16", score_mod=cls.name)  # fmt: skip
    assert judged("naive", case).agrees is True and judged("tiled", case).agrees is True
    monkeypatch.setattr(agreement, "C_MOD", 0.0)
    flagged = judged("naive", case)
    assert flagged.agrees is False and "out rel" in flagged.notes[-1], flagged.notes


WRONG_SIG = """
from attnbench.registry import register


@register("wrong_sig")
def wrong_sig(q, k, v, causal=False):
    return q
"""


def test_an_impl_that_cannot_take_the_harness_call_is_one_line_exit_2_nothing_written(
    registries, tmp_path, capsys
):
    _, line = refused(tmp_path, capsys, WRONG_SIG, "wrong_sig")
    assert "impl 'wrong_sig': wrong_sig(q, k, v, causal=False) cannot be called as " in line
    assert "(q, k, v, *, causal, scale)" in line and "'scale'" in line
    assert "wrong_sig" not in registry._IMPLS


@pytest.mark.parametrize(
    "declared,fn,needs",
    [
        ({"paged": True}, lambda q, k, v, *, causal, scale: q, "block_table, seq_kv"),
        ({"module": True}, lambda case: None, "(case, mask)"),
    ],
    ids=["paged", "module"],
)
def test_a_paged_or_module_impl_is_checked_against_its_own_call(registries, declared, fn, needs):
    with pytest.raises(registry.RegistryError, match=re.escape(needs)):
        registry.register("odd_call", **declared)(fn)


def _distance(self, h, p, j):
    return -0.5 * (p - j).abs().float()  # (Sq, Skv)


@pytest.mark.parametrize(
    "body,message",
    [
        (  # a sign slip in apply: naive and tiled would disagree while sdpa (bias) agrees
            {"apply": lambda self, s, h, p, j: s - _distance(self, h, p, j).to(s.dtype)},
            "Trial.apply failed on a small case (ValueError: disagrees with Trial.reference in "
            "float64: at head 0, query 0, key 0 it gives -3.5 where Trial.reference gives -4.5)",
        ),
        (  # the slip in bias: sdpa alone would disagree
            {"bias": lambda self, h, p, j: -_distance(self, h, p, j)},
            "s + Trial.bias failed on a small case (ValueError: disagrees with Trial.reference "
            "in float64: at head 0, query 0, key 0 it gives -3.5 where Trial.reference gives "
            "-4.5)",
        ),
    ],
    ids=["apply", "bias"],
)
def test_a_modifier_whose_apply_or_bias_contradicts_its_reference_is_refused(
    registries, body, message
):
    register_mod(modifier(**{
        "additive": True,
        "bias": _distance,
        "apply": lambda self, s, h, p, j: s + _distance(self, h, p, j).to(s.dtype),
        "reference": lambda self, s, h, p, j: s + _distance(self, h, p, j).double(),
    } | body))  # fmt: skip
    with pytest.raises(ContractError) as exc:
        canonical_mod("trial")
    assert message in str(exc.value)
