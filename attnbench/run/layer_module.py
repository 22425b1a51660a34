"""Level ``layer`` around a model's own attention module (an impl registered ``module=True``).

The impl is a factory ``(case, mask) -> LayerModule``: the module, built in the case's dtype and
on its device, its four projection weights (q, k, v, o: (out_features, in_features), nn.Linear's
convention) and a call x (B, S, d_model) -> (B, S, d_model) that hands the module whatever else
it needs (position embeddings, attention mask). ``host`` checks that the module's learned
parts are those four weights and nothing else (a bias, a norm, a fused qkv weight: the float64
reference of run/layer.py cannot model them, so the row is ``unsupported`` with a reason),
loads the case's seeded weights (run/inputs.py) into them, the same numbers every impl gets,
and puts the module in eval mode (no dropout). The reference is then ``layer_reference`` on
those weights, shared with every other impl of the case.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from attnbench.errors import AttnbenchError
from attnbench.registry import Unsupported

PROJECTIONS = ("q", "k", "v", "o")


class BadModule(AttnbenchError, RuntimeError):
    """The factory returned something the harness cannot host (a wrong type, shape, dtype)."""


@dataclass(frozen=True)
class LayerModule:
    module: torch.nn.Module
    weights: tuple[torch.nn.Parameter, ...]  # q, k, v, o: (out_features, in_features)
    forward: Callable[[torch.Tensor], torch.Tensor]  # x (B, S, d_model) -> (B, S, d_model)

    @classmethod
    def of(
        cls,
        module: torch.nn.Module,
        forward: Callable[[torch.Tensor], torch.Tensor],
        names: Sequence[str] = ("q_proj", "k_proj", "v_proj", "o_proj"),
    ) -> LayerModule:
        """A module whose projections are nn.Linear submodules ``names`` (q, k, v, o)."""
        return cls(module, tuple(getattr(module, n).weight for n in names), forward)


def host(made: object, weights: tuple[torch.Tensor, ...], grad: bool) -> LayerModule:
    """Check a factory's ``made`` LayerModule against the case's seeded ``weights`` (q, k, v,
    o), load them into it, each its own autograd leaf when ``grad``. Raises Unsupported for learned
    parts the reference cannot model, BadModule for a factory that broke the contract."""
    if not isinstance(made, LayerModule):
        raise BadModule(f"the module factory returned {type(made).__name__}, not a LayerModule")
    if len(made.weights) != len(PROJECTIONS):
        raise BadModule(f"LayerModule.weights holds {len(made.weights)} tensors, expected 4")
    mine = {id(w) for w in made.weights}
    names = {id(p): n for n, p in made.module.named_parameters()}
    extra = [n for i, n in names.items() if i not in mine]
    if extra:
        raise Unsupported(
            f"module parameters {', '.join(extra)} (supported: the q, k, v, o projection "
            f"weights only; the float64 reference has no bias, norm or other learned part)"
        )
    for p, w, seeded in zip(PROJECTIONS, made.weights, weights):
        if id(w) not in names or len(mine) != len(PROJECTIONS):
            raise Unsupported(
                f"{p} weight is not a parameter of its own (supported: four separate "
                f"projection weights of the module, e.g. no fused qkv weight)"
            )
        if w.shape != seeded.shape or w.dtype != seeded.dtype or w.device != seeded.device:
            raise BadModule(
                f"{names[id(w)]} is {tuple(w.shape)} {w.dtype} on {w.device}, expected "
                f"{tuple(seeded.shape)} {seeded.dtype} on {seeded.device} (build the module "
                f"in the case's dtype and device, weights (out_features, in_features))"
            )
        with torch.no_grad():
            w.copy_(seeded)
        w.requires_grad_(grad)
    made.module.eval()  # no dropout: the reference has none; gradients still flow
    return made
