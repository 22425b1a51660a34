"""pytest-benchmark suite: every registered impl on a few representative cases, for
regression tracking (README: "Regression tracking with pytest-benchmark").

Each benchmark times the mode's work (fwd, or forward + backward) on inputs prepared outside
the timing, after one untimed call (torch.compile, autotuning). On CUDA the timed callable ends
with torch.cuda.synchronize(), so a sample is the kernel's work, not its launch. An impl that
cannot take a case is skipped with the registry's reason (or the library's, at call time).
The sweep (scripts/sweep.py) is the tool for accuracy, memory and scaling; this suite only
answers "did it get slower?".
"""

import pytest
import torch

from attnbench import plugins
from attnbench.case import Case
from attnbench.registry import Unsupported
from attnbench.run.measuring.call import Call
from attnbench.run.measuring.inputs import make_inputs

SEED = 0
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CASES = {
    # tiny, for CI; the shapes of tests/test_compiled.py
    "cpu": [
        Case(batch=2, heads=4, kv_heads=2, seq_q=80, seq_kv=72, head_dim=16, causal=True),
        Case(
            batch=2,
            heads=4,
            kv_heads=2,
            seq_q=80,
            seq_kv=72,
            head_dim=16,
            causal=True,
            mask="padding",
            mode="fwd_bwd",
        ),
    ],
    "cuda": [
        Case(
            batch=2,
            heads=16,
            kv_heads=16,
            seq_q=4096,
            seq_kv=4096,
            head_dim=128,
            dtype="bfloat16",
            causal=True,
            device="cuda",
            mode=mode,
        )
        for mode in ("fwd", "fwd_bwd")
    ]
    + [
        Case(
            batch=2,
            heads=16,
            kv_heads=4,
            seq_q=4096,
            seq_kv=4096,
            head_dim=128,
            dtype="bfloat16",
            causal=True,
            device="cuda",
            mask="padding",
        ),
        Case(
            batch=2,
            heads=16,
            kv_heads=16,
            seq_q=4096,
            seq_kv=4096,
            head_dim=128,
            dtype="bfloat16",
            causal=True,
            device="cuda",
            level="layer",
            mode="fwd_bwd",
        ),
    ],
}
IMPLS = plugins.discover()


COMPILE_ON_CPU = (  # the test run's check that each benchmark runs; measuring runs it
    "not measured (--benchmark-disable): compiling its graph takes 4-16 s on a CPU; "
    "--benchmark-enable runs it"
)


def synchronized(fn, device_type: str):
    """``fn`` ending with a device synchronisation on CUDA (pytest-benchmark's clock is the
    host's)."""
    if device_type != "cuda":
        return fn

    def run():
        fn()
        torch.cuda.synchronize()

    return run


@pytest.mark.parametrize("case", CASES[DEVICE], ids=Case.label)
@pytest.mark.parametrize("name", list(IMPLS))
def test_attention(benchmark, name, case):
    impl = IMPLS[name]
    reasons = impl.reasons(case)
    if reasons:
        pytest.skip("; ".join(reasons))
    if benchmark.disabled and impl.compiled and case.device_type == "cpu":
        pytest.skip(COMPILE_ON_CPU)
    call = Call.prepare(impl, case, make_inputs(case, SEED))
    try:
        call.check()  # untimed first call: compiles, autotunes, or refuses
    except Unsupported as exc:
        pytest.skip(str(exc))
    benchmark.group = case.label()
    layout = case.kind.layout(case, SEED)
    benchmark.extra_info.update(case.columns(), flops=case.flops(layout))
    benchmark(synchronized(call.timed_fn(), case.device_type))
