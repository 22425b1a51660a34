"""How one impl is called for one case: layout, the mode's closure, output checks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnbench.case import Case
from attnbench.errors import AttnbenchError
from attnbench.masks import Mask
from attnbench.registry import Impl
from attnbench.run.inputs import Inputs, from_layout, paged, to_layout
from attnbench.run.layer import layer_forward
from attnbench.run.layer_module import host


class BadOutput(AttnbenchError, RuntimeError):
    """The impl returned something that is not an attention output for this case."""


@dataclass
class Call:
    """Everything needed to run ``impl`` on ``case``; tensors already in the impl's layout.
    Level op: the leaves are q, k, v; level layer: x and the projection weights."""

    impl: Impl
    case: Case
    leaves: tuple[torch.Tensor, ...]  # (q, k, v) or (x, wq, wk, wv, wo); grads are theirs
    dout: torch.Tensor | None
    scale: float
    mask: Mask
    block_table: torch.Tensor | None = None  # (B, pages per sequence), paged impls only
    hosted: Callable | None = None  # a module impl's x (B, S, d_model) -> (B, S, d_model)

    @classmethod
    def prepare(cls, impl: Impl, case: Case, inputs: Inputs) -> Call:
        grad = case.backward
        if case.level == "layer" and impl.module:  # its own module, the seeded weights loaded
            mask = inputs.mask.fresh()
            made = host(impl.fn(case, mask), inputs.weights, grad)
            x = inputs.x.detach().requires_grad_(grad)
            return cls(
                impl, case, (x, *made.weights), inputs.dout, inputs.scale, mask, None, made.forward
            )
        if case.level == "layer":  # the layer converts layouts itself, inside the timing
            leaves = tuple(t.detach().requires_grad_(grad) for t in (inputs.x, *inputs.weights))
            return cls(impl, case, leaves, inputs.dout, inputs.scale, inputs.mask.fresh())
        if impl.paged:  # fwd only (registry): k, v become page pools, outside the timing
            pages = {"page_tokens": impl.page_tokens} if impl.page_tokens else {}
            k_pool, v_pool, table = paged(inputs.k, inputs.v, inputs.seed, **pages)
            leaves = (to_layout(inputs.q, impl.layout), k_pool, v_pool)
            return cls(impl, case, leaves, None, inputs.scale, inputs.mask.fresh(), table)
        leaves = tuple(
            to_layout(t, impl.layout).requires_grad_(grad) for t in (inputs.q, inputs.k, inputs.v)
        )
        dout = to_layout(inputs.dout, impl.output_layout) if grad else None
        return cls(impl, case, leaves, dout, inputs.scale, inputs.mask.fresh())

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The impl's core attention, in its layout; ``mask=`` only for impls that take it,
        ``block_table=`` only for paged ones."""
        extra = {"mask": self.mask} if self.impl.takes_mask else {}
        if self.impl.paged:
            extra.update(block_table=self.block_table, seq_kv=self.case.seq_kv)
        return self.impl.fn(q, k, v, causal=self.case.causal, scale=self.scale, **extra)

    def forward(self) -> torch.Tensor:
        if self.hosted is not None:
            return self.hosted(self.leaves[0])
        if self.case.level == "layer":
            return layer_forward(
                self.leaves[0],
                self.leaves[1:],
                self.attend,
                self.case.heads,
                self.case.kv_heads,
                self.impl.layout,
                self.impl.output_layout,
            )
        return self.attend(*self.leaves)

    def grads(self, out: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # autograd.grad returns fresh grads instead of accumulating into .grad, so nothing
        # needs clearing between repetitions
        return torch.autograd.grad(out, self.leaves, self.dout, retain_graph=True)

    def check(self) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """Run once (untimed); validate; return out (and its grads: dq, dk, dv; or dx, dwq,
        dwk, dwv, dwo) in canonical layout."""
        with torch.set_grad_enabled(self.case.backward):
            out = self.forward()
        c = self.case
        layer = c.level == "layer"
        expected = (
            (c.batch, c.seq_q, c.d_model) if layer else (c.batch, c.heads, c.seq_q, c.head_dim)
        )
        if not isinstance(out, torch.Tensor):
            raise BadOutput(f"returned {type(out).__name__}, expected a tensor")
        canon = out if layer else from_layout(out, self.impl.output_layout)
        if tuple(canon.shape) != expected:
            raise BadOutput(
                f"out has shape {tuple(canon.shape)} in layout "
                f"{'(B, S, d_model)' if layer else 'bhsd'}, expected {expected}"
            )
        if out.dtype != c.torch_dtype:
            raise BadOutput(f"out has dtype {out.dtype}, expected {c.torch_dtype}")
        if out.device.type != c.device_type:
            raise BadOutput(f"out is on {out.device}, expected {c.device}")
        if not c.backward:
            return canon.detach(), None
        if not out.requires_grad:
            raise BadOutput("out does not require grad: the impl broke the autograd graph")
        grads = self.grads(out)
        if not layer:
            grads = tuple(from_layout(g, self.impl.layout) for g in grads)  # of q, k, v
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
