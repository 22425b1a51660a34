"""Checks that need a CUDA GPU (marked `gpu`: skipped without one; run by scripts/gpu_check.sh)."""

import pytest
import torch

from attnbench.case import Case
from attnbench.measure import ceilings
from attnbench.measure.memory import peak_mem_mib
from attnbench.measure.profiling import profile_fn
from attnbench.measure.timing import TimerConfig, time_fn
from attnbench.run.measuring.call import Call
from attnbench.run.measuring.inputs import make_inputs
from attnbench.run.measuring.row import Settings
from attnbench.testing import run_row

pytestmark = pytest.mark.gpu
GPU_IMPLS = ["naive", "sdpa", "tiled", "triton_flash", "xformers"]


def cuda_case(**kw):
    base = dict(
        batch=2,
        heads=8,
        kv_heads=8,
        seq_q=1024,
        seq_kv=1024,
        head_dim=64,
        dtype="bfloat16",
        device="cuda",
    )
    return Case(**{**base, **kw})


@pytest.mark.parametrize("name", GPU_IMPLS)
@pytest.mark.parametrize(
    "case",
    [
        cuda_case(),
        cuda_case(causal=True, mode="fwd_bwd"),
        cuda_case(kv_heads=2, seq_q=777, seq_kv=1500, causal=True, mode="fwd_bwd", dtype="float16"),
    ],
    ids=Case.label,
)
def test_every_gpu_impl_agrees_or_says_why_not(impls, name, case):
    impl = impls[name]
    if not impl.available:
        pytest.skip(impl.unavailable)
    row = run_row(impl, case, settings=Settings(TimerConfig(rep_ms=20)))
    assert row["status"] in ("ok", "unsupported"), row["reason"]
    if row["status"] == "ok":
        assert row["agrees"] is True, row["reason"]
        assert 5 <= row["samples"] <= TimerConfig().max_samples


def test_our_timer_agrees_with_do_bench_and_keeps_its_sample_bounds():
    do_bench = pytest.importorskip("triton.testing").do_bench
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    cfg = TimerConfig(rep_ms=50)
    ours = time_fn(lambda: a @ a, "cuda", cfg)
    theirs = float(do_bench(lambda: a @ a, warmup=25, rep=50, return_mode="median"))
    assert abs(ours.median_ms - theirs) / theirs < 0.2, (ours.median_ms, theirs)
    assert cfg.min_samples <= len(ours.samples_ms) <= cfg.max_samples
    tiny = torch.ones(8, device="cuda")
    fast = time_fn(lambda: tiny + 1, "cuda", TimerConfig(rep_ms=1000))
    assert len(fast.samples_ms) == cfg.max_samples  # fast calls are capped, never 201


def test_memory_growth_on_the_gpu(impls):
    def growth_ratio(name):
        peaks = []
        for s in (1024, 2048, 4096):
            case = cuda_case(seq_q=s, seq_kv=s)
            call = Call.prepare(impls[name], case, make_inputs(case, 0))
            peaks.append(peak_mem_mib(call.memory_fn(), "cuda"))
        return (peaks[2] - peaks[1]) / (peaks[1] - peaks[0])

    assert 3.5 < growth_ratio("naive") < 4.5
    assert 1.5 < growth_ratio("sdpa") < 2.5


def test_ceilings_and_profile_on_the_gpu():
    c = ceilings.measure(["bfloat16", "float32"], "cuda", quick=True)
    assert c["matmul_tflops"]["bfloat16"] > c["matmul_tflops"]["float32"] > 0
    assert c["copy_gb_s"] > 0
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    prof = profile_fn(lambda: a @ a, "cuda")
    assert prof.kernels and prof.device_ms_per_call > 0
    assert abs(sum(k["share"] for k in prof.kernels) - 1) < 1e-6


def test_a_large_tensor_drawn_in_pieces_on_cuda_is_the_cpus_draw(monkeypatch):
    """draw_large fills a CUDA tensor from several host threads at once: the same numbers as
    the CPU case's draw, cast alike (every device sees the same inputs)."""
    from attnbench.run.measuring import inputs as inputs_module

    monkeypatch.setattr(inputs_module, "DRAW_WHOLE", 1024)
    monkeypatch.setattr(inputs_module, "DRAW_THREADS", 4)
    gpu = make_inputs(cuda_case(batch=6, seq_q=8, seq_kv=256, head_dim=64, mode="bwd"), 3)
    cpu = make_inputs(
        cuda_case(batch=6, seq_q=8, seq_kv=256, head_dim=64, mode="bwd", device="cpu"), 3
    )
    for name in ("q", "k", "v", "dout"):
        assert torch.equal(getattr(gpu, name).cpu(), getattr(cpu, name)), name
