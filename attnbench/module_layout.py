"""A model's own attention module as an impl declares it (an impl registered ``module=True``,
level ``layer``): ``LayerModule`` (the module, its call and its layout), ``ModuleLayout`` (where
its learned parts are) and ``QKNorm`` (a norm on q or k). The harness hosts it
(run/measuring/layer_module.py: finds the parts, loads the case's values, checks it against the
reference of run/measuring/layer.py); an impl needs only this module and the registry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from attnbench.errors import UsageError

if TYPE_CHECKING:
    import torch

NORM_KINDS = ("rms", "layer")
NORM_SCOPES = ("head", "projection")


@dataclass(frozen=True)
class QKNorm:
    """A norm on q or on k, after its projection (and bias), before attention, as a module
    declares it: ``path`` names its submodule; ``kind`` "rms" (RMSNorm) or "layer" (LayerNorm),
    None: "layer" for an nn.LayerNorm, else "rms"; ``scope`` "head" (over head_dim, each head
    alike: Qwen3, Gemma-3) or "projection" (over all H·D features: OLMo-2); ``eps`` None: the
    module's (its ``eps`` or ``variance_epsilon``); ``unit_offset``: the weight w is applied
    as 1 + w (Gemma's RMSNorm)."""

    path: str
    kind: str | None = None
    scope: str = "head"
    eps: float | None = None
    unit_offset: bool = False


# a projection: a submodule's path (its ``weight`` and ``bias``, bias None for none), or
# (weight parameter's path, bias parameter's path or None)
Proj = str | tuple[str, str | None]


@dataclass(frozen=True)
class ModuleLayout:
    """Where a module keeps its learned parts (paths are attribute names, dotted for depth).
    ``qkv``: a fused projection, q, k and v stacked along its out_features in ``qkv_order``
    (q, k and v are then not read). One path given to two of q, k and v is a fused projection
    of those two, stacked in ``qkv_order`` too: ``k="to_kv", v="to_kv"`` beside ``q="to_q"``
    (lucidrains' modules, many cross-attention ones) is k then v. ``transposed``: weights
    stored (in_features, out_features), as GPT-2's Conv1D, not nn.Linear's (out_features,
    in_features)."""

    q: Proj = "q_proj"
    k: Proj = "k_proj"
    v: Proj = "v_proj"
    o: Proj = "o_proj"
    qkv: Proj | None = None
    qkv_order: str = "qkv"
    q_norm: QKNorm | None = None
    k_norm: QKNorm | None = None
    transposed: bool = False


MHA = ModuleLayout(qkv=("in_proj_weight", "in_proj_bias"), o="out_proj")  # nn.MultiheadAttention


ORDER_HINT = {  # a weight's storage, by the transposed flag it needs: what to declare
    True: "its weights are stored (in_features, out_features), as GPT-2's Conv1D: declare "
    "ModuleLayout(..., transposed=True)",
    False: "its weights are stored (out_features, in_features), as nn.Linear: declare "
    "ModuleLayout(..., transposed=False)",
}


def fix_hint(role: str, transposed: bool, got: torch.Tensor, seeded: torch.Tensor) -> str:
    """The fix for a declared part (``role``: wq, ..., q_norm_w) whose shape, dtype or device
    is not the case's: its norm's scope, its weights' storage order, or the module's dtype and
    device."""
    if got.shape != seeded.shape and "_norm_" in role:
        head = got.numel() < seeded.numel()
        scope = "'head'), over head_dim, each head alike" if head else "'projection'), over H·D"
        return f"the module's norm is over {got.numel()} features: declare QKNorm(.., scope={scope}"
    if got.shape != seeded.shape and tuple(got.shape) == tuple(seeded.shape)[::-1]:
        return ORDER_HINT[not transposed]
    if got.shape != seeded.shape:
        return "build the module for the case: d_model = heads·head_dim, k and v kv_heads·head_dim"
    return "build the module in the case's dtype and on its device"


class LayerModuleError(UsageError):
    """A LayerModule built from arguments of the wrong kind (a plugin written against an
    earlier API): one line naming what was passed and the fix; a sweep tries each module impl
    once before its first row (run/measuring/layer_module.try_factory)."""


CALL = "LayerModule.of(module, forward, layout=ModuleLayout(...)) (docs/plugins.md)"


def _what(value: object) -> str:
    name = getattr(value, "__qualname__", None)
    return f"the {type(value).__name__} {name}" if name else f"a {type(value).__name__}"


@dataclass(frozen=True)
class LayerModule:
    module: torch.nn.Module
    forward: Callable[[torch.Tensor], torch.Tensor]  # x (B, S, d_model) -> (B, S, d_model)
    layout: ModuleLayout = ModuleLayout()

    def __post_init__(self) -> None:
        import torch

        if not isinstance(self.module, torch.nn.Module):
            raise LayerModuleError(
                f"LayerModule's module is {_what(self.module)}, not the torch.nn.Module that "
                f"holds the projections; build it as {CALL}"
            )
        if not callable(self.forward) or isinstance(self.forward, ModuleLayout):
            raise LayerModuleError(
                f"LayerModule's forward is {_what(self.forward)}, not a function x (B, S, "
                f"d_model) -> (B, S, d_model); build it as {CALL}"
            )
        if not isinstance(self.layout, ModuleLayout):
            swapped = " (forward and layout swapped?)" if callable(self.layout) else ""
            raise LayerModuleError(
                f"LayerModule's layout is {_what(self.layout)}, not a ModuleLayout{swapped}; "
                f"build it as {CALL}"
            )

    @classmethod
    def of(
        cls,
        module: torch.nn.Module = None,
        forward: Callable[[torch.Tensor], torch.Tensor] = None,
        layout: ModuleLayout | None = None,
        *more,
        **unknown,
    ) -> LayerModule:
        """``module`` with ``layout``; None: ``MHA`` for an nn.MultiheadAttention, else
        transformers' q_proj, k_proj, v_proj, o_proj (nn.Linear, biases where they have one).
        A call with a part missing or too many is LayerModuleError (not Python's TypeError,
        which a sweep could not tell from the factory's own failures)."""
        import torch

        if unknown:
            given = ", ".join(f"{k}=" for k in unknown)
            raise LayerModuleError(
                f"LayerModule.of() was given {given}, which it does not take (an earlier API); "
                f"declare the parts' paths in a ModuleLayout: {CALL}"
            )
        if module is None or forward is None or more:
            what = "no module" if module is None else "no forward" if forward is None else ""
            what = what or f"{3 + len(more)} arguments"
            raise LayerModuleError(f"LayerModule.of() was given {what}; build it as {CALL}")
        if layout is None:
            mha = isinstance(module, torch.nn.MultiheadAttention)
            layout = MHA if mha else ModuleLayout()
        return cls(module, forward, layout)
