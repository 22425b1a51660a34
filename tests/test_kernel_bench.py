"""The pure-python parts of scripts/bench_kernel.py (the GPU race itself needs CUDA)."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from attnbench import kernel_bench as kb  # noqa: E402
from attnbench.case import Case  # noqa: E402


def test_shapes_keep_tokens_and_hidden():
    for n in kb.SEQ_LENS:
        for d in kb.HEAD_DIMS:
            b, h = kb.shape(n, d)
            assert b * n == 16384 and h * d == 2048
    with pytest.raises(ValueError):
        kb.shape(1000, 64)


@pytest.mark.parametrize("causal", [False, True])
def test_flops_match_case(causal):
    b, h = kb.shape(2048, 128)
    fwd = kb.flops(b, h, 2048, 128, causal, "fwd")
    case = Case(b, h, h, 2048, 2048, 128, "bfloat16", causal, "fwd", "cuda")
    assert fwd == case.flops()
    pairs = 2048 * 2049 // 2 if causal else 2048 * 2048
    assert fwd == 4 * b * h * pairs * 128
    assert kb.flops(b, h, 2048, 128, causal, "bwd") == 2.5 * fwd


def test_parse_args():
    a = kb.parse_args([])
    assert a.seq_lens == (512, 1024, 2048, 4096, 8192, 16384) and a.head_dims == (64, 128)
    assert a.modes == ("fwd", "bwd") and a.causals == (False, True)
    a = kb.parse_args(["--quick"])
    assert a.seq_lens == kb.QUICK["seq_lens"] and a.rep == kb.QUICK["rep"]
    a = kb.parse_args(["--seq-lens", "1024,2048", "--head-dims", "64", "--modes", "bwd",
                       "--causal", "true", "--out", "x.csv"])
    assert (a.seq_lens, a.head_dims, a.modes, a.causals) == ((1024, 2048), (64,), ("bwd",),
                                                             (True,))
    assert a.out == Path("x.csv")
    for bad in (["--modes", "fwd_bwd"], ["--seq-lens", "1000"], ["--head-dims", "x"]):
        with pytest.raises(SystemExit):
            kb.parse_args(bad)


def test_device_slug():
    assert kb.device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"


def test_ratio_uses_best_other_ok_impl():
    rows = [dict(impl="triton_flash", status="ok", tflops=300.0),
            dict(impl="sdpa_flash", status="ok", tflops=250.0),
            dict(impl="sdpa_cudnn", status="ok", tflops=400.0),
            dict(impl="xformers", status="unsupported", tflops="")]
    assert kb.ratio(rows) == pytest.approx(0.75)
    assert kb.ratio(rows[:1]) is None


def test_verify_flags_a_wrong_output():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 32, generator=g).to(torch.bfloat16) for _ in range(3))
    good = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert kb._verify(q, k, v, True, good, None) == []
    bad = kb._verify(q, k, v, True, good.roll(1, dims=2), None)
    assert bad and bad[0].startswith("out")


def test_verify_checks_grads():
    g = torch.Generator().manual_seed(1)
    q, k, v, dout = (torch.randn(1, 3, 48, 32, generator=g).to(torch.bfloat16) for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    assert kb._verify(q, k, v, False, out.detach(), grads, dout) == []
    bad = kb._verify(q, k, v, False, out.detach(), (grads[0], grads[1] * 1.1, grads[2]), dout)
    assert len(bad) == 1 and bad[0].startswith("dk")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA exit")
def test_no_cuda_exits_2_and_writes_nothing(tmp_path):
    out = tmp_path / "r.csv"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_kernel.py"), "--quick",
                           "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "CUDA" in proc.stderr and not out.exists()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_kernels_compile_for_sm90_and_sm80():
    """The GPU code path, compiled (not run) for H100 and A100 without a GPU."""
    pytest.importorskip("triton")
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    for arch, dtype in ((90, "bf16"), (80, "fp16")):
        proc = subprocess.run([sys.executable, "-m", "attnbench.kernels.compile_check",
                               "--arch", str(arch), "--dtype", dtype, "--head-dims", "128",
                               "--first"], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
        assert proc.stdout.count("smem") == 3, proc.stdout
