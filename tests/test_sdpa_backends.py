"""SDPA with a forced backend: PyTorch's refusal reasons become unsupported rows; the backend
column says which backend ran."""

import warnings

import pytest
import torch
import torch.nn.functional as F

from attnbench.case import Case
from attnbench.impls import sdpa
from attnbench.masks import Mask
from attnbench.measure import backends
from attnbench.registry import Unsupported
from attnbench.testing import run_row

CASE = Case(batch=1, heads=2, kv_heads=2, seq_q=32, seq_kv=32, head_dim=16, causal=True)


def test_cuda_only_backends_are_unsupported_on_the_cpu_with_a_reason(impls):
    for name in ("sdpa_efficient", "sdpa_cudnn"):
        row = run_row(impls[name], CASE)
        assert row["status"] == "unsupported"
        assert row["reason"] == "device=cpu (supported: cuda)"
        assert row["backend"] is None and row["time_ms"] is None


def test_a_refused_backend_raises_unsupported_in_pytorchs_words_on_the_cpu():
    """Called past its static capabilities, the efficient backend on the CPU: PyTorch's own
    refusal, as one line."""
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(Unsupported, match="PyTorch's efficient backend refused: No viable backend"):
        sdpa.forced("efficient")(q, q, q, causal=False, scale=0.25, mask=Mask())


def test_pytorchs_warnings_become_the_reason(impls, monkeypatch):
    """PyTorch gives its reasons as UserWarnings before raising (as on CUDA): they are the
    row's reason, one line, without the C++ location."""

    def refuse(*args, **kwargs):
        warnings.warn(
            "Flash attention requires q,k,v to have the same last dimension and to "
            "be less than or equal to 256. Got Query.size(-1): 512. (Triggered "
            "internally at /pytorch/aten/src/ATen/native/transformers/sdp_utils.cpp)",
            UserWarning,
            stacklevel=2,
        )
        warnings.warn("Flash attention kernel not used because:", UserWarning, stacklevel=2)
        raise RuntimeError("No available kernel. Aborting execution.")

    monkeypatch.setattr(F, "scaled_dot_product_attention", refuse)
    row = run_row(impls["sdpa_flash"], CASE)
    assert row["status"] == "unsupported"
    assert row["reason"] == (
        "PyTorch's flash backend refused: Flash attention requires q,k,v to have the same "
        "last dimension and to be less than or equal to 256. Got Query.size(-1): 512. Flash "
        "attention kernel not used because:"
    )
    assert row["time_ms"] is None


def test_other_runtime_errors_stay_errors(impls, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(F, "scaled_dot_product_attention", broken)
    row = run_row(impls["sdpa_flash"], CASE)
    assert row["status"] == "error" and "illegal memory access" in row["reason"]


@pytest.mark.parametrize(
    "mask,causal,backend",
    [("none", False, "flash"), ("none", True, "flash"), ("padding", True, "flash")],
)
def test_auto_sdpa_row_names_the_backend_that_ran_on_the_cpu(impls, mask, causal, backend):
    case = Case(
        batch=2, heads=2, kv_heads=2, seq_q=32, seq_kv=32, head_dim=16, causal=causal, mask=mask
    )
    row = run_row(impls["sdpa"], case)
    assert row["status"] == "ok" and row["agrees"]
    assert row["backend"] == backend


def test_auto_sdpa_backend_follows_what_pytorch_picks(impls):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, 2, 16, 8)
    for forced, name in ((SDPBackend.MATH, "math"), (SDPBackend.FLASH_ATTENTION, "flash")):

        def run_once(forced=forced):
            with sdpa_kernel(forced):
                sdpa.attention(q, q, q, causal=False, scale=0.3)

        assert sdpa.detect_backend(run_once, "cpu") == name


def test_cuda_kernel_names_map_to_backends_when_no_aten_op_says():
    table = backends.KERNEL_BACKENDS
    assert backends.match(["void pytorch_flash::flash_fwd_kernel<...>"], table) == {"flash"}
    assert backends.match(["fmha_cutlassf_f16_aligned_64x64_rf_sm80"], table) == {"efficient"}
    assert backends.match(["cudnn_generated_fort_native_sdpa_sm90"], table) == {"cudnn"}
    assert backends.match(["cutlass_80_tensorop_s1688gemm_64x64"], table) == set()  # a GEMM
    ops = ["aten::_scaled_dot_product_efficient_attention", "aten::_efficient_attention_forward"]
    assert backends.match(ops, backends.OP_BACKENDS) == {"efficient"}


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "sdpa_math"])
def test_forced_backends_on_cuda_run_or_say_why(impls, name):
    case = Case(
        batch=2,
        heads=4,
        kv_heads=4,
        seq_q=256,
        seq_kv=256,
        head_dim=64,
        dtype="bfloat16",
        causal=True,
        device="cuda",
        mode="fwd_bwd",
    )
    row = run_row(impls[name], case)
    assert row["status"] in ("ok", "unsupported"), row["reason"]
    if row["status"] == "ok":
        assert row["agrees"] and row["backend"] == name.split("_")[1]
    auto = run_row(impls["sdpa"], case)
    assert auto["backend"] in ("flash", "efficient", "cudnn", "math")


def test_a_causal_mask_that_hides_no_key_is_passed_as_no_mask(impls, monkeypatch):
    """One query, bottom-right causal (a decode step): query 0 sees every key, so SDPA gets
    no mask and any backend can take it. The row still agrees with the float64 reference,
    which applies the mask; two queries keep the mask."""
    seen = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append((kwargs.get("attn_mask") is None, kwargs.get("is_causal")))
        return real(*args, **kwargs)

    monkeypatch.setattr(sdpa.F, "scaled_dot_product_attention", spy)
    decode = Case(1, 4, 2, 1, 64, 16, causal=True, causal_align="bottom_right")
    for name in ("sdpa", "sdpa_math"):
        seen.clear()
        row = run_row(impls[name], decode)
        assert row["status"] == "ok" and row["agrees"], row["reason"]
        assert seen and all(s == (True, False) for s in seen), seen
    seen.clear()
    two = Case(1, 4, 2, 2, 64, 16, causal=True, causal_align="bottom_right")
    row = run_row(impls["sdpa_math"], two)
    assert row["status"] == "ok" and row["agrees"] and not any(s[0] for s in seen)
