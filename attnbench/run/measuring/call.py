"""How one impl is called for one case: layout, the mode's closure, output checks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnbench.case import Case
from attnbench.errors import AttnbenchError
from attnbench.heads import computed_by, same
from attnbench.masks import Mask
from attnbench.registry import Impl
from attnbench.run.measuring.inputs import Inputs, from_layout, paged, to_layout
from attnbench.run.measuring.layer import WEIGHTS, Parts, layer_forward
from attnbench.run.measuring.layer_module import Hosted, host


class BadOutput(AttnbenchError, RuntimeError):
    """The impl returned something that is not an attention output for this case."""


@dataclass
class Call:
    """Everything needed to run ``impl`` on ``case``; tensors already in the impl's layout.
    Level op: the leaves are q, k, v; level layer: x and the projection weights (a module
    impl's: x and its parameters)."""

    impl: Impl
    case: Case
    leaves: tuple[torch.Tensor, ...]  # (q, k, v) or (x, wq, wk, wv, wo); grads are theirs
    dout: torch.Tensor | None
    scale: float
    mask: Mask
    block_table: torch.Tensor | None = None  # (B, pages per sequence), paged impls only
    hosted: Hosted | None = None  # a module impl's module, hosted
    # level op, an impl of the other head order (heads.py): per canonical query head the
    # impl's head computing it (its q and dout handed in that order); None: the same order
    heads: torch.Tensor | None = None
    # gradients by out.backward() into the leaves' .grad, as users take them: an impl whose
    # reentrant checkpointing (use_reentrant=True) refuses torch.autograd.grad
    via_backward: bool = False

    @classmethod
    def prepare(cls, impl: Impl, case: Case, inputs: Inputs) -> Call:
        grad = case.backward
        if case.level == "layer" and impl.module:  # its own module, the seeded weights loaded
            mask = inputs.mask.fresh()
            made = host(impl.fn(case, mask), case, inputs, impl.head_order, grad)
            x = inputs.x.detach().requires_grad_(grad)
            leaves = (x, *made.params)
            return cls(impl, case, leaves, inputs.dout, inputs.scale, mask, None, made)
        if case.level == "layer":  # the layer converts layouts itself, inside the timing
            leaves = tuple(t.detach().requires_grad_(grad) for t in (inputs.x, *inputs.weights))
            return cls(impl, case, leaves, inputs.dout, inputs.scale, inputs.mask.fresh())
        heads = computed_by(case.heads, case.kv_heads, impl.head_order)
        q, dout = inputs.q, inputs.dout
        if heads is not None:  # outside the timing: q (and dout) in the impl's head order
            order = heads.argsort().to(q.device)
            q, dout = q[:, order], None if dout is None else dout[:, order]
        if impl.paged:  # fwd only (registry): k, v become page pools, outside the timing
            pages = {"page_tokens": impl.page_tokens} if impl.page_tokens else {}
            k_pool, v_pool, table = paged(inputs.k, inputs.v, inputs.seed, **pages)
            leaves = (to_layout(q, impl.layout), k_pool, v_pool)
            mask = inputs.mask.fresh()
            return cls(impl, case, leaves, None, inputs.scale, mask, table, heads=heads)
        leaves = tuple(
            to_layout(t, impl.layout).requires_grad_(grad) for t in (q, inputs.k, inputs.v)
        )
        dout = to_layout(dout, impl.output_layout) if grad else None
        return cls(impl, case, leaves, dout, inputs.scale, inputs.mask.fresh(), heads=heads)

    @property
    def parts(self) -> Parts | None:
        """Level layer: what the layer has beyond the plain block (run/measuring/layer.py), which
        its reference must model; None: the plain block (or level op)."""
        if self.hosted is not None:
            return self.hosted.parts
        c, order = self.case, self.impl.head_order
        plain = c.level == "op" or same(c.heads, c.kv_heads, order)
        return None if plain else Parts(head_order=order)

    def path_note(self) -> str | None:
        """A hosted module's note on the path its timed work ran (layer_module.Hosted)."""
        if self.hosted is None:
            return None
        return self.hosted.path_note(self.memory_fn(), self.case.device_type)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The impl's core attention, in its layout; ``mask=`` only for impls that take it,
        ``block_table=`` only for paged ones."""
        extra = {"mask": self.mask} if self.impl.takes_mask else {}
        if self.impl.paged:
            extra.update(block_table=self.block_table, seq_kv=self.case.seq_kv)
        return self.impl.fn(q, k, v, causal=self.case.causal, scale=self.scale, **extra)

    def forward(self) -> torch.Tensor:
        if self.hosted is not None:
            return self.hosted.forward(self.leaves[0])
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
        # needs clearing between repetitions; the first call (the untimed check) finds out
        # whether the impl refuses it
        if not self.via_backward:
            try:
                return torch.autograd.grad(out, self.leaves, self.dout, retain_graph=True)
            except RuntimeError as exc:
                if "not have been used in the graph" in str(exc):
                    raise BadOutput(self._unused(out)) from None
                if "use_reentrant=True" not in str(exc):
                    raise
                self.via_backward = True
        for leaf in self.leaves:  # cleared, not accumulated across repetitions
            leaf.grad = None
        out.backward(self.dout, retain_graph=True)
        return tuple(leaf.grad for leaf in self.leaves)

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
        canon = out if layer else self._canonical(from_layout(out, self.impl.output_layout))
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
            dq, dk, dv = (from_layout(g, self.impl.layout) for g in grads)
            grads = (self._canonical(dq), dk, dv)
        elif self.hosted is not None:  # dwq, ... and the extras', sliced from its parameters'
            grads = (grads[0], *self.hosted.checked(grads[1:]))
        return canon.detach(), grads

    def _unused(self, out: torch.Tensor) -> str:
        """Which inputs ``out`` does not depend on (a declared bias its forward skips), named."""
        grads = torch.autograd.grad(
            out, self.leaves, self.dout, retain_graph=True, allow_unused=True
        )
        if self.hosted is not None:
            names = {id(p): n for n, p in self.hosted.module.named_parameters()}
            leaves = ["x", *(names.get(id(p), "a parameter") for p in self.leaves[1:])]
        else:
            leaves = ["q", "k", "v"] if self.case.level == "op" else ["x", *WEIGHTS]
        unused = [n for n, g in zip(leaves, grads) if g is None]
        return (
            f"out does not depend on {', '.join(unused)}: its forward never uses "
            f"{'them' if len(unused) > 1 else 'it'}, so there is no gradient to check; use it "
            f"in forward, or leave it out of the module (its layout declares every parameter)"
        )

    def _canonical(self, t: torch.Tensor) -> torch.Tensor:
        """Level op: out or dq (B, Hq, S, D) back in the canonical head order."""
        return t if self.heads is None else t[:, self.heads.to(t.device)]

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
