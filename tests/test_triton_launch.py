"""``triton_flash``'s cached launch path (tuning.py): the key that decides when a compiled kernel
may be reused, and the path itself against a stand-in autotuner and kernel (no GPU here)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from attnbench.impls.triton_flash import kernel as tk  # noqa: E402
from attnbench.impls.triton_flash import tuning  # noqa: E402


def _key(B=2, H=4, Sq=80, Skv=80, D=64, dtype=torch.float16, causal=True, q=None):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, Sq, D, generator=g).to(dtype) if q is None else q
    k = v = torch.randn(B, H, Skv, D, generator=g).to(dtype)
    seqs = tk._Seqs(q, k)
    o = torch.empty_like(q)
    lse = torch.empty(seqs.lse_shape())
    args = tk.forward_args(q, k, v, o, lse, seqs, scale=0.125, offset=0)
    return tuning.launch_key("fwd", args, tk._consts(q, seqs, causal, False))


def test_launch_key_holds_what_the_compiled_kernel_depends_on():
    base = _key()
    assert _key() == base  # new tensors of the same kind: the same compiled kernel
    assert _key(Sq=96, Skv=96) == base  # same tuning key (128), both lengths divisible by 16
    assert _key(dtype=torch.bfloat16) != base  # dtype
    assert _key(causal=False) != base  # a constexpr
    assert _key(D=48) != base  # HEAD_DIM (a constexpr; HEAD_PAD stays 64)
    assert _key(Sq=72, Skv=72) != base  # 72 is no multiple of 16: Triton specializes on it
    assert _key(Sq=256, Skv=256) != base  # another tuning key (256)
    assert _key(B=1) != base  # an argument equal to 1
    storage = torch.randn(2 * 4 * 80 * 64 + 4).to(torch.float16)
    misaligned = storage[4:].view(2, 4, 80, 64)  # starts 8 bytes into its storage
    assert misaligned.data_ptr() % 16 and _key(q=misaligned) != base  # pointer alignment


class _FakeKernel:
    """A compiled kernel's launch surface: records what it is launched with."""

    function, packed_metadata = "fn", "packed"

    def __init__(self):
        self.launches = []

    def _init_handles(self):
        pass

    def run(self, *launch):
        self.launches.append(launch)

    def launch_metadata(self, grid, stream, *args):
        return "launch metadata"


class _FakeTuned:
    """The autotuner's surface: counts its calls, and its best config."""

    def __init__(self):
        self.calls = 0
        self.best_config = tuning._triton_config("fwd", (128, 64, 8, 2, True))

    def __getitem__(self, grid):
        def call(*args, **consts):
            self.calls += 1

        return call


class _FakeFn:
    def __init__(self, real, kernel):
        self.arg_names, self.kernel, self.warmed = real.arg_names, kernel, []

    def warmup(self, *args, grid, **kwargs):
        self.warmed.append(kwargs)
        return self.kernel


@pytest.mark.parametrize("path", tuning.LAUNCH_PATHS)
def test_the_cached_path_skips_the_autotuner_after_the_first_call(monkeypatch, path):
    kernel, tuned = _FakeKernel(), _FakeTuned()
    monkeypatch.setattr(tuning, "LAUNCH_PATH", path)
    monkeypatch.setattr(tuning, "_PREPARED", {})
    monkeypatch.setattr(tuning, "interpreting", lambda: False)
    monkeypatch.setattr(tuning, "_ensure_allocator", lambda: None)
    monkeypatch.setattr(tuning, "_tuned", lambda kind, family: tuned)
    monkeypatch.setattr(tuning, "arch", lambda: 90)
    monkeypatch.setattr(tuning, "_stream", lambda: 7)
    fake = _FakeFn(tuning._KERNELS["fwd"], kernel)
    monkeypatch.setitem(tuning._KERNELS, "fwd", fake)
    q = torch.randn(1, 2, 64, 64).half()
    seqs = tk._Seqs(q, q)
    args = tk.forward_args(q, q, q, q, torch.empty(1, 2, 64), seqs, scale=0.1, offset=0)
    consts = tk._consts(q, seqs, True, False)
    for _ in range(3):
        tuning.launch("fwd", lambda meta: (meta["BLOCK_M"] + 1,), args, consts)
    if path == "autotuner":
        assert tuned.calls == 3 and not kernel.launches
        return
    assert tuned.calls == 1 and len(kernel.launches) == 2  # then the compiled kernel, direct
    assert fake.warmed[0]["num_warps"] == 8 and fake.warmed[0]["ONE_LOOP"] is False
    grid0, grid1, grid2, stream, fn, packed, meta, *_hooks = kernel.launches[0][:9]
    assert (grid0, grid1, grid2, stream, fn, packed, meta) == (
        129,
        1,
        1,
        7,
        "fn",
        "packed",
        "launch metadata",
    )
    bound = kernel.launches[0][9:]
    assert len(bound) == len(fake.arg_names) and bound[: len(args)] == args
    named = dict(zip(fake.arg_names, bound))
    assert named["BLOCK_M"] == 128 and named["CAUSAL"] is True and named["PERSISTENT"] is True


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_triton_flash_cached_launch_matches_the_autotuner_path_on_the_gpu(monkeypatch):
    """On a GPU: the cached path launches Triton's compiled kernel itself (the launcher's
    argument list, the descriptor scratch) and gives the autotuner path's outputs: bit for bit
    where one program owns each element (out, dk, dv), within bf16 rounding for dq (fp32
    atomics add in any order); the second call per kernel takes the cached launch."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 300, 128, generator=g).to("cuda", torch.bfloat16)
               for _ in range(3))  # fmt: skip
    do = torch.randn(2, 4, 300, 128, generator=g).to("cuda", torch.bfloat16)

    def run():
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = tk.flash_attention(*leaves, causal=True)
        return [out, *torch.autograd.grad(out, leaves, do)]

    monkeypatch.setattr(tuning, "LAUNCH_PATH", "autotuner")
    want = run()
    monkeypatch.setattr(tuning, "LAUNCH_PATH", "cached")
    monkeypatch.setattr(tuning, "_PREPARED", {})
    first, second = run(), run()
    assert len(tuning._PREPARED) == 2  # the forward and the backward kernel, one key each
    for name, a, b, c in zip(("out", "dq", "dk", "dv"), want, first, second):
        if name == "dq":
            torch.testing.assert_close(b, a)
            torch.testing.assert_close(c, a)
        else:
            assert torch.equal(a, b) and torch.equal(a, c), name
