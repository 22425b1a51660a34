"""How one impl is called for one case: layout, the mode's closure, output checks."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from attnbench.case import Case
from attnbench.inputs import Inputs, from_layout, to_layout
from attnbench.registry import Impl


class BadOutput(RuntimeError):
    """The impl returned something that is not an attention output for this case."""


@dataclass
class Call:
    """Everything needed to run ``impl`` on ``case``; tensors already in the impl's layout."""
    impl: Impl
    case: Case
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    dout: torch.Tensor | None
    scale: float

    @classmethod
    def prepare(cls, impl: Impl, case: Case, inputs: Inputs) -> "Call":
        grad = case.backward
        q, k, v = (to_layout(t, impl.layout).requires_grad_(grad)
                   for t in (inputs.q, inputs.k, inputs.v))
        dout = to_layout(inputs.dout, impl.layout) if grad else None
        return cls(impl, case, q, k, v, dout, inputs.scale)

    def forward(self) -> torch.Tensor:
        return self.impl.fn(self.q, self.k, self.v, causal=self.case.causal, scale=self.scale)

    def grads(self, out: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # autograd.grad returns fresh grads instead of accumulating into .grad, so nothing
        # needs clearing between repetitions
        return torch.autograd.grad(out, (self.q, self.k, self.v), self.dout, retain_graph=True)

    def check(self) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """Run once (untimed); validate; return out (and dq, dk, dv) in canonical layout."""
        with torch.set_grad_enabled(self.case.backward):
            out = self.forward()
        c = self.case
        expected = (c.batch, c.heads, c.seq_q, c.head_dim)
        if not isinstance(out, torch.Tensor):
            raise BadOutput(f"returned {type(out).__name__}, expected a tensor")
        canon = from_layout(out, self.impl.layout)
        if tuple(canon.shape) != expected:
            raise BadOutput(f"out has shape {tuple(canon.shape)} in layout bhsd, "
                            f"expected {expected}")
        if out.dtype != c.torch_dtype:
            raise BadOutput(f"out has dtype {out.dtype}, expected {c.torch_dtype}")
        if out.device.type != c.device_type:
            raise BadOutput(f"out is on {out.device}, expected {c.device}")
        if not c.backward:
            return canon.detach(), None
        if not out.requires_grad:
            raise BadOutput("out does not require grad: the impl broke the autograd graph")
        grads = tuple(from_layout(g, self.impl.layout) for g in self.grads(out))
        return canon.detach(), grads

    def timed_fn(self) -> Callable[[], object]:
        """The work the mode times: fwd -> forward; bwd -> backward of a forward done here,
        outside the timed region; fwd_bwd -> both."""
        mode = self.case.mode
        if mode == "fwd":
            def fwd():
                with torch.no_grad():
                    return self.forward()
            return fwd
        if mode == "bwd":
            out = self.forward()
            return lambda: self.grads(out)
        return lambda: self.grads(self.forward())

    def memory_fn(self) -> Callable[[], object]:
        """The work whose peak memory is measured: the forward, or forward + backward in the
        backward modes (so the activations an impl saves for backward are counted)."""
        if self.case.mode == "fwd":
            return self.timed_fn()
        return lambda: self.grads(self.forward())
