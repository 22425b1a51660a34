"""The Hopper-shaped ``triton_flash`` kernels, run by Triton's CPU interpreter against the
float64 reference, plus its offline sm90 compile goal.

Interpreter: as in test_triton_flash.py, TRITON_INTERPRET must be set before triton's first
import; this module sets it when triton is not imported yet (or was imported with it set) and
no GPU is visible, and otherwise runs itself in a subprocess (``test_interpreted_in_subprocess``).

Agreement is the harness's rule (``attnbench.measure``: reference, magnitude; agreement.rule, error,
failed). The causal offset (query i sees key j iff j <= i + offset) is checked against the
harness's top-left reference: offset > 0 prepends ``offset`` zero query rows (dout 0, dropped
afterwards: they change no gradient); offset < 0 leaves out the first ``-offset`` query rows,
which see no key and whose output and dq the kernel defines as 0.

Planted bugs: ``test_planted_bug_is_caught`` copies the kernel package, plants one bug in the
copy's source, and checks that the same comparison then fails.

bf16: the interpreter's bf16 ``tl.dot`` is wrong (test_triton_flash.py says why); fp16 and fp32
run here, bf16 only on a GPU.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

_CHILD = os.environ.get("ATTNBENCH_INTERPRET_CHILD") == "1"
_IN_PROCESS = _CHILD or (
    not __import__("torch").cuda.is_available()
    and ("triton" not in sys.modules or os.environ.get("TRITON_INTERPRET") == "1")
)
if _IN_PROCESS:
    os.environ["TRITON_INTERPRET"] = "1"  # before the first import of triton

import pytest  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "attnbench" / "impls" / "triton_flash"
sys.path.insert(0, str(ROOT))

pytest.importorskip("triton")

from interpreter import kernel_tests  # noqa: E402

from attnbench import plugins  # noqa: E402
from attnbench.case import Case  # noqa: E402
from attnbench.measure.agreement import rule  # noqa: E402
from attnbench.measure.reference import magnitude, reference  # noqa: E402

if _IN_PROCESS:
    from interpreter import broken_reason  # noqa: E402

    _BROKEN = broken_reason()
    from attnbench.impls.triton_flash import kernel as tk  # noqa: E402
else:
    tk = None
    _BROKEN = None


interpreted = kernel_tests(_IN_PROCESS, _BROKEN)


@pytest.mark.skipif(_IN_PROCESS, reason="kernel tests run in this process")
def test_interpreted_in_subprocess():
    from interpreter import run_child

    run_child(__file__)


@interpreted
def test_kernels_are_interpreted():
    assert tk.interpreting()


# ------------------------------------------------------------------------------ references


def _inputs(B, Hq, Hkv, Sq, Skv, D, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Sq, D, generator=g).to(dtype)  # (B, Hq, Sq, D)
    k = torch.randn(B, Hkv, Skv, D, generator=g).to(dtype)  # (B, Hkv, Skv, D)
    v = torch.randn(B, Hkv, Skv, D, generator=g).to(dtype)
    do = torch.randn(B, Hq, Sq, D, generator=g).to(dtype)  # (B, Hq, Sq, D)
    return q, k, v, do


def _expected(q, k, v, do, *, causal, scale, offset):
    """float64 reference and magnitudes {name: (ref, mag)} under the causal offset rule."""
    lead = max(offset, 0) if causal else 0  # extra query rows in front
    skip = max(-offset, 0) if causal else 0  # query rows that see no key

    def front(t, n):  # n zero rows before the sequence dim: (B, H, n + S, D)
        return torch.cat([t.new_zeros(*t.shape[:2], n, t.shape[3]), t], dim=2)

    qq, dd = front(q, lead)[:, :, skip:], front(do, lead)[:, :, skip:]
    args = dict(causal=causal, scale=scale, dout=dd)
    out, grads = reference(qq, k, v, **args)
    mags = magnitude(qq, k, v, **args)
    expected = {}
    for name, ref, mag in zip(("out", "dq", "dk", "dv"), (out, *grads), mags):
        if name in ("out", "dq"):  # drop the lead rows, put back the skipped ones as 0
            ref = front(ref[:, :, lead:], skip)
            m, terms, under = (
                None if x is None else front(x[:, :, lead:], skip)
                for x in (mag.m, mag.terms, mag.under)
            )
            mag = replace(mag, m=m, terms=terms, under=under)
        expected[name] = (ref, mag)
    return expected


def _disagreements(got: dict, expected: dict, dtype) -> list[str]:
    names = [name for name in expected if name in got]
    for name in names:
        assert got[name].shape == expected[name][0].shape and got[name].dtype == dtype, name
    verdict = rule(
        names,
        [got[n] for n in names],
        [expected[n][0] for n in names],
        [expected[n][1] for n in names],
        dtype,
    )
    return [] if verdict.agrees else verdict.notes


def _run_dense(module, q, k, v, do, *, causal, scale, offset, tiles, backward=True,
               configs=None):  # fmt: skip
    q, k, v = (t.detach().requires_grad_(backward) for t in (q, k, v))
    out = module.flash_attention(
        q, k, v, causal=causal, scale=scale, causal_offset=offset, tiles=tiles, configs=configs
    )
    got = {"out": out}
    if backward:
        got.update(zip(("dq", "dk", "dv"), torch.autograd.grad(out, (q, k, v), do)))
    return got


def _check(q, k, v, do, *, causal, scale=None, offset=0, tiles=None, backward=True,
           configs=None):  # fmt: skip
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    got = _run_dense(
        tk, q, k, v, do, causal=causal, scale=scale, offset=offset, tiles=tiles,
        backward=backward, configs=configs,
    )  # fmt: skip
    expected = _expected(q, k, v, do, causal=causal, scale=scale, offset=offset)
    bad = _disagreements(got, expected, q.dtype)
    assert not bad, "; ".join(bad)


# --------------------------------------------------------------------------- dense cases

F32, F16 = torch.float32, torch.float16
# (Hq, Hkv, Sq, Skv, D, dtype, causal, offset, scale, tiles). Default tiles (32, 16) run the
# ping-pong loop; a third tile entry False runs the plain loop. Offsets: Skv - Sq is
# bottom-right (with Sq > Skv its first Sq - Skv rows see no key); others are arbitrary.
CASES = [
    (6, 2, 77, 131, 40, F16, True, 0, None, None),  # GQA 6:2, odd lengths, Sq < Skv
    (2, 1, 131, 77, 72, F32, True, -54, 0.2, (16, 32)),  # Sq > Skv, bottom-right: empty rows
    (1, 1, 131, 77, 96, F16, False, 0, None, (32, 16, False)),  # Sq > Skv, full
    (2, 1, 1, 45, 80, F32, True, 44, None, None),  # Sq = 1 decode, bottom-right
    (2, 2, 1, 45, 112, F16, False, 0, 0.5, None),  # Sq = 1, full
    (2, 1, 20, 45, 192, F16, True, 25, None, None),  # Sq < Skv bottom-right
    (2, 2, 37, 37, 16, F32, True, 3, 1.3, (16, 16, False)),  # arbitrary positive offset
    (1, 1, 33, 20, 256, F16, True, 0, None, None),  # largest head dim, top-left Sq > Skv
    (2, 1, 24, 40, 128, F16, False, 0, None, None),
    (4, 4, 29, 29, 64, F32, False, 0, 0.05, None),
    (2, 2, 40, 24, 32, F16, True, -7, None, (16, 16, False)),
]


@interpreted
@pytest.mark.parametrize(
    "Hq,Hkv,Sq,Skv,D,dtype,causal,offset,scale,tiles",
    CASES,
    ids=[
        f"H{c[0]}-{c[1]}_S{c[2]}x{c[3]}_D{c[4]}_{str(c[5])[6:]}_"
        f"{f'causal{c[7]:+d}' if c[6] else 'full'}_t{c[9]}"
        for c in CASES
    ],
)
def test_fwd_bwd_agrees(Hq, Hkv, Sq, Skv, D, dtype, causal, offset, scale, tiles):
    q, k, v, do = _inputs(1, Hq, Hkv, Sq, Skv, D, dtype)
    _check(q, k, v, do, causal=causal, scale=scale, offset=offset, tiles=tiles)


# ------------------------------------------------------------------------------- variants

# the kernels' variant flags (tuning.FLAGS) at interpreter tile sizes, paired fwd + bwd
_ONE, _WS, _FLAT, _TMA = ("ONE_LOOP", True), ("WS", True), ("PERSISTENT", False), ("DQ_TMA", True)
VARIANTS = {
    "one_loop+dq_tma": {"fwd": (32, 16, 8, 2, False, (_ONE,)), "bwd": (16, 32, 8, 2, (_TMA,))},
    "ws+dq_tma_m32": {"fwd": (32, 16, 4, 2, False, (_ONE, _WS)), "bwd": (32, 16, 8, 2, (_TMA,))},
    "flat": {"fwd": (32, 16, 8, 2, True, (_FLAT,))},
    "flat_ws+dq_tma": {"fwd": (16, 32, 4, 2, False, (_ONE, _WS, _FLAT)),
                       "bwd": (16, 16, 8, 2, (_TMA,))},
}  # fmt: skip
# each variant on the cases that stress it: GQA with odd lengths (CASES[0]), bottom-right with
# rows that see no key (1), full with Sq > Skv (2), a positive offset (6); fp16 and fp32
VARIANT_CASES = [
    ("one_loop+dq_tma", 0), ("one_loop+dq_tma", 1), ("ws+dq_tma_m32", 1), ("ws+dq_tma_m32", 6),
    ("flat", 2), ("flat", 0), ("flat_ws+dq_tma", 6), ("flat_ws+dq_tma", 2),
]  # fmt: skip


@interpreted
@pytest.mark.parametrize("variant,case", VARIANT_CASES, ids=[f"{v}-{c}" for v, c in VARIANT_CASES])
def test_variant_agrees(variant, case):
    Hq, Hkv, Sq, Skv, D, dtype, causal, offset, scale, _ = CASES[case]
    q, k, v, do = _inputs(1, Hq, Hkv, Sq, Skv, D, dtype, seed=case)
    _check(q, k, v, do, causal=causal, scale=scale, offset=offset, configs=VARIANTS[variant])


@interpreted
def test_variants_on_packed_sequences():
    """ONE_LOOP + WS and DQ_TMA on packed (varlen) sequences: descriptors per sequence."""
    test_varlen_matches_per_sequence_reference(F16, True, "bottom_right",
                                               configs=VARIANTS["ws+dq_tma_m32"])  # fmt: skip


def test_variant_flags_are_checked():
    from attnbench.impls.triton_flash import tuning

    meta, warps, stages = tuning.meta_of("fwd", (128, 128, 4, 3, False, (_ONE, _WS)))
    assert (warps, stages) == (4, 3) and meta["WS"] and meta["ONE_LOOP"] and meta["PERSISTENT"]
    assert tuning.meta_of("bwd", (64, 64, 8, 2))[0] == {"BLOCK_M": 64, "BLOCK_N": 64,
                                                        "DQ_TMA": False}  # fmt: skip
    with pytest.raises(ValueError, match="WS needs ONE_LOOP"):
        tuning.meta_of("fwd", (128, 128, 4, 2, False, (_WS,)))
    with pytest.raises(ValueError, match="flag 'DQ_TMA' unknown"):
        tuning.meta_of("fwd", (128, 128, 4, 2, False, (_TMA,)))
    # a kept config's tuple round-trips through triton.Config, flags included
    for kind in ("fwd", "bwd"):
        for cfg in tuning.LAB[kind].values():
            assert tuning.config_tuple(kind, tuning._triton_config(kind, cfg)) == cfg


@interpreted
@pytest.mark.parametrize("D", [24, 48, 136, 168, 200, 232, 248])
def test_forward_other_head_dims(D):
    q, k, v, do = _inputs(1, 2, 1, 9, 19, D, F16, seed=D)
    _check(q, k, v, do, causal=True, tiles=(16, 16), backward=False)


@interpreted
def test_batch2_strided():
    # (B, S, H, D) storage seen as (B, H, S, D): only the last dim is contiguous
    q, k, v, do = (
        t.transpose(1, 2).contiguous().transpose(1, 2)
        for t in _inputs(2, 2, 1, 13, 27, 40, F16, seed=2)
    )
    assert not q.is_contiguous() and q.stride(-1) == 1
    _check(q, k, v, do, causal=True, offset=14, tiles=(16, 16))


@interpreted
def test_lse_matches_logsumexp():
    q, k, v, _ = _inputs(1, 4, 2, 37, 50, 40, F32, seed=4)
    _, lse = tk.forward(q, k, v, causal=True, scale=0.3, causal_offset=-5)  # (B, Hq, Sq)
    kk = k.double().repeat_interleave(2, dim=1)  # (B, Hq, Skv, D), reference side only
    s = q.double() @ kk.transpose(-1, -2) * 0.3
    i, j = torch.arange(37)[:, None], torch.arange(50)[None, :]
    expected = s.masked_fill(j > i - 5, float("-inf")).logsumexp(-1)  # rows 0..4: -inf
    assert lse.dtype == torch.float32 and lse.shape == (1, 4, 37)
    assert torch.isneginf(lse[..., :5]).all()
    torch.testing.assert_close(lse[..., 5:].double(), expected[..., 5:], rtol=1e-5, atol=1e-5)


@interpreted
def test_rejects_bad_inputs():
    q, k, v, _ = _inputs(1, 3, 2, 8, 8, 32, F32)
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        tk.flash_attention(q, k, v)
    q, k, v, _ = _inputs(1, 2, 2, 8, 8, 44, F32)
    with pytest.raises(ValueError, match="head_dim=44"):
        tk.flash_attention(q, k, v)
    with pytest.raises(ValueError, match="causal_align"):
        tk.causal_offset_for("middle", 4, 8)


# --------------------------------------------------------------------------- packed (varlen)


def _pack(ts):  # [(1, H, S_b, D)] -> (sum S_b, H, D)
    return torch.cat([t[0].transpose(0, 1) for t in ts])


def _pack_mag(mags):  # [Magnitude of (1, H, S_b, D)] -> Magnitude of (sum S_b, H, D)
    unders = [x.under if x.under is not None else torch.zeros_like(x.m) for x in mags]
    under = None if all(x.under is None for x in mags) else _pack(unders)
    return replace(
        mags[0], m=_pack([x.m for x in mags]), terms=_pack([x.terms for x in mags]), under=under
    )


def _unpack(t, cu):  # (T, H, D) -> [(1, H, S_b, D)]
    return [t[a:b].transpose(0, 1)[None] for a, b in zip(cu[:-1], cu[1:])]


@interpreted
@pytest.mark.parametrize(
    "dtype,causal,align", [(F32, True, "top_left"), (F16, True, "bottom_right"), (F16, False, "")]
)
def test_varlen_matches_per_sequence_reference(dtype, causal, align, configs=None):
    lens_q, lens_k = [5, 21, 1, 12], [9, 17, 11, 12]  # Sq < Skv, Sq > Skv, Sq = 1, equal
    g = torch.Generator().manual_seed(7)
    D, Hq, Hkv, scale = 40, 2, 1, 0.4
    seqs = [
        [torch.randn(1, h, n, D, generator=g).to(dtype) for h, n in ((Hq, a), (Hkv, b), (Hkv, b))]
        for a, b in zip(lens_q, lens_k)
    ]
    dos = [torch.randn(1, Hq, a, D, generator=g).to(dtype) for a in lens_q]
    q, k, v = (_pack([s[i] for s in seqs]).requires_grad_() for i in range(3))
    do = _pack(dos)
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()])
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()])
    out = tk.flash_attention_varlen(
        q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal, scale=scale,
        causal_align=align or "top_left", tiles=None if configs else (16, 16), configs=configs,
    )  # fmt: skip
    got = dict(zip(("out", "dq", "dk", "dv"), (out, *torch.autograd.grad(out, (q, k, v), do))))
    per_seq = [
        _expected(*s, d, causal=causal, scale=scale,
                  offset=tk.causal_offset_for(align, a, b) if causal else 0)
        for s, d, a, b in zip(seqs, dos, lens_q, lens_k)
    ]  # fmt: skip
    expected = {
        name: (_pack([e[name][0] for e in per_seq]), _pack_mag([e[name][1] for e in per_seq]))
        for name in ("out", "dq", "dk", "dv")
    }
    bad = _disagreements(got, expected, dtype)
    assert not bad, "; ".join(bad)
    assert [t.shape[2] for t in _unpack(out, cu_q.tolist())] == lens_q


# ---------------------------------------------------------------------------- planted bugs

# (file, text, planted): each plant alone must make the comparison below fail
PLANTS = {
    "fwd_causal_boundary": ("fwd.py", "offs_n[None, :] <= offs_m[:, None] + offset",
                            "offs_n[None, :] < offs_m[:, None] + offset"),
    "fwd_no_rescale": ("fwd.py", "acc * alpha[:, None]", "acc"),
    "fwd_ragged_keys": ("fwd.py", "keep = (offs_n < skv)[None, :]",
                        "keep = (offs_n >= 0)[None, :]"),
    "fwd_pingpong_stale": ("fwd.py", "            s = s_next\n", "\n"),
    "bwd_causal_boundary": ("bwd.py", "offs_n[:, None] <= offs_m[None, :] + offset",
                            "offs_n[:, None] < offs_m[None, :] + offset"),
    "bwd_gqa_sum": ("bwd.py", "for g in range(GROUP):", "for g in range(1):"),
    "bwd_dq_scale": ("bwd.py", "dq * sm_scale", "dq"),
    "delta_head_pad": ("bwd.py", "ok = (offs_m < S)[:, None] & (offs_d < HEAD_DIM)[None, :]",
                       "ok = (offs_m < S)[:, None] & (offs_d < HEAD_PAD)[None, :]"),
    # the variants' own paths, run with the variant that takes them
    "fwd_one_loop_unmasked": ("fwd.py", "qk_scale, True, CAUSAL,\n            IEEE, WS, BLOCK_N",
                              "qk_scale, False, CAUSAL,\n            IEEE, WS, BLOCK_N",
                              "ws+dq_tma_m32"),
    "fwd_flat_tile": ("fwd.py", "tl.program_id(0), n_m, n_bh", "tl.program_id(0) // 2, n_m, n_bh",
                      "flat"),
    "bwd_dq_tma_scale": ("bwd.py", "dq_out.atomic_add([m, 0], dq * sm_scale)",
                         "dq_out.atomic_add([m, 0], dq)", "one_loop+dq_tma"),
    "bwd_dq_tma_offset": ("bwd.py", "dq_out.atomic_add([m, 0],", "dq_out.atomic_add([m + 1, 0],",
                          "one_loop+dq_tma"),
}  # fmt: skip


def _planted_copy(tmp_path: Path, name: str):
    """A copy of the kernel package with one bug planted, imported under its own name."""
    file, text, planted = PLANTS[name][:3]
    pkg = f"planted_{name}"
    dest = tmp_path / pkg
    shutil.copytree(PACKAGE, dest, ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "__init__.py").write_text("")  # no registration
    for path in dest.glob("*.py"):
        src = path.read_text().replace("attnbench.impls.triton_flash", pkg)
        if path.name == file:
            assert src.count(text) >= 1, f"{name}: {text!r} not in {file}"
            src = src.replace(text, planted)
        path.write_text(src)
    sys.path.insert(0, str(tmp_path))
    try:
        spec = importlib.util.find_spec(f"{pkg}.kernel")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(tmp_path))
    return module


@interpreted
@pytest.mark.parametrize("name", sorted(PLANTS))
def test_planted_bug_is_caught(tmp_path, name):
    # GQA 2:1, ragged 45 x 37 (tiles 16), head dim 40 (padded to 64), causal, scale 0.3
    q, k, v, do = _inputs(1, 2, 1, 45, 37, 40, F32, seed=9)
    module = _planted_copy(tmp_path, name)
    variant = PLANTS[name][3] if len(PLANTS[name]) > 3 else None
    got = _run_dense(
        module, q, k, v, do, causal=True, scale=0.3, offset=0, tiles=None if variant else (16, 16),
        configs=VARIANTS.get(variant),
    )  # fmt: skip
    expected = _expected(q, k, v, do, causal=True, scale=0.3, offset=0)
    assert _disagreements(got, expected, F32), f"planted bug {name} went unnoticed"


# ------------------------------------------------------------------------ registry, compile


def test_registered_for_every_head_dim_multiple_of_8():
    impl = plugins.discover(entry_points=False)["triton_flash"]
    assert impl.available, impl.unavailable
    assert "triton_flash_fa2" in plugins.discover(entry_points=False)
    cuda = dict(seq_q=64, seq_kv=64, dtype="bfloat16", causal=True, mode="fwd_bwd")
    for d in (16, 40, 72, 80, 96, 112, 192, 256):
        assert impl.reasons(Case(1, 4, 2, head_dim=d, device="cuda", **cuda)) == [], d
    assert any("head_dim=44" in r for r in impl.reasons(Case(1, 4, 2, 64, 64, 44, device="cuda")))
    reasons = impl.reasons(Case(1, 4, 2, head_dim=64, device="cpu", **cuda))
    assert reasons and "device=cpu" in reasons[0], reasons


def test_padded_flop_fraction():
    from attnbench.impls.triton_flash.kernel import head_pad, padded_flop_fraction

    assert [head_pad(d) for d in (16, 40, 64, 80, 192, 256)] == [16, 64, 64, 128, 256, 256]
    assert padded_flop_fraction(128) == 0.0
    assert padded_flop_fraction(80) == pytest.approx(1 - 80 / 128)
    assert padded_flop_fraction(192) == pytest.approx(0.25)


def test_tma_ready_realigns_a_contiguous_view_with_a_misaligned_start():
    from attnbench.impls.triton_flash.kernel import _tma_ready

    base = torch.randn(2 * 3 * 8 * 40 + 1).to(F16)
    t = base[1:].view(2, 3, 8, 40)  # contiguous, but its start is 2 bytes past the storage's
    assert t.is_contiguous() and t.data_ptr() % 16 != 0
    ready = _tma_ready(t)
    assert ready.data_ptr() % 16 == 0 and torch.equal(ready, t)
    aligned = torch.randn(2, 3, 8, 40).to(F16)
    assert _tma_ready(aligned) is aligned  # nothing to fix: no copy


def test_fp32_is_refused_with_its_reason():
    impl = plugins.discover(entry_points=False)["triton_flash"]
    case = Case(1, 2, 2, 64, 64, 64, dtype="float32", device="cuda")
    assert (
        impl.reasons(case)
        and "dtype=float32 (supported: float16, bfloat16" in impl.reasons(case)[0]
    )
    assert impl.reasons(Case(1, 2, 2, 64, 64, 64, dtype="bfloat16", device="cuda")) == []


def _ptxas_missing() -> str | None:
    spec = importlib.util.find_spec("triton")
    bin_dir = Path(spec.origin).parent / "backends" / "nvidia" / "bin"
    missing = [n for n in ("ptxas", "cuobjdump") if not (bin_dir / n).exists()]
    return f"triton ships no {', '.join(missing)} in {bin_dir}" if missing else None


_GOAL_SCRIPT = """
import json
from attnbench.impls.triton_flash import compile_report as c
rows = list(c.rows(archs=(90,), head_dims=(64,), first=True))
print(json.dumps([{**r, "config": str(r.get("config")), "goal": c.goal_failures(r)
                   if "error" not in r else [r["error"]]} for r in rows]))
"""


def _compiled(script: str) -> list[dict]:
    """The rows a compile script prints (its last line, JSON), run in a subprocess: the
    compiler needs TRITON_INTERPRET unset; Triton's compile cache makes reruns fast."""
    import json

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_DEFAULT_FP_FUSION="1", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _recorded_spills(version: str) -> dict[tuple, int]:
    """The compile report's spill bytes for this Triton version: (kind, arch, head_dim,
    config) -> bytes; empty when the report has no section for it."""
    text = (ROOT / "benchmarks" / "triton_flash_compile_report.md").read_text()
    m = re.search(rf"<!-- triton {re.escape(version)} -->(.*?)<!-- end triton", text, re.S)
    spills = {}
    for line in m.group(1).splitlines() if m else []:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 5 and cells[0] in ("fwd", "bwd"):
            config = cells[3].replace("pp", "True").replace("-", "False")
            spills[(cells[0], int(cells[1]), int(cells[2]), config)] = int(cells[5])
    return spills


@pytest.mark.skipif(_ptxas_missing() is not None, reason=str(_ptxas_missing()))
def test_sm90_compile_goal():
    """The first kept sm90 config of each kernel (head dim 64, bf16) compiles with no mma.sync
    and TMA for Q/K/V, and spills no more than the compile report records for this Triton
    version (none where it has no section: Triton 3.9 spills nothing there, Triton 3.6 spills
    8 bytes in the backward). A subprocess: the compiler needs TRITON_INTERPRET unset;
    Triton's compile cache makes reruns fast."""
    import triton

    rows = _compiled(_GOAL_SCRIPT)
    assert len(rows) == 2, rows
    recorded = _recorded_spills(triton.__version__)
    for r in rows:
        allowed = recorded.get((r["kind"], r["arch"], r["head_dim"], r["config"]), 0)
        other = [g for g in r["goal"] if not g.endswith("B spilled")]
        assert not other, (r["kind"], r["config"], r["goal"])
        assert r["spill_bytes"] <= allowed, (r["kind"], r["config"], r["spill_bytes"], allowed)


_LAB_SCRIPT = """
import json
from attnbench.impls.triton_flash import compile_report as c
rows = list(c.lab_rows(causal=(True,), names=("fwd:ws", "bwd:dq_tma")))
print(json.dumps([{**r, "config": str(r["config"]), "check": c.lab_failures(r)} for r in rows]))
"""


@pytest.mark.skipif(_ptxas_missing() is not None, reason=str(_ptxas_missing()))
def test_sm90_lab_flags_take_effect():
    """The lab's flags change the compiled sm90 kernel as meant (bf16, head dim 128, causal):
    WS launches 12 warps (a producer warpgroup beside two consumers) with ``setmaxnreg``,
    DQ_TMA adds dQ by TMA reduces (``cp.reduce.async.bulk.tensor``), both within the shared
    memory limit. Every lab variant is compiled by ``compile_report --lab`` (its section of
    benchmarks/triton_flash_compile_report.md)."""
    rows = {r["variant"]: r for r in _compiled(_LAB_SCRIPT)}
    assert set(rows) == {"ws", "dq_tma"} and not any(r["check"] for r in rows.values()), rows
    assert rows["ws"]["warps"] == 12 and rows["ws"]["setmaxnreg"] > 0
    assert rows["dq_tma"]["tma_reduce"] > 0 and rows["dq_tma"]["warps"] == 8
