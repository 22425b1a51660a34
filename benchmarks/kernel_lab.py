"""The kernel lab: every variant of ``triton_flash``'s kernels (``tuning.LAB``) in one call.

A lease is short and may land on an H100 or an H200, so one call answers the kernels'
questions with its own controls beside them: timings compare only inside one call.

1. **compile**: every (variant, case) the timing pass will call (each batch size and causal
   flag is a Triton specialization of its own) runs once in its own process, many at once,
   sharing Triton's on-disk cache (the timing pass then finds them there), synchronized so that
   a kernel that faults or hangs does so there; a job with no answer within ``--timeout-s`` is
   killed and its row is ``hang``, one that raised or whose process died is ``failed``, each
   with the reason, and is left out of timing. Each reports the compiled kernel's registers,
   spilled bytes, shared memory and warps as launched (12 where warp specialization took).
2. **check**: per case, the float64 reference (out, and dq, dk, dv for the backward) and its
   magnitudes; each variant's output is judged by the harness's rule (``measure.agreement``),
   its LSE to within one unit roundoff of the case's dtype (an LSE off by u scales every
   probability by 1 +- u: one rounding of the output).
3. **time**: per case each variant that agrees (forward alone, or backward alone after the
   default forward, untimed: when that forward fails, the backward variants' rows say so and
   the controls still run), then the controls (``--controls``, through the harness's ``Call``,
   the same mode), with the harness's timer; the warp-specialized variants after every other
   row. A row still running after ``--timeout-s`` is ``hang``: a hung kernel holds the GPU, so
   the rows after it are written ``skipped`` with the reason, the table too, and the call ends.

Each row is one JSON line in ``OUT/kernel_lab.jsonl`` as soon as it is known; the Markdown
table goes to ``OUT/kernel_lab.md`` and stdout at the end. ``--budget-s``: rows not started
in time are written as ``skipped`` with the reason. One variant's failure (compile, launch,
hang, disagreement) costs its rows only.

    python benchmarks/kernel_lab.py [--kinds fwd,bwd] [--variants today,fwd:ws,bwd:dq_tma]
        [--extra 'fwd:try=(128,128,4,3,False,(("ONE_LOOP",True),("WS",True)))']
        [--seq-len 1024,4096,16384] [--tokens 16384] [--heads 16] [--head-dim 128]
        [--controls sdpa_cudnn,sdpa_flash,triton_flash_fa2] [--budget-s 420] [--out DIR]
    python benchmarks/kernel_lab.py --dry-run --out DIR

``--dry-run`` runs on the CPU in Triton's interpreter: tiny shapes, tiles shrunk to 16, the
variants fwd:ws and bwd:dq_tma, the control ``sdpa``; it checks the lab itself, not speed.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from kernel_lab_check import Truth, check, timed  # noqa: E402
from kernel_lab_jobs import Watchdog, run_jobs  # noqa: E402
from kernel_lab_table import Lab  # noqa: E402

DRY = dict(tokens=64, heads=2, head_dim=32, seq_len="32", controls="sdpa",
           variants="fwd:ws,bwd:dq_tma", dtype="float16")  # fmt: skip
RACE = dict(tokens=16384, heads=16, head_dim=128, seq_len="1024,4096,16384", variants="",
            controls="sdpa_cudnn,sdpa_flash,triton_flash_fa2", dtype="bfloat16")  # fmt: skip


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="CPU, interpreter, tiny shapes")
    p.add_argument("--kinds", default="fwd,bwd")
    p.add_argument("--variants", default=None, help="names or kind:name (default: all)")
    p.add_argument("--extra", action="append", default=[], help="kind:name=CONFIG_TUPLE")
    p.add_argument("--seq-len", default=None)
    p.add_argument("--tokens", type=int, default=None, help="batch = tokens / N")
    p.add_argument("--heads", type=int, default=None)
    p.add_argument("--head-dim", type=int, default=None)
    p.add_argument("--causal", default="false,true")
    p.add_argument("--controls", default=None, help="registered impls timed in the same call")
    p.add_argument("--budget-s", type=float, default=420.0)
    p.add_argument("--rep-ms", type=float, default=100.0, help="the timer's time per row")
    p.add_argument(
        "--jobs",
        type=int,
        default=min(12, os.cpu_count() or 1),
        help="compile processes at once (default: the host's cores, at most 12)",
    )
    p.add_argument(
        "--timeout-s",
        type=float,
        default=120.0,
        help="per compile job and per timed row: past it, the row is a hang",
    )
    p.add_argument("--out", type=Path, default=Path("results/kernel_lab"))
    a = p.parse_args(argv)
    for key, value in (DRY if a.dry_run else RACE).items():
        if getattr(a, key, None) is None:
            setattr(a, key, value)
    a.dtype = (DRY if a.dry_run else RACE)["dtype"]
    return a


def variants(args) -> list[tuple[str, str, tuple]]:
    """(kind, name, config tuple) of the variants asked for; ValueError names a bad one."""
    from attnbench.impls.triton_flash import tuning

    kinds = args.kinds.split(",")
    chosen = [v for v in (args.variants or "").split(",") if v]
    out = [(k, n, c) for k in kinds for n, c in tuning.LAB[k].items()
           if not chosen or n in chosen or f"{k}:{n}" in chosen]  # fmt: skip
    every = tuning.LAB.items()  # a name of a kind not asked for is no error, only left out
    known = {n for _, v in every for n in v} | {f"{k}:{n}" for k, v in every for n in v}
    unknown = [v for v in chosen if v not in known]
    if unknown:
        raise ValueError(
            f"unknown variant(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})"
        )
    if args.dry_run:  # the interpreter: the lab's tiles shrunk to 16 rows (--extra's as given)
        out = [(k, n, (16, 16, *c[2:])) for k, n, c in out]
    for spec in args.extra:
        head, _, text = spec.partition("=")
        kind, _, name = head.partition(":")
        if kind not in ("fwd", "bwd") or not name or not text:
            raise ValueError(f"--extra {spec!r}: write kind:name=CONFIG_TUPLE (kind fwd or bwd)")
        try:
            cfg = ast.literal_eval(text)
            tuning.meta_of(kind, cfg)
        except (ValueError, SyntaxError, TypeError, IndexError) as exc:
            raise ValueError(f"--extra {spec!r}: {exc}") from None
        out.append((kind, name, cfg))
    return out


def cases(args) -> list:
    from attnbench.case import Case

    device = "cpu" if args.dry_run else "cuda"
    return [
        Case(
            max(1, args.tokens // n),
            args.heads,
            args.heads,
            n,
            n,
            args.head_dim,
            dtype=args.dtype,
            causal=causal,
            mode="fwd",
            device=device,
        )  # fmt: skip
        for causal in (c.strip() == "true" for c in args.causal.split(","))
        for n in (int(s) for s in args.seq_len.split(","))
    ]


# ---------------------------------------------------------------------------------- compile


def _compiled_facts(kind: str) -> dict:
    """Registers, spills, shared memory and warps of the kernel this process compiled."""
    from attnbench.impls.triton_flash import compile_report, tuning

    fn = tuning._KERNELS[kind]
    caches = getattr(fn, "device_caches", None)
    if caches is None:
        return {"compile_note": "interpreted: nothing compiled"}
    kernels = [k for cache in caches.values() for k in cache[0].values()]
    if not kernels:
        return {"compile_note": "no compiled kernel found"}
    k = kernels[-1]
    k._init_handles()
    return dict(regs=k.n_regs, spill_bytes=k.n_spills, smem=k.metadata.shared,
                warps=compile_report.launched_warps(k.asm["ptx"]))  # fmt: skip


def compile_job(kind: str, cfg: tuple, case_fields: dict) -> dict:
    """In a fresh process: one call of the variant at one case (which compiles that
    specialization into Triton's on-disk cache), synchronized so that a kernel that hangs or
    faults does so here, then its facts."""
    try:
        import torch

        from attnbench.case import Case

        case = Case(**case_fields)
        run_variant(kind, cfg, case, _inputs(case))
        if case.device == "cuda":
            torch.cuda.synchronize()
        return _compiled_facts(kind)
    except Exception as exc:  # noqa: BLE001 - a failed compile is the variant's row
        return {"error": _failed(exc)["reason"]}


def compile_all(todo, all_cases, args, deadline: float) -> dict:
    """(kind, name, case label) -> facts, or {"error"/"hang"/"skipped": reason}: every
    specialization the timing pass will call (each case: its batch size and causal flag are
    Triton specializations of their own), compiled in parallel processes, each bounded by
    ``--timeout-s``."""
    from dataclasses import asdict

    jobs = {(k, n, c.label()): (k, cfg, asdict(c)) for k, n, cfg in todo for c in all_cases}
    return run_jobs(compile_job, jobs, args.jobs, args.timeout_s, deadline, prepare_job)


def prepare_job() -> None:
    """A compile job's start-up, before its clock starts: the imports every job shares and
    the device's context."""
    import torch

    from attnbench.impls.triton_flash import kernel  # noqa: F401 - imports triton
    from attnbench.run.measuring import inputs  # noqa: F401

    if torch.cuda.is_available():
        torch.cuda.init()


# ---------------------------------------------------------------------------- check, time


def _inputs(case):
    """The harness's seeded inputs, dout included (drawn for a backward mode)."""
    from dataclasses import replace

    from attnbench.run.measuring.inputs import make_inputs

    return make_inputs(replace(case, mode="fwd_bwd"), 0)


def run_variant(kind: str, cfg: tuple, case, inputs, forward=None):
    """The variant's call: fwd -> (out, lse); bwd -> (dq, dk, dv) after ``forward``
    ((out, lse), computed here with the default config when not given)."""
    from attnbench.impls.triton_flash import kernel as tk

    q, k, v = inputs.q, inputs.k, inputs.v
    common = dict(causal=case.causal, scale=inputs.scale)
    if kind == "fwd":
        return tk.forward(q, k, v, **common, config=cfg)
    o, lse = forward or default_forward(case, inputs)
    return tk.backward(inputs.dout, q, k, v, o, lse, **common, config=cfg)


def default_forward(case, inputs):
    """(out, lse) of the kernel's default forward config: the backward variants' input."""
    from attnbench.impls.triton_flash import kernel as tk
    from attnbench.impls.triton_flash import tuning

    tiles = tuning.INTERPRET_TILES if tuning.interpreting() else None
    return tk.forward(inputs.q, inputs.k, inputs.v, causal=case.causal, scale=inputs.scale,
                      tiles=tiles)  # fmt: skip


# --------------------------------------------------------------------------------- rows


def warp_specialized(cfg) -> bool:
    return cfg is not None and ("WS", True) in (cfg[-1] if isinstance(cfg[-1], tuple) else ())


def plan(todo, controls, kinds, all_cases) -> list[tuple]:
    """The timing pass's rows in order, (case, kind, name, cfg; None for a control): per case
    the variants, then the controls; the warp-specialized variants after every other row of
    every case, so that a hang the compile phase did not catch can cost only their rows."""
    first, last = [], []
    for c in all_cases:
        first += [(c, k, n, cfg) for k, n, cfg in todo if not warp_specialized(cfg)]
        first += [(c, k, n, None) for k in kinds for n in controls]
        last += [(c, k, n, cfg) for k, n, cfg in todo if warp_specialized(cfg)]
    return first + last


class CaseState:
    """One case's inputs, its float64 truth per kind, and the default forward (the backward
    variants' input), each made when first needed; the forward's failure is kept, not raised."""

    def __init__(self, case):
        self.case, self.inputs, self.truths, self._forward = case, _inputs(case), {}, None

    def truth(self, kind: str) -> Truth:
        if kind not in self.truths:
            dout = self.inputs.dout if kind == "bwd" else None
            self.truths[kind] = Truth(self.case, self.inputs, dout)
        return self.truths[kind]

    def forward(self):
        """(out, lse), or the row fields that say why the default forward failed."""
        if self._forward is None:
            try:
                self._forward = default_forward(self.case, self.inputs)
            except Exception as exc:  # noqa: BLE001 - it costs the backward variants' rows
                why = _failed(exc)["reason"]
                self._forward = dict(status="failed", reason=f"the default forward failed: {why}")
        return self._forward


def run(args, todo, impls, controls) -> int:
    import torch

    lab = Lab(args)
    all_cases = cases(args)
    kinds = args.kinds.split(",")
    device_name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    facts = compile_all(todo, all_cases, args, lab.t0 + args.budget_s) if todo else {}
    rows = plan(todo, controls, kinds, all_cases)
    watchdog = Watchdog(args.timeout_s, lambda r, rest: _hung(lab, r, rest, device_name, controls))
    state = None
    for i, (case, kind, name, cfg) in enumerate(rows):
        row = dict(case=_label(case, kind), kind=kind, variant=name, device=device_name)
        if cfg is not None:
            row.update(config=str(cfg), **facts.get((kind, name, case.label()), {}))
        if lab.left_s() <= 0:
            row.update(status="skipped", reason=f"budget of {args.budget_s:g} s spent")
        elif _phase_verdict(row):
            pass
        else:
            state = state if state is not None and state.case is case else CaseState(case)
            with watchdog.watching(row, rows[i + 1 :]):
                if cfg is None:
                    row.update(_control(impls[name], case, kind, state.inputs, args))
                else:
                    row.update(_measure(kind, cfg, state, args))
        lab.write(row)
    lab.finish(device_name, controls)
    return 0


def _phase_verdict(row: dict) -> bool:
    """The compile phase's verdict on a variant's row, if it has one (the row is then not
    timed): failed (it raised, or its process died), hang, skipped (the budget)."""
    for key, status, prefix in (("error", "failed", "compile: "), ("hang", "hang", "compile: "),
                                ("skipped", "skipped", "")):  # fmt: skip
        if key in row:
            row.update(status=status, reason=prefix + row.pop(key))
            return True
    return False


def _hung(lab, row, rest, device_name, controls) -> None:
    """The watchdog's end of the call: the hung row, the rows after it as skipped (a hung
    kernel holds the GPU), the table; then the process ends at once. It holds the lab's lock
    throughout: the timing pass writes nothing more."""
    why = f"no result within {lab.args.timeout_s:g} s; the lab stopped"
    with lab.lock:
        lab.write({**row, "status": "hang", "reason": why})
        for case, kind, name, _ in rest:
            lab.write(dict(case=_label(case, kind), kind=kind, variant=name, device=device_name,
                           status="skipped", reason=f"{row['variant']} hung before it "
                           f"({row['case']})"))  # fmt: skip
        lab.finish(device_name, controls)
        os._exit(0)


def _label(case, kind: str) -> str:
    from dataclasses import replace

    return replace(case, mode=kind).label()


def _measure(kind, cfg, state: CaseState, args) -> dict:
    case, inputs, forward = state.case, state.inputs, None
    if kind == "bwd":
        forward = state.forward()
        if isinstance(forward, dict):  # the default forward failed: no input to run on
            return forward
    try:
        got = run_variant(kind, cfg, case, inputs, forward)
        bad = check(kind, got, state.truth(kind), case.torch_dtype)
        if bad:
            return dict(status="disagrees", reason="; ".join(bad)[:400])
        return timed(lambda: run_variant(kind, cfg, case, inputs, forward), case, args.rep_ms,
                     kind)  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - one variant's failure is its row
        return _failed(exc)


def _control(impl, case, kind, inputs, args) -> dict:
    from dataclasses import replace

    from attnbench.run.measuring.call import Call

    c = replace(case, mode=kind)
    why = "; ".join(impl.reasons(c))
    if why:
        return dict(status="unsupported", reason=why[:300])
    try:
        call = Call.prepare(impl, c, inputs)
        call.check()
        return timed(call.timed_fn(), c, args.rep_ms, kind)
    except Exception as exc:  # noqa: BLE001 - one control's failure is its row
        return _failed(exc)


def _failed(exc: Exception) -> dict:
    return dict(status="failed", reason=f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")


def main(argv=None) -> int:
    args = _args(argv)
    if args.dry_run:
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            print("kernel_lab.py: --dry-run needs TRITON_INTERPRET=1 before triton's import",
                  file=sys.stderr)  # fmt: skip
            return 2
        os.environ["TRITON_INTERPRET"] = "1"  # the compile processes inherit it
    else:
        import torch

        if not torch.cuda.is_available():
            print("kernel_lab.py: needs a CUDA GPU (none is visible to torch); "
                  "--dry-run checks the lab on the CPU", file=sys.stderr)  # fmt: skip
            return 2
    from attnbench import plugins

    impls = plugins.discover()
    controls = [c for c in args.controls.split(",") if c]
    try:
        todo = variants(args)
        unknown = [c for c in controls if c not in impls]
        if unknown:
            raise ValueError(f"unknown control impl(s) {', '.join(unknown)}; --controls takes "
                             "registered impls (attnbench list)")  # fmt: skip
    except ValueError as exc:
        print(f"kernel_lab.py: {exc}", file=sys.stderr)
        return 2
    return run(args, todo, impls, controls)


if __name__ == "__main__":
    sys.exit(main())
