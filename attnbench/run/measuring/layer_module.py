"""Level ``layer`` around a model's own attention module (an impl registered ``module=True``).

The impl is a factory ``(case, mask) -> LayerModule``: the module, built in the case's dtype and
on its device; a call x (B, S, d_model) -> (B, S, d_model) that hands the module whatever else
it needs (position embeddings, attention mask); and its ``ModuleLayout``, a declaration of
where its learned parts are: four projections, or a fused q/k/v one and an output one (each
with or without a bias), and norms on q and k. ``LayerModule.of`` knows two layouts:
nn.MultiheadAttention's (``MHA``) and transformers' (q_proj, k_proj, v_proj, o_proj).

``host`` finds those parts, refuses a module with a learned part its layout does not declare
(the row is ``unsupported``: the reference would not model it), loads the case's seeded values
into them (the four weights of run/measuring/inputs.py, which every impl of the case gets; biases
and norm weights from inputs.layer_parts), makes each parameter an autograd leaf when the mode has
backward, and puts the module in eval mode (no dropout). The module keeps its own parameters
(a fused weight stays one tensor); the reference (run/measuring/layer.py) is the layer with the
values read back from them, and each checked gradient a slice of its parameter's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from attnbench.case import Case
from attnbench.errors import AttnbenchError
from attnbench.heads import same
from attnbench.masks import Mask
from attnbench.measure.profiling import profiled
from attnbench.module_layout import (
    NORM_KINDS,
    NORM_SCOPES,
    ORDER_HINT,
    LayerModule,
    LayerModuleError,
    Proj,
    QKNorm,
    fix_hint,
)
from attnbench.registry import Impl, Unsupported
from attnbench.run.measuring.inputs import Inputs, layer_parts, make_inputs
from attnbench.run.measuring.layer import EXTRAS, UNCHECKED, WEIGHTS, Parts

MHA_FAST_OP = "aten::_native_multi_head_attention"


class BadModule(AttnbenchError, RuntimeError):
    """The factory returned something the harness cannot host (a wrong type, shape, dtype)."""


@dataclass(frozen=True)
class Slot:
    """One checked part (WEIGHTS or EXTRAS ``role``) in a module parameter: the whole of it,
    or ``rows`` of a fused one; ``transposed`` for an (in, out) weight."""

    role: str
    param: torch.nn.Parameter
    rows: slice | None = None
    transposed: bool = False

    def view(self, t: torch.Tensor) -> torch.Tensor:
        """The role's part of ``t`` (the parameter or its gradient): (out, in) or (out,)."""
        flip = self.transposed and t.dim() == 2
        if self.rows is not None:
            t = t[:, self.rows] if flip else t[self.rows]
        return t.T if flip else t


@dataclass(frozen=True)
class Hosted:
    """A hosted module: its call, its parameters (the autograd leaves after x, each once),
    its slots, and the Parts of its reference (None: the plain block)."""

    module: torch.nn.Module
    forward: Callable[[torch.Tensor], torch.Tensor]
    params: tuple[torch.nn.Parameter, ...]
    slots: tuple[Slot, ...]
    parts: Parts | None

    def checked(self, grads: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """The params' gradients -> dwq, dwk, dwv, dwo and the extras' in EXTRAS order (but
        the UNCHECKED)."""
        by = {id(p): g for p, g in zip(self.params, grads)}
        return tuple(s.view(by[id(s.param)]) for s in self.slots if s.role not in UNCHECKED)

    def path_note(self, run: Callable[[], object], device_type: str) -> str | None:
        """Which path an nn.MultiheadAttention ran in ``run`` (the timed work), from the op
        names the profiler records; None for other modules."""
        if not isinstance(self.module, torch.nn.MultiheadAttention):
            return None
        from torch.profiler import ProfilerActivity

        with profiled([ProfilerActivity.CPU]) as prof:
            run()
        if any(e.key == MHA_FAST_OP for e in prof.key_averages()):
            return f"nn.MultiheadAttention ran its fast path ({MHA_FAST_OP})"
        return (
            "nn.MultiheadAttention ran its Python path (F.multi_head_attention_forward), not "
            "its fast path (which needs no grad, eval mode, need_weights=False, batch_first, "
            "an even head count, no float mask)"
        )


def _get(module: torch.nn.Module, path: str):
    try:
        return functools.reduce(getattr, path.split("."), module)
    except AttributeError:
        raise BadModule(
            f"the module's layout names {path!r}, which {type(module).__name__} does not have "
            f"(declare where its parts are: LayerModule.of(module, forward, ModuleLayout(...)))"
        ) from None


def _proj(module: torch.nn.Module, proj: Proj) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A projection's (weight, bias or None)."""
    if isinstance(proj, str):
        found = _get(module, proj)
        if isinstance(found, torch.Tensor):
            return found, None
        return _get(found, "weight"), getattr(found, "bias", None)
    weight, bias = proj
    return _get(module, weight), None if bias is None else _get(module, bias)


def _projections(made: LayerModule, case: Case) -> list[Slot]:
    """The slots of the four projections' weights and biases."""
    lay, m = made.layout, made.module
    size = {"q": case.d_model, "k": case.kv_heads * case.head_dim}
    size["v"] = size["k"]
    if sorted(lay.qkv_order) != ["k", "q", "v"]:
        raise BadModule(f"qkv_order={lay.qkv_order!r} (supported: q, k, v in some order)")
    # the projections by the path declared for them: one path for several is a fused weight,
    # its parts stacked along out_features in qkv_order (a whole qkv, or a k|v beside q)
    fused: dict[Proj, list[str]] = {}
    for p in lay.qkv_order:
        fused.setdefault(lay.qkv if lay.qkv is not None else getattr(lay, p), []).append(p)
    found, rows = {}, {}
    for path, parts in fused.items():
        weight, bias = _proj(m, path)
        found |= dict.fromkeys(parts, (weight, bias))
        if len(parts) == 1:
            rows[parts[0]] = None
            continue
        total, out = sum(size[p] for p in parts), weight.shape[-1 if lay.transposed else 0]
        if out != total:
            kv = len(parts) - ("q" in parts)
            sizes = " + ".join(["Hq·D"] * ("q" in parts) + [f"{kv}·Hkv·D" if kv > 1 else "Hkv·D"])
            flipped = weight.shape[0 if lay.transposed else -1] == total
            hint = f"; {ORDER_HINT[not lay.transposed]}" if flipped else ""
            raise BadModule(
                f"the fused {''.join(parts)} weight has {out} out_features, expected {total} "
                f"= {sizes}{hint}"
            )
        start = 0
        for p in parts:
            rows[p], start = slice(start, start + size[p]), start + size[p]
    found["o"], rows["o"] = _proj(m, lay.o), None
    slots = [Slot(f"w{p}", found[p][0], rows[p], lay.transposed) for p in "qkvo"]
    slots += [Slot(f"b{p}", found[p][1], rows[p]) for p in "qkvo" if found[p][1] is not None]
    return slots


def _norm(module: torch.nn.Module, norm: QKNorm, dtype: torch.dtype) -> QKNorm:
    """``norm`` with its kind and eps resolved from its submodule."""
    sub = _get(module, norm.path)
    kind = norm.kind or ("layer" if isinstance(sub, torch.nn.LayerNorm) else "rms")
    if kind not in NORM_KINDS or norm.scope not in NORM_SCOPES:
        raise BadModule(
            f"QKNorm({norm.path!r}) kind={kind!r} scope={norm.scope!r} (supported: kind "
            f"{', '.join(NORM_KINDS)}; scope {', '.join(NORM_SCOPES)})"
        )
    eps = norm.eps
    for name in ("eps", "variance_epsilon") if eps is None else ():
        if hasattr(sub, name):
            eps = getattr(sub, name)
            eps = torch.finfo(dtype).eps if eps is None else eps  # nn.RMSNorm's default
            break
    if eps is None:
        raise BadModule(f"{norm.path} has no eps or variance_epsilon: declare QKNorm(eps=...)")
    return replace(norm, kind=kind, eps=float(eps))


def _slots(made: LayerModule, case: Case) -> tuple[list[Slot], dict[str, QKNorm]]:
    """Every declared part's slot, in the checked order (WEIGHTS, then EXTRAS), and the
    resolved norms by projection (q, k)."""
    slots, norms = _projections(made, case), {}
    for p in "qk":
        declared = getattr(made.layout, f"{p}_norm")
        if declared is None:
            continue
        norms[p] = _norm(made.module, declared, case.torch_dtype)
        sub = _get(made.module, declared.path)
        for part, attr in (("w", "weight"), ("b", "bias")):
            if getattr(sub, attr, None) is not None:
                slots.append(Slot(f"{p}_norm_{part}", getattr(sub, attr)))
    order = (*WEIGHTS, *EXTRAS)
    return sorted(slots, key=lambda s: order.index(s.role)), norms


def _seeded(slot: Slot, case: Case, inputs: Inputs, norms: dict, drawn: dict) -> torch.Tensor:
    """The value ``slot`` gets: a seeded weight, or a drawn extra cut to its norm's scope."""
    if slot.role in WEIGHTS:
        return inputs.weights[WEIGHTS.index(slot.role)]
    value = drawn[slot.role]
    norm = norms.get(slot.role[0]) if "_norm_" in slot.role else None
    if norm is not None and norm.scope == "head":
        value = value[: case.head_dim]
    if norm is not None and norm.unit_offset and slot.role.endswith("_w"):
        value = value - 1  # applied as 1 + w
    return value.to(device=case.device, dtype=case.torch_dtype)


def _checked(made: object, case: Case, inputs: Inputs, where: bool = True):
    """``made``'s slots, resolved norms and the value of each slot, every declared part
    checked (``_check``; ``where`` False: their dtype and device are not)."""
    if not isinstance(made, LayerModule):
        raise BadModule(f"the module factory returned {type(made).__name__}, not a LayerModule")
    slots, norms = _slots(made, case)
    names = {id(p): n for n, p in made.module.named_parameters()}
    drawn = layer_parts(case, inputs.seed)
    want = {s.role: _seeded(s, case, inputs, norms, drawn) for s in slots}
    _check(slots, names, want, where)
    return slots, norms, want


def _check(slots: list[Slot], names: dict, want: dict, where: bool = True) -> None:
    """Refuse misdeclared parts (BadModule: not the module's own parameter, one declared
    twice, a shape, dtype or device not the case's) and undeclared parameters
    (Unsupported)."""
    whole = [id(s.param) for s in slots if s.rows is None]
    for s in slots:
        if id(s.param) not in names:
            raise BadModule(f"{s.role} is not a parameter of the module (declare its own)")
        if whole.count(id(s.param)) > 1:
            raise BadModule(f"{names[id(s.param)]} is declared for two parts (one each)")
        got, seeded = s.view(s.param), want[s.role]
        what = names[id(s.param)] + ("" if s.rows is None else f" ({s.role})")
        moved = got.dtype != seeded.dtype or got.device != seeded.device
        if got.shape != seeded.shape or (where and moved):
            fix = fix_hint(s.role, s.transposed, got, seeded)
            raise BadModule(
                f"{what} is {tuple(got.shape)} {got.dtype} on {got.device}, expected "
                f"{tuple(seeded.shape)} {seeded.dtype} on {seeded.device} ({fix})"
            )
    covered = {id(s.param) for s in slots}
    extra = [n for i, n in names.items() if i not in covered]
    if extra:
        raise Unsupported(
            f"module parameters {', '.join(extra)} (supported: the learned parts its layout "
            f"declares: q, k, v, o projections or a fused qkv, their biases, q/k norms; the "
            f"float64 reference models nothing else)"
        )


def try_factory(impl: Impl, cases: list[Case]) -> None:
    """A module impl's factory called once before any row, on a small CPU copy of its first
    layer case, and every part its layout declares checked there (found, the module's own,
    of the case's shape; dtype and device are the rows' to check, as this copy is on the
    CPU): a LayerModule built from arguments of the wrong kind, or a layout that does not
    fit its module, is bad input (one line), not the same error in every row. Any other
    failure (the factory's own, a case that does not shrink, an undeclared part, which is
    its rows' ``unsupported``) is the rows' to say."""
    case = next((c for c in cases if c.level == "layer" and not impl.reasons(c)), None)
    if not impl.module or case is None:
        return
    try:
        small = replace(case, batch=1, seq_q=min(case.seq_q, 16), seq_kv=min(case.seq_kv, 16))
        small = replace(small, device="cpu")
        layout = small.kind.layout(small, 0)
        made = impl.fn(small, Mask(small.mask, layout, small.causal_align, small.modifier()))
        _checked(made, small, make_inputs(small, 0), where=False)
    except (LayerModuleError, BadModule) as exc:
        raise LayerModuleError(f"impl {impl.name} ({impl.source or 'built-in'}): {exc}") from None
    except Exception:  # noqa: BLE001 - anything else: the rows'
        return


def host(made: object, case: Case, inputs: Inputs, head_order: str, grad: bool) -> Hosted:
    """Host a factory's ``made`` LayerModule for ``case``: its declared parts found, checked
    and loaded with the case's seeded values, each parameter its own autograd leaf when
    ``grad``. Raises Unsupported for learned parts its layout does not declare, BadModule
    for a factory that broke the contract."""
    slots, norms, want = _checked(made, case, inputs)
    params = tuple({id(s.param): s.param for s in slots}.values())
    with torch.no_grad():
        for s in slots:
            s.view(s.param).copy_(want[s.role])
    for p in params:
        p.requires_grad_(grad)
    made.module.eval()  # no dropout: the reference has none; gradients still flow
    extras = {s.role: s.view(s.param).detach() for s in slots if s.role in EXTRAS}
    plain = not extras and not norms and same(case.heads, case.kv_heads, head_order)
    parts = None if plain else Parts(extras, norms.get("q"), norms.get("k"), head_order)
    return Hosted(made.module, made.forward, params, tuple(slots), parts)
