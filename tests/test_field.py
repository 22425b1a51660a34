"""The field's GPU libraries (FlashAttention-2/3, FlashInfer, transformers' flash path): what
they declare, how attnbench maps a case onto their calling conventions (checked on the CPU
against stand-ins in tests/fake_attention_libs.py, through the harness and the float64
reference), and, on a GPU, the real libraries."""

from __future__ import annotations

import dataclasses
import importlib
import sys

import pytest
import torch
from fake_attention_libs import fake_flash_attn, fake_flashinfer

from attnbench import plugins, registry
from attnbench.case import Case
from attnbench.cli import list_impls
from attnbench.testing import run_row

GPU_ONLY = (
    "flash_attn2",
    "flash_attn2_paged",
    "flash_attn3",
    "flash_attn3_paged",
    "flashinfer",
    "flashinfer_paged",
    "hf_flash2",
)
MODULE = {  # impl -> (module it imports, its stand-in)
    "flash_attn2": ("flash_attn", lambda: fake_flash_attn(2)),
    "flash_attn2_paged": ("flash_attn", lambda: fake_flash_attn(2)),
    "flash_attn3": ("flash_attn_interface", lambda: fake_flash_attn(3)),
    "flash_attn3_paged": ("flash_attn_interface", lambda: fake_flash_attn(3)),
    "flashinfer": ("flashinfer", fake_flashinfer),
    "flashinfer_paged": ("flashinfer", fake_flashinfer),
}


def impl_module(name: str):
    """An impl module, imported by discovery (so its impls keep their source)."""
    plugins.discover()
    return importlib.import_module(f"attnbench.impls.{name}")


def case(**kw) -> Case:
    base = dict(batch=2, heads=4, kv_heads=2, seq_q=64, seq_kv=64, head_dim=16, dtype="bfloat16")
    return Case(**{**base, **kw})


def decode(seq_q=1, **kw) -> Case:
    return case(seq_q=seq_q, seq_kv=300, causal=True, causal_align="bottom_right", **kw)


def label(x) -> str:
    return x.label() if isinstance(x, Case) else x if isinstance(x, str) else ""


@pytest.fixture
def fake(impls, monkeypatch):
    """``fake(name)``: the impl made runnable on the CPU with its library's stand-in
    installed; returns (impl, stand-in)."""

    def make(name: str):
        module, build = MODULE[name]
        lib = build()
        monkeypatch.setitem(sys.modules, module, lib)
        impl = dataclasses.replace(impls[name], devices=("cpu",), unavailable=None)
        return impl, lib

    return make


# -- declarations --------------------------------------------------------------------------


def test_every_gpu_library_is_listed_with_why_it_cannot_run_here(impls):
    listing = " ".join(list_impls(impls, "cpu").split())  # the notes are wrapped
    for name in GPU_ONLY:
        impl = impls[name]
        assert name in listing
        reasons = impl.reasons(case(device="cpu"))
        if impl.available:  # installed here: the device says why not
            assert any("device=cpu (supported: cuda)" in r for r in reasons), reasons
        else:
            assert "install:" in impl.unavailable and " ".join(impl.unavailable.split()) in listing
            assert reasons == [impl.unavailable]


def test_flash_attn_declares_its_limits_as_readable_reasons(impls):
    fa2 = dataclasses.replace(impls["flash_attn2"], unavailable=None)
    assert fa2.layout == "bshd" and fa2.backward and fa2.gqa
    assert fa2.reasons(case(device="cuda", causal=True, mode="fwd_bwd")) == []
    assert fa2.reasons(case(device="cuda", dtype="float32")) == [
        "dtype=float32 (supported: bfloat16, float16)"
    ]
    assert fa2.reasons(case(device="cuda", head_dim=260)) == [
        "head_dim=260 (supported: multiples of 8 up to 256)"
    ]
    top_left = case(device="cuda", seq_q=16, seq_kv=80, causal=True)
    assert fa2.causal_align == ("bottom_right",)
    assert fa2.reasons(top_left) == ["causal_align=top_left (supported: bottom_right)"]
    assert fa2.reasons(case(device="cuda", causal=True)) == []  # equal lengths: the same
    assert fa2.reasons(decode(device="cuda")) == []  # bottom-right: its own alignment
    assert fa2.reasons(case(device="cuda", mask="padding"))[0].startswith("mask=padding")
    paged = dataclasses.replace(impls["flash_attn2_paged"], unavailable=None)
    assert paged.paged and paged.page_tokens == 256 and not paged.backward
    assert impls["flash_attn3_paged"].page_tokens is None  # any page size: the harness's 128
    assert paged.reasons(decode(device="cuda", mode="fwd_bwd")) == [
        "mode=fwd_bwd (supported: fwd; no backward)"
    ]


def test_flashinfer_declares_its_limits_as_readable_reasons(impls):
    fi = dataclasses.replace(impls["flashinfer"], unavailable=None)
    assert not fi.backward and fi.layout == "bshd"
    assert fi.reasons(decode(device="cuda", head_dim=64)) == []
    assert fi.reasons(case(device="cuda", head_dim=96)) == ["head_dim=96 (supported: 64, 128, 256)"]
    assert fi.reasons(case(device="cuda", head_dim=64, mask="window", pattern="8")) == [
        "mask=window with causal=False (supported: causal; FlashInfer's window is left)"
    ]


@pytest.mark.parametrize(
    "name,sm,reason",
    [
        ("flash_attn2", (7, 5), "compute_capability=sm_75 (supported: sm_80 and newer)"),
        ("flash_attn3", (10, 0), "compute_capability=sm_100 (supported: sm_80 to sm_90)"),
        ("flash_attn3", (9, 0), None),
        ("flashinfer", (8, 6), None),
    ],
)
def test_compute_capability_is_a_reason(impls, monkeypatch, name, sm, reason):
    monkeypatch.setattr(registry, "_cuda_visible", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: sm)
    impl = dataclasses.replace(impls[name], unavailable=None)
    assert impl.reasons(decode(device="cuda", head_dim=64)) == ([reason] if reason else [])


def test_window_and_alignment_map_onto_the_libraries_arguments():
    flash_attn, flashinfer = impl_module("flash_attn"), impl_module("flashinfer")
    assert flash_attn.window_size(True, 9) == (8, 0)  # p - 8 <= j <= p: 9 keys
    assert flash_attn.window_size(False, 9) == (8, 8)  # |p - j| < 9
    assert flash_attn.window_size(True, None) == (-1, -1)
    assert flashinfer.window_left(9) == 8 and flashinfer.window_left(None) == -1


# -- argument mapping, against the stand-ins -------------------------------------------------

FA_CASES = [  # (case, the function it must call)
    (case(causal=True, mode="fwd_bwd"), "flash_attn_func"),
    (case(seq_q=80, seq_kv=48, causal=True, causal_align="bottom_right"), "flash_attn_func"),
    (case(mask="window", pattern="9", causal=True, mode="fwd_bwd"), "flash_attn_func"),
    (case(mask="window", pattern="9"), "flash_attn_func"),
    (decode(), "flash_attn_with_kvcache"),
    (decode(seq_q=4, mask="window", pattern="50"), "flash_attn_with_kvcache"),
    (case(seq_q=16, seq_kv=80), "flash_attn_with_kvcache"),
    (case(seq_q=96, seq_kv=96, mask="document", pattern="uniform:10-40", causal=True,
          mode="fwd_bwd"), "flash_attn_varlen_func"),
    (case(seq_q=96, seq_kv=96, mask="document", pattern="uniform:10-40"),
     "flash_attn_varlen_func"),
]  # fmt: skip


@pytest.mark.parametrize(
    "name,c,function",
    [("flash_attn2", *x) for x in FA_CASES]  # FA3: one case per function
    + [("flash_attn3", *FA_CASES[i]) for i in (0, 5, 7)],
    ids=label,
)
def test_flash_attn_mapping_agrees_through_the_stand_in(fake, name, c, function):
    impl, lib = fake(name)
    row = run_row(impl, c)
    assert row["status"] == "ok" and row["agrees"] is True, row["reason"]
    assert set(lib.calls) == {function}


@pytest.mark.parametrize("name", ["flash_attn2_paged", "flash_attn3_paged"])
@pytest.mark.parametrize(
    "c", [decode(), decode(seq_q=4), decode(seq_q=4, mask="window", pattern="50")], ids=Case.label
)
def test_paged_flash_attn_reads_the_block_table(fake, name, c):
    impl, lib = fake(name)  # FA2's stand-in refuses pages that are not a multiple of 256
    row = run_row(impl, c)
    assert row["status"] == "ok" and row["agrees"] is True, row["reason"]
    assert set(lib.calls) == {"flash_attn_with_kvcache"}


DECODE = {f"BatchDecodeWithPagedKVCacheWrapper.{s}" for s in ("plan", "run")}
RAGGED = {f"BatchPrefillWithRaggedKVCacheWrapper.{s}" for s in ("plan", "run")}
FI_CASES = [  # (case, the functions it must call); FlashInfer's head dims: 64, 128, 256
    (case(batch=1, causal=True, head_dim=64), {"single_prefill_with_kv_cache"}),
    (decode(batch=1, head_dim=64), {"single_decode_with_kv_cache"}),
    (decode(batch=1, mask="window", pattern="50", head_dim=64), {"single_decode_with_kv_cache"}),
    (decode(head_dim=64), DECODE),
    (decode(seq_q=4, mask="window", pattern="50", head_dim=64), RAGGED),
    (case(seq_q=16, seq_kv=80, head_dim=64), RAGGED),
    (case(seq_q=96, seq_kv=96, mask="document", pattern="uniform:10-40", causal=True,
          head_dim=64), RAGGED),
]  # fmt: skip


@pytest.mark.parametrize("c,functions", FI_CASES, ids=label)
def test_flashinfer_mapping_agrees_through_the_stand_in(fake, c, functions):
    impl, lib = fake("flashinfer")
    row = run_row(impl, c)
    assert row["status"] == "ok" and row["agrees"] is True, row["reason"]
    assert set(lib.calls) == functions
    assert sum(f.endswith(".plan") for f in lib.calls) <= 1  # planned once per row


@pytest.mark.parametrize(
    "c",
    [
        decode(head_dim=64),
        decode(seq_q=4, head_dim=64),
        decode(seq_q=4, mask="window", pattern="50", head_dim=64),
    ],
    ids=Case.label,
)
def test_flashinfer_paged_uses_its_own_page_table(fake, c):
    impl, lib = fake("flashinfer_paged")
    row = run_row(impl, c)
    assert row["status"] == "ok" and row["agrees"] is True, row["reason"]
    kind = "Decode" if c.seq_q == 1 else "Prefill"
    assert set(lib.calls) == {f"Batch{kind}WithPagedKVCacheWrapper.{s}" for s in ("plan", "run")}
    # planned once per row, outside the timed calls
    assert lib.calls.count(f"Batch{kind}WithPagedKVCacheWrapper.plan") == 1


@pytest.mark.parametrize("name", ["flash_attn2", "flashinfer"])
def test_a_window_off_by_one_disagrees(fake, monkeypatch, name):
    """The stand-ins can catch a wrong mapping: a window one key too wide disagrees."""
    impl, _ = fake(name)
    flash_attn, flashinfer = impl_module("flash_attn"), impl_module("flashinfer")
    if name == "flash_attn2":
        monkeypatch.setattr(flash_attn, "window_size", lambda causal, w: (w, 0))
    else:
        monkeypatch.setattr(flashinfer, "window_left", lambda w: w)
    row = run_row(impl, decode(seq_q=4, mask="window", pattern="50", head_dim=64))
    assert row["status"] == "ok" and row["agrees"] is False
    assert "disagrees with the float64 reference" in row["reason"]
    assert "out matches window 51; declared window 50" in row["reason"], row["reason"]


# -- the real libraries, on a GPU --------------------------------------------------------------


def cuda_cases(impl) -> list[Case]:
    base = dict(batch=2, heads=8, kv_heads=2, head_dim=128, dtype="bfloat16", device="cuda")
    cases = [
        Case(seq_q=1, seq_kv=4096, causal=True, causal_align="bottom_right", **base),
        Case(seq_q=4, seq_kv=4096, causal=True, causal_align="bottom_right", **base),
    ]
    if not impl.paged:
        mode = "fwd_bwd" if impl.backward else "fwd"
        cases += [
            Case(seq_q=1024, seq_kv=1024, causal=True, mode=mode, **base),
            Case(seq_q=1024, seq_kv=1024, mask="window", pattern="256", causal=True, **base),
            Case(seq_q=1024, seq_kv=1024, mask="document", pattern="uniform:64-512", causal=True,
                 **base),
        ]  # fmt: skip
    return cases


@pytest.mark.gpu
@pytest.mark.parametrize("name", GPU_ONLY)
def test_the_real_library_agrees_on_a_gpu(impls, name):
    impl = impls[name]
    if not impl.available:
        pytest.skip(impl.unavailable)
    for c in cuda_cases(impl):
        row = run_row(impl, c)
        assert row["status"] in ("ok", "unsupported"), (c.label(), row["reason"])
        if row["status"] == "ok":
            assert row["agrees"] is True, (c.label(), row["reason"])
