#!/usr/bin/env python
"""Calibrate the accuracy agreement rule: correct impls vs planted bugs.

Runs every correct built-in impl (naive, sdpa, sdpa_math, sdpa_flash, tiled; whichever the
device supports), ``key_by_key`` (a correct impl kept here: float32 sums taken one key at a
time, the order that rounds the most, as a kernel with one accumulator per output element
does) and a set of planted bugs (small wrappers around F.scaled_dot_product_attention; with a
score modifier, around the formula on float32 scores) over a
population of cases (shapes x seeds x dtypes, backward on but for the longest caches, so out,
dq, dk, dv are checked; the forward verdict is the one of ``out`` alone). Every call goes the
harness's own way: the inputs (run.inputs.make_inputs), the float64 reference and magnitudes
(run.row.ground_truth), the checked call (run.call.Call) and the verdict
(measure.agreement.judge, the one a row gets). It prints:

  * the population, shape by shape;
  * per dtype and tensor, the worst correct error as a share of each of the rule's bounds;
  * the growth check: on single-query decode, the worst correct error and the bound against
    the number of keys, and both exponents;
  * per score modifier and dtype, the false alarms of the rule and of the rule without its
    modifier term, and the C_MOD the worst correct impl needs;
  * the false alarms of the rule (docs/method.md; must be 0), and of the previous rule (no
    long-sum, underflow or bias terms; PREVIOUS_C_NORM);
  * per bug and dtype, the catch rate (fwd: out only; bwd: every tensor) of both, over the
    cases where the bug is detectable: its exact (float64) effect is more than twice the
    worst correct impl's error on the same case at some element, or on a tensor of N_STAT
    elements or more in the norm or along the reference;
  * per bug and dtype, the bug's exact effect in the rule's units.

    PYTHONPATH=. python scripts/calibrate_accuracy.py            # the full population
    PYTHONPATH=. python scripts/calibrate_accuracy.py --small    # CI-sized (about 1 min, 2 cores)
    PYTHONPATH=. python scripts/calibrate_accuracy.py --seeds 3 --jobs 3 --csv pop.csv
    PYTHONPATH=. python scripts/calibrate_accuracy.py --rows pop.csv --markdown table.md
                                                   # the tables again from those rows
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from attnbench import plugins, registry
from attnbench.case import Case
from attnbench.dims import DIMS
from attnbench.masks import ALIGNS, ANY, MODS, ScoreMod, register_mod
from attnbench.measure import agreement, precision
from attnbench.measure.agreement import checked_names
from attnbench.measure.reference import Magnitude
from attnbench.run.measuring.call import Call
from attnbench.run.measuring.inputs import make_inputs
from attnbench.run.measuring.row import ground_truth

CORRECT = ("naive", "sdpa", "sdpa_math", "sdpa_flash", "tiled", "key_by_key")
TENSORS = ("out", "dq", "dk", "dv")
DTYPES = ("float32", "bfloat16", "float16")
# catch-rate targets: float32 down to x1.001, bfloat16/float16 down to x1.01
TARGET = {"float32": 0.95, "bfloat16": 0.90, "float16": 0.90}
NOT_DEMANDED = {
    ("scale_x1.001", "bfloat16"),
    ("scale_x1.001", "float16"),
    ("scale_x1.003", "bfloat16"),  # 0.77u: within the output's own final rounding
}
DETECTABLE = 2.0  # a bug is detectable when its effect is over twice a correct impl's error
MANY_TILES = 32  # key tiles from which a half-type accumulator must be flagged
EDGE_TILES = 16  # and the tile count where its expected figure, sqrt(16 / 2), meets the limit
BR = "bottom_right"


class AlibiUp(ScoreMod):
    """attention-gym's ALiBi as its score_mod is written (``generate_alibi_bias``): s + m_h
    (p - j), m_h = 2^(-8 (h + 1) / H), a float32 bias that promotes bfloat16 scores to float32
    (``ScoreMod.scores`` casts them back). Earlier keys are raised by their distance: +32 at
    512 keys with 2 heads, where a bfloat16 score rounds in steps of 1/8. Registered while
    ``population`` runs."""

    name = "alibi_up"
    meaning = "attention-gym's ALiBi: s + m_h (p - j), earlier keys raised"
    additive = True

    def bias(self, h, p, j):
        return (p - j) * torch.exp2(-8.0 * (h + 1) / self.heads)

    def apply(self, s, h, p, j):
        return s + self.bias(h, p, j)

    def reference(self, s, h, p, j):
        slopes = [2.0 ** (-8 * (k + 1) / self.heads) for k in range(self.heads)]
        return s + torch.tensor(slopes, dtype=s.dtype, device=s.device)[h] * (p - j).to(s.dtype)


UP = AlibiUp.name


class Ramp(ScoreMod):
    """A bias in [0, K] per (head, key), s + K frac(hash(h, j)) (ramp:K), as a plugin's
    modifier may add: at K just above a power of two the dominant scores land on the coarser
    grid of their binade (ramp:17 puts them in [16, 17.6]); SDPA takes the bias as a float
    mask in q's dtype, so each key's bias is rounded once for every query. Registered while
    ``population`` runs."""

    name = "ramp"
    meaning = "s + K * frac(hash(h, j)) (ramp:K)"
    default_arg = "20"
    additive = True

    def __init__(self, arg, heads, device="cpu"):
        super().__init__(arg, heads, device)
        self.K = float(arg)

    @classmethod
    def canonical(cls, arg):
        return f"{float(arg):g}"

    @staticmethod
    def _frac(h, j, dtype):
        return ((j.to(torch.int64) * 7919 + h.to(torch.int64) * 104729) % 997).to(dtype) / 996.0

    def bias(self, h, p, j):
        return self.K * self._frac(h, j, torch.float32) + 0 * p

    def apply(self, s, h, p, j):
        return s + self.bias(h, p, j).to(s.dtype)

    def reference(self, s, h, p, j):
        return s + self.K * self._frac(h, j, s.dtype) + 0 * p.to(s.dtype)


class Temperature(ScoreMod):
    """A multiplicative modifier, s -> T s (temp:T), a temperature or a second scale as a
    plugin's modifier may apply: T = 8 raises decode scores of size 2 to 16, and the rounding
    of the product lands on the grid of T s, not on that of s. Registered while ``population``
    runs."""

    name = "temp"
    meaning = "s * T (temp:T)"
    default_arg = "8"

    def __init__(self, arg, heads, device="cpu"):
        super().__init__(arg, heads, device)
        self.T = float(arg)

    @classmethod
    def canonical(cls, arg):
        return f"{float(arg):g}"

    def apply(self, s, h, p, j):
        return s * self.T

    def grad(self, s, h, p, j):
        return torch.full_like(s, self.T)

    def reference(self, s, h, p, j):
        return s * self.T


CALIBRATION_MODS = (AlibiUp, Ramp, Temperature)


class Shape(NamedTuple):
    batch: int
    heads: int
    kv_heads: int
    seq_q: int
    seq_kv: int
    head_dim: int
    causal: bool
    mask: str = "none"
    window: int | None = None
    align: str = "top_left"
    seeds: int | None = None  # at most this many seeds (CPU time of the longest caches)
    mode: str = "bwd"  # fwd (out only) for the longest caches, as the decode presets run
    note: str = ""
    score_mod: str = ""

    def case(self, dtype: str, device: str) -> Case:
        return Case(
            self.batch,
            self.heads,
            self.kv_heads,
            self.seq_q,
            self.seq_kv,
            self.head_dim,
            dtype=dtype,
            causal=self.causal,
            mode=self.mode,
            device=device,
            mask=self.mask,
            pattern=None if self.window is None else str(self.window),
            causal_align=self.align,
            score_mod=self.score_mod,
        )


PREFILL = [
    Shape(1, 2, 2, 64, 64, 128, True, note="sdpa d128 (the first calibration's false alarm)"),
    Shape(1, 2, 2, 64, 64, 16, False),
    Shape(1, 4, 4, 128, 128, 32, True),
    Shape(2, 2, 2, 100, 37, 64, False, note="Sq > Skv"),
    Shape(1, 2, 2, 37, 100, 64, True, note="Sq < Skv, causal"),
    Shape(1, 2, 2, 100, 37, 128, True, note="Sq > Skv, causal"),
    Shape(1, 8, 1, 64, 64, 64, True, note="GQA 8:1"),
    Shape(1, 8, 2, 48, 96, 128, False, note="GQA 4:1, Sq < Skv"),
    Shape(2, 2, 2, 64, 64, 64, False, "padding"),
    Shape(2, 4, 2, 80, 80, 32, True, "padding", note="GQA 2:1, padding + causal"),
    Shape(1, 2, 2, 96, 96, 64, False, "window", 16),
    Shape(1, 2, 2, 96, 96, 128, True, "window", 24),
    Shape(1, 2, 2, 128, 128, 256, True, note="d256"),
    Shape(1, 2, 2, 64, 200, 256, False),
    Shape(1, 2, 2, 256, 256, 64, False),
    Shape(1, 2, 2, 16, 1, 64, False, note="one key: dq, dk exactly 0"),
    Shape(1, 2, 2, 1, 32, 64, True, note="one query, causal: dq, dk exactly 0"),
    Shape(1, 2, 1, 1, 1, 32, False),
]
# What the model presets run (models.py, docs/method.md "Real workloads"): decode is 1 or 4
# queries against a cache of 1k...128k keys, bottom-right causal, GQA 4:1 and 8:1, D 64-256.
DECODE = [
    Shape(1, 32, 8, 1, 4096, 128, True, align=BR, seeds=5, mode="fwd", note="Llama-3-8B decode"),
    Shape(1, 4, 1, 1, 1024, 128, True, align=BR, note="GQA 4:1"),
    Shape(1, 4, 1, 1, 4096, 64, True, align=BR, seeds=5, note="GQA 4:1"),
    Shape(1, 4, 1, 1, 4096, 128, True, align=BR, seeds=5, note="few heads, d128"),
    Shape(1, 8, 1, 1, 2048, 32, True, align=BR, note="GQA 8:1, d32"),
    Shape(1, 8, 1, 1, 8192, 64, True, align=BR, seeds=3, note="GQA 8:1"),
    Shape(1, 4, 1, 4, 16384, 256, True, align=BR, seeds=3, mode="fwd", note="4 queries, d256"),
    Shape(1, 8, 2, 1, 32768, 128, True, align=BR, seeds=3, mode="fwd"),
    Shape(1, 8, 1, 4, 65536, 64, True, align=BR, seeds=3, mode="fwd", note="GQA 8:1, 4 queries"),
    Shape(1, 4, 1, 1, 131072, 64, True, align=BR, seeds=3, mode="fwd", note="the longest cache"),
    Shape(1, 4, 1, 64, 1024, 128, True, align=BR, note="a prefill chunk after a cache"),
    Shape(1, 2, 2, 100, 37, 64, True, align=BR, note="Sq > Skv: 63 queries see no key"),
    Shape(1, 8, 2, 48, 512, 64, True, "window", 128, align=BR, note="sliding window, cache"),
]
# Score modifiers whose scores grow large: a bfloat16 score of size |s| rounds by up to
# |s| 2^-8, so a modifier that raises the scores raises a correct impl's error with them
# (C_MOD's term in docs/method.md); the built-in ALiBi over a long range and softcap at
# Gemma 2's cap beside them.
MODIFIED = [
    Shape(1, 2, 2, 512, 512, 64, False, score_mod=UP, note="scores raised to +32"),
    Shape(1, 2, 2, 384, 384, 64, True, score_mod=UP, note="causal, scores raised to +24"),
    Shape(1, 8, 2, 64, 1024, 128, True, align=BR, score_mod=UP, note="a chunk after a cache"),
    Shape(1, 4, 4, 256, 256, 64, False, score_mod="alibi", note="ALiBi over 255 keys"),
    Shape(1, 2, 2, 128, 128, 64, True, score_mod="softcap:50"),
    Shape(1, 8, 2, 64, 512, 64, True, align=BR, score_mod="ramp:17", note="scores in [16, 17.6]"),
    Shape(1, 8, 2, 64, 512, 64, True, align=BR, score_mod="ramp:34", note="scores in [32, 35]"),
    Shape(1, 4, 4, 128, 128, 64, False, score_mod="ramp:9", note="scores in [8, 8.8]"),
]
# What the previous grid lacked: outputs of a few elements (decode with one or two heads and a
# small head dim), GQA backward at 8:1 and 16:1 (a kv head's gradient summed over 8 and 16
# query heads), scores in the hundreds (ramp:130, ramp:200) and multiplied ones (temp:T), and
# exactly 16 key tiles of half_acc (1024 keys).
ADDED = [
    Shape(1, 1, 1, 1, 256, 8, True, align=BR, note="8 outputs"),
    Shape(1, 2, 1, 1, 512, 8, True, align=BR, note="16 outputs"),
    Shape(1, 1, 1, 1, 1024, 16, True, align=BR, note="16 outputs"),
    Shape(1, 2, 2, 1, 300, 32, True, align=BR, note="64 outputs"),
    Shape(1, 2, 1, 1, 2048, 64, True, align=BR, note="128 outputs"),
    Shape(1, 16, 2, 512, 512, 40, True, seeds=3, note="GQA 8:1 backward (the audit's case)"),
    Shape(1, 32, 2, 256, 256, 64, True, seeds=3, note="GQA 16:1 backward"),
    Shape(1, 8, 2, 4, 1024, 64, True, align=BR, note="4 queries, 16 key tiles"),
    Shape(1, 4, 4, 128, 128, 64, False, score_mod="ramp:130", note="scores in [128, 130]"),
    Shape(1, 4, 4, 128, 128, 64, False, score_mod="ramp:200", note="scores in [128, 200]"),
    Shape(1, 4, 4, 128, 128, 64, False, score_mod="temp:4", note="scores times 4"),
    Shape(1, 8, 2, 1, 1024, 64, True, align=BR, score_mod="temp:8", note="decode, scores x8"),
    Shape(1, 4, 1, 1, 2048, 64, True, align=BR, score_mod="temp:16", note="decode, x16"),
    Shape(1, 4, 1, 1, 2048, 128, True, align=BR, score_mod="temp:4", note="decode, x4, d128"),
]
SHAPES = PREFILL + DECODE + MODIFIED + ADDED
# CI-sized subset (tests/test_accuracy_calibration.py). Its catch-rate assertion must be robust
# on other machines, so it leaves out the prefill shapes where the bfloat16 scale x1.01
# forward verdict is marginal (S37x100 causal, S80 causal padding GQA: the bug moves `out` by
# about as much as naive's own bfloat16 error; docs/accuracy_calibration.md, "Per shape").
SMALL_SHAPES = [PREFILL[i] for i in (0, 3, 5, 6, 8, 11, 15, 16)] + [
    Shape(1, 4, 1, 1, 2048, 32, True, align=BR, note="decode"),
    Shape(1, 8, 1, 4, 1024, 64, True, align=BR, note="4 queries, GQA 8:1"),
    DECODE[11],
    DECODE[12],
    MODIFIED[0],
    ADDED[1],
    Shape(1, 16, 1, 64, 64, 32, True, note="GQA 16:1 backward"),
]


# --- a correct impl kept here: sums one key at a time ------------------------------------------
class _KeyByKey(torch.autograd.Function):
    """p @ v summed one key at a time in float32: p (B, H, Sq, Skv), v (B, H, Skv, D); the
    backward is exact (it is not what is calibrated)."""

    @staticmethod
    def forward(ctx, p, v):
        ctx.save_for_backward(p, v)
        acc = torch.zeros(*p.shape[:-1], v.shape[-1], dtype=torch.float32, device=p.device)
        for j in range(p.shape[-1]):
            acc += p[..., j : j + 1] * v[..., j : j + 1, :]
        return acc

    @staticmethod
    def backward(ctx, g):
        p, v = ctx.saved_tensors
        return g @ v.transpose(-1, -2), p.transpose(-1, -2) @ g


def key_by_key(q, k, v, *, causal, scale, mask):
    """Scores and softmax in float32, the probabilities rounded to the case dtype, then
    P V summed one key at a time in float32 (rows with no key: zero)."""
    dtype, group = q.dtype, q.shape[1] // k.shape[1]
    q, k, v = (t.float() for t in (q, k, v))
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q @ k.transpose(-1, -2)) * scale  # (B, H, Sq, Skv)
    keyless = None
    if mask.masked(causal):
        keep = mask.keep(q.shape[-2], k.shape[-2], causal, q.device)  # (Bm, 1, Sq, Skv)
        keyless = ~keep.any(-1, keepdim=True)
        s = s.masked_fill(~(keep | keyless), -math.inf)
    p = s.softmax(-1).to(dtype).float()
    out = _KeyByKey.apply(p, v)
    return (out if keyless is None else out.masked_fill(keyless, 0.0)).to(dtype)


# --- a planted precision bug: the running output kept in the half type ------------------------
HALF_TILE = 64  # keys per tile of half_acc: its accumulator is rounded once per tile


def half_acc(q, k, v, *, causal, scale, mask):
    """Online softmax over HALF_TILE-key tiles with scores, maxima and sums in float32 but the
    running output kept in the case dtype, rounded after every tile: the mistake of a kernel
    that should accumulate in float32. Its verdict passes on short rows; its precision
    figure (measure/precision.py) is what flags it."""
    dtype, group = q.dtype, q.shape[1] // k.shape[1]
    q, k, v = (t.float() for t in (q, k, v))
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q @ k.transpose(-1, -2)) * scale  # (B, H, Sq, Skv)
    if mask.masked(causal):
        keep = mask.keep(q.shape[-2], k.shape[-2], causal, q.device)  # (Bm, 1, Sq, Skv)
        s = s.masked_fill(~keep, -math.inf)
    m = torch.full((*s.shape[:-1], 1), -math.inf, device=q.device)
    total = torch.zeros_like(m)
    acc = torch.zeros(*s.shape[:-1], v.shape[-1], dtype=dtype, device=q.device)
    for start in range(0, s.shape[-1], HALF_TILE):
        tile = s[..., start : start + HALF_TILE]
        m_new = torch.maximum(m, tile.amax(-1, keepdim=True))
        alpha = torch.exp(m - m_new).nan_to_num(0.0)
        p = torch.exp(tile - m_new).nan_to_num(0.0)
        total = total * alpha + p.sum(-1, keepdim=True)
        pv = p.to(dtype).float() @ v[..., start : start + HALF_TILE, :]
        acc = (acc.float() * alpha + pv).to(dtype)
        m = m_new
    return (acc.float() / total.masked_fill(total == 0, 1.0)).to(dtype)


PRECISION_BUGS = {"half_acc": half_acc}  # run on the low-precision cases, forward verdict


# --- planted bugs ------------------------------------------------------------------------------
def _sdpa(q, k, v, keep, scale, mask):
    """Attention by SDPA; with a score modifier, by the formula on float32 scores (float64 for
    a bug's exact effect) with the modifier applied, as ``tiled`` computes them."""
    if mask.score_mod is None:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=keep, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
        )
    dtype, group = q.dtype, q.shape[1] // k.shape[1]
    q, k, v = (t.to(torch.promote_types(dtype, torch.float32)) for t in (q, k, v))
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q @ k.transpose(-1, -2)) * scale  # (B, H, Sq, Skv)
    s = mask.score_mod.scores(s, *mask.positions(q.shape[1], q.shape[-2], k.shape[-2], q.device))
    return (s.masked_fill(~keep, -math.inf).softmax(-1) @ v).to(dtype)


class _GradTimes(torch.autograd.Function):
    """Identity forward; the gradient times ``f``."""

    @staticmethod
    def forward(ctx, t, f):
        ctx.f = f
        return t.view_as(t)

    @staticmethod
    def backward(ctx, g):
        return g * ctx.f, None


def scale_times(f):
    def fn(q, k, v, *, causal, scale, mask):
        keep = mask.keep(q.shape[-2], k.shape[-2], causal, q.device)
        return _sdpa(q, k, v, keep, scale * f, mask)

    return fn


def grad_times(which, f=1.01):
    def fn(q, k, v, *, causal, scale, mask):
        t = [q, k, v]
        t[which] = _GradTimes.apply(t[which], f)
        return _sdpa(*t, mask.keep(q.shape[-2], k.shape[-2], causal, q.device), scale, mask)

    return fn


def edited_mask(edit):
    """``edit(keep, keep_without_causal, i, j, shift, causal, mask) -> keep`` on (Bm, 1, Sq,
    Skv) boolean masks (True = attend); i (Sq, 1) and j (1, Skv) are the query and key
    indices, shift the position of query 0 among the keys (the case's alignment)."""

    def fn(q, k, v, *, causal, scale, mask):
        Sq, Skv = q.shape[-2], k.shape[-2]
        i = torch.arange(Sq, device=q.device)[:, None]
        j = torch.arange(Skv, device=q.device)[None, :]
        keep = edit(
            mask.keep(Sq, Skv, causal, q.device),
            mask.keep(Sq, Skv, False, q.device),
            i,
            j,
            mask.shift(Sq, Skv),
            causal,
            mask,
        )
        return _sdpa(q, k, v, keep, scale, mask)

    return fn


def _drop_last(keep, nocausal, i, j, shift, causal, mask):
    keep = keep.clone()
    keep[..., -1] = False
    return keep


def _leak_pad(keep, nocausal, i, j, shift, causal, mask):
    leak = j == mask.kv_lens[:, None, None, None]  # the first padded key, (B, 1, 1, Skv)
    return keep | (leak & (j <= i + shift)) if causal else keep | leak


def _misaligned(keep, nocausal, i, j, shift, causal, mask):
    """The other alignment's diagonal: bottom-right for a top-left case and back."""
    other = (j.shape[-1] - i.shape[0]) - shift
    return nocausal & (j <= i + other)


@dataclass(frozen=True)
class Bug:
    fn: object
    applies: object  # Case -> bool


BUGS = {
    "scale_x1.01": Bug(scale_times(1.01), lambda c: True),
    "scale_x1.003": Bug(scale_times(1.003), lambda c: True),
    "scale_x1.001": Bug(scale_times(1.001), lambda c: True),
    "causal_shift+1": Bug(
        edited_mask(lambda keep, nc, i, j, shift, causal, m: nc & (j <= i + shift + 1)),
        lambda c: c.causal,
    ),
    "causal_misaligned": Bug(edited_mask(_misaligned), lambda c: c.causal and c.cross),
    "drop_last_key": Bug(edited_mask(_drop_last), lambda c: c.seq_kv > 1),
    "drop_last_key_causal": Bug(edited_mask(_drop_last), lambda c: c.seq_kv > 1 and c.causal),
    "drop_new_key": Bug(edited_mask(_drop_last), lambda c: c.causal_align == BR and c.seq_q <= 4),
    "leak_pad_key": Bug(edited_mask(_leak_pad), lambda c: c.mask == "padding"),
    "dq_x1.01": Bug(grad_times(0), lambda c: c.backward),
    "dk_x1.01": Bug(grad_times(1), lambda c: c.backward),
    "dv_x1.01": Bug(grad_times(2), lambda c: c.backward),
}
GRAD_ONLY = {"dq_x1.01", "dk_x1.01", "dv_x1.01"}


PRECISION = object()  # marks a planted precision bug in case_rows' list


def _impl(name: str, fn) -> registry.Impl:
    return registry.Impl(name, fn, masks=ANY, causal_align=ALIGNS)


KEY_BY_KEY = _impl("key_by_key", key_by_key)


# --- running -----------------------------------------------------------------------------------
def exact(fn, inputs, case) -> list[torch.Tensor]:
    """out (and dq, dk, dv) of ``fn`` in float64 on the case's inputs: a bug's exact effect."""
    grad = case.backward
    q, k, v = (t.double().detach().requires_grad_(grad) for t in (inputs.q, inputs.k, inputs.v))
    with torch.set_grad_enabled(grad):
        out = fn(q, k, v, causal=case.causal, scale=inputs.scale, mask=inputs.mask.fresh())
        grads = torch.autograd.grad(out, (q, k, v), inputs.dout.double()) if grad else ()
    return [out.detach(), *grads]


# The previous rule, for comparison: the same magnitude (without ``under``), no long-sum,
# underflow or bias terms, and these C_NORM (C_ZERO, C_ELEM, BETA, TAU as now)
PREVIOUS_C_NORM = {
    torch.float32: {"out": 32.0, "grad": 32.0},
    torch.bfloat16: {"out": 1.75, "grad": 2.25},
    torch.float16: {"out": 1.75, "grad": 2.25},
}


def previous_rule(x, ref, mag: Magnitude, tensor: str, dtype) -> dict:
    """The previous rule (PREVIOUS_C_NORM), for comparison: its element-wise number in u (an
    n-free measure, also used to tell a bug's effect from rounding) and the criteria it
    fails."""
    u, kind = agreement.unit_roundoff(dtype), "out" if tensor == "out" else "grad"
    m = (mag.m if mag.under is None else mag.m - mag.under).double()
    d = (x.double() - ref).abs()
    r_norm, m_norm = ref.norm().item(), m.norm().item()
    if not torch.isfinite(d).all():
        return {"prev_elem_u": math.inf, "prev_fail": "non-finite"}
    d_norm = d.norm().item()
    den = torch.clamp(m, min=agreement.TAU * m.square().mean().sqrt().item())
    elem = torch.where(d == 0, torch.zeros_like(d), d / den).max().item() / u
    fails = []
    if r_norm < agreement.BETA * m_norm:
        if d_norm > agreement.C_ZERO[dtype] * u * m_norm:
            fails.append("abs (reference near zero)")
    elif d_norm > PREVIOUS_C_NORM[dtype][kind] * u * r_norm:
        fails.append("rel")
    if elem > agreement.C_ELEM[dtype][kind]:
        fails.append("max-abs")
    return {"prev_elem_u": elem, "prev_fail": ",".join(fails)}


def case_rows(case: Case, seed: int, impls: dict) -> list[dict]:
    """One row per (impl or bug, tensor) of one case and seed."""
    inputs = make_inputs(case, seed)
    truth = ground_truth(case, inputs)
    names, dt = checked_names(case), case.torch_dtype
    u = agreement.unit_roundoff(dt)
    todo = [(impls[n], None) for n in CORRECT if n in impls and not impls[n].reasons(case)]
    todo += [(_impl(n, b.fn), b) for n, b in BUGS.items() if b.applies(case)]
    if truth.fp32_acc is not None:
        todo += [(_impl(n, fn), PRECISION) for n, fn in PRECISION_BUGS.items()]
    rows, key = [], dict(case.columns(), seed=seed)
    for impl, bug in todo:
        out, grads = Call.prepare(impl, case, inputs).check()
        got = [out, *(grads or ())]
        verdict = agreement.judge(case, got, truth)
        effect = exact(impl.fn, inputs, case) if bug and bug is not PRECISION else None
        for t, tensor in enumerate(names):
            e, mag = verdict.errors[t], truth.mag[t]
            row = {
                **key,
                "impl": impl.name,
                "bug": bug is not None and bug is not PRECISION,
                "precision_bug": bug is PRECISION,
                "precision_ratio": verdict.columns.get("precision_ratio") if t == 0 else None,
                "tiles": -(-int(e.terms) // HALF_TILE),  # half_acc's tiles on the longest row
                "tensor": tensor,
                "finite": e.finite,
                "rel_u": (math.nan if e.rel is None else e.rel) / u,
                "rel_bound_u": (math.nan if e.rel_bound is None else e.rel_bound) / u,
                "abs_u": e.abs_ratio / u,
                "near_zero": e.near_zero,
                "norm_share": e.norm_share,
                "elem_share": e.elem_share,
                "terms": e.terms,
                "underflow": mag.under is not None,
                "dnorm_u": e.err_norm / u,
                "norm_bound_u": e.norm_bound / u,
                "mod_u": agreement.C_MOD * e.mod_norm,  # the modifier's term of norm_bound, in u
                "bias_u": abs(e.bias) / u,
                "bias_walk_u": e.mod_walk / e.ref_norm**2 if e.ref_norm else 0.0,
                "bias_second_u": (u * e.mod_norm / e.ref_norm) ** 2 / 2 / u if e.ref_norm else 0.0,
                "group_norm": e.group_norm,
                "statistical": e.statistical,
                "ref_norm": e.ref_norm,
                "mag_norm": e.mag_norm,
                "under_norm": e.under_norm,
                "acc_norm": e.acc_norm,
                "fail": ",".join(verdict.failures[t]),
                **previous_rule(got[t], truth.ref[t], mag, tensor, dt),
            }
            if effect is not None:
                ee = agreement.error(effect[t], truth.ref[t], mag, tensor, dt)
                ep = previous_rule(effect[t], truth.ref[t], mag, tensor, dt)
                row.update(
                    effect_dnorm_u=ee.err_norm / u,
                    effect_bias_u=abs(ee.bias) / u,
                    effect_rel_u=(math.nan if ee.rel is None else ee.rel) / u,
                    effect_elem_u=ep["prev_elem_u"],
                    effect=ee.abs_ratio > 1e-12 or ep["prev_elem_u"] * u > 1e-12,
                )
            rows.append(row)
    return rows


@contextlib.contextmanager
def calibration_mods():
    """``CALIBRATION_MODS`` registered while the block runs, and taken out again after (a
    sweep's modifiers stay the built-ins and the plugins it loads)."""
    added = [m.name for m in CALIBRATION_MODS if m.name not in MODS]
    for mod in CALIBRATION_MODS:
        register_mod(mod)
    try:
        yield
    finally:
        for name in added:
            MODS.pop(name, None)


def _shape_rows(task) -> list[dict]:
    """Every row of ``case_rows`` of one (shape, dtype, seeds, device): a worker's task."""
    shape, dt, seeds, device = task
    impls = plugins.discover(entry_points=False) | {KEY_BY_KEY.name: KEY_BY_KEY}
    rows = []
    with calibration_mods():
        case = shape.case(dt, device)
        for seed in range(min(seeds, shape.seeds or seeds)):
            rows += case_rows(case, seed, impls)
    return rows


def _worker(threads: int) -> None:
    torch.set_num_threads(threads)


def population(shapes, seeds, dtypes, device, progress=True, jobs=1) -> pd.DataFrame:
    """Every row of ``case_rows`` over shapes x seeds x dtypes, shape by shape in ``jobs``
    processes (each with this process's torch threads)."""
    tasks = [(shape, dt, seeds, device) for dt in dtypes for shape in shapes]
    rows, t0 = [], time.time()
    with contextlib.ExitStack() as stack:
        if jobs > 1:
            pool = stack.enter_context(
                ProcessPoolExecutor(jobs, initializer=_worker, initargs=(torch.get_num_threads(),))
            )
            done = pool.map(_shape_rows, tasks)
        else:
            done = map(_shape_rows, tasks)
        for (shape, dt, _, _), part in zip(tasks, done):
            rows += part
            if progress:
                with calibration_mods():
                    label = shape.case(dt, device).label()
                print(f"  {time.time() - t0:6.0f}s {label}", file=sys.stderr, flush=True)
    return pd.DataFrame(rows)


# --- the tables --------------------------------------------------------------------------------
CASE_COLS = [*(d.name for d in DIMS), "seed", "impl"]  # a row's case: every dimension (dims.py)
BLANKS = {"window": -1, "pattern": ""}  # a blank spec column, as a key that merges and groups
SHAPE_COLS = [c for c in CASE_COLS if c not in ("dtype", "seed", "impl")]


def with_detectable(df: pd.DataFrame) -> pd.DataFrame:
    """Bug rows get ``detectable``: the bug's exact effect on the tensor is more than
    DETECTABLE times the worst correct impl's error on the same case, seed and tensor at its
    worst element (n-free measure), or, on a tensor of N_STAT elements or more (where the rule
    has its statistics), in the norm or along the reference. Correct rows: False."""
    key = [c for c in CASE_COLS if c != "impl"] + ["tensor"]
    df = df.fillna(BLANKS)
    cols = ["dnorm_u", "prev_elem_u", "bias_u"]
    correct = df[~df.bug].groupby(key, dropna=False)[cols].max()
    worst = df.merge(correct, left_on=key, right_index=True, how="left", suffixes=("", "_correct"))
    statistic = (worst.effect_dnorm_u > DETECTABLE * worst.dnorm_u_correct) | (
        worst.effect_bias_u > DETECTABLE * worst.bias_u_correct
    )  # seen by a statistic over the tensor: from N_STAT elements on (agreement.py)
    det = (worst.effect_elem_u > DETECTABLE * worst.prev_elem_u_correct) | (
        statistic & worst.statistical.astype(bool)
    )
    return df.assign(detectable=df.bug & det.fillna(False).astype(bool))


def verdicts(df: pd.DataFrame, fwd: bool) -> pd.DataFrame:
    """One verdict per (case, seed, impl): flagged by the rule (p) and by the previous rule
    (o); for bugs, whether some checked tensor is detectable."""
    part = df[df.tensor == "out"] if fwd else df[df["mode"] == "bwd"]
    g = part.assign(p=part.fail.fillna("") != "", o=part.prev_fail.fillna("") != "")
    agg = {"p": "any", "o": "any"}
    if "detectable" in g:
        agg["detectable"] = "any"
    return g.fillna(BLANKS).groupby(CASE_COLS, dropna=False).agg(agg).reset_index()


def population_table(shapes, seeds: int) -> list[str]:
    lines = ["| shape | seeds | what |", "|---|---|---|"]
    for s in shapes:
        with calibration_mods():
            case = s.case("float32", "cpu")
        label = case.label().replace(" float32", "").rsplit(" ", 1)[0]
        what = ", ".join(x for x in (s.note, "forward only" if s.mode == "fwd" else "") if x)
        lines.append(f"| {label} | {min(seeds, s.seeds or seeds)} | {what} |")
    return lines


def growth(df: pd.DataFrame) -> tuple[list[str], dict]:
    """Single-query cases (seq_q 1, 1k keys or more) by key count, per dtype: the worst
    correct rel error of out, its bound and the bound's long-sum part (C_ACC u_acc ||sqrt(n)
    m|| / ||r||; the smallest over the seeds), in u; and the exponents of the three in the
    number of keys (``exps[dtype]`` = (worst, bound, long-sum part))."""
    c = df[~df.bug & (df.seq_q == 1) & (df.tensor == "out") & (df.seq_kv >= 1024)]
    lines, exps = [], {}
    if c.empty:
        return lines, exps
    u = c.dtype.map(lambda dt: agreement.unit_roundoff(getattr(torch, dt)))
    c = c.assign(acc_u=agreement.C_ACC * c.acc_norm / c.ref_norm / u)
    per = c.groupby(["dtype", "seq_kv"]).agg(
        worst=("rel_u", "max"), bound=("rel_bound_u", "min"), acc=("acc_u", "min")
    )
    dtypes = [dt for dt in DTYPES if dt in per.index.get_level_values(0)]
    lines.append(
        "| keys | " + " | ".join(f"{dt} worst rel/u | bound/u | long-sum part/u" for dt in dtypes)
    )
    lines[-1] += " |"
    lines.append("|---|" + "---|---|---|" * len(dtypes))
    for skv in sorted(c.seq_kv.unique()):
        cells = []
        for dt in dtypes:
            if (dt, skv) in per.index:
                r = per.loc[(dt, skv)]
                cells.append(f"{r.worst:.3g} | {r.bound:.3g} | {r.acc:.3g}")
            else:
                cells.append("– | – | –")
        lines.append(f"| {skv} | " + " | ".join(cells) + " |")
    for dt in dtypes:
        d = per.loc[dt]
        if len(d) >= 3:
            x = np.log(d.index.to_numpy(dtype=float))
            exps[dt] = tuple(
                float(np.polyfit(x, np.log(d[col].to_numpy(dtype=float)), 1)[0])
                for col in ("worst", "bound", "acc")
            )
    lines.append("")
    lines += [
        f"- {dt}: worst correct error ∝ keys^{w:.2f}; bound ∝ keys^{b:.2f}, its long-sum "
        f"part ∝ keys^{a:.2f}"
        for dt, (w, b, a) in exps.items()
    ]
    return lines, exps


def modified(c: pd.DataFrame) -> tuple[list[str], dict]:
    """Correct rows of the cases with a score modifier, per modifier and dtype: false alarms
    (fwd and bwd verdicts) of the rule and of the rule without its modifier term (C_MOD u
    ||mod||), the worst share of (norm) with and without it, and the C_MOD and C_MOD_BIAS the
    worst row needs (0: none); ``alarms``: the rule's false alarms per modifier."""
    c = c[c.score_mod.fillna("") != ""]
    if c.empty:
        return [], {}
    bound = c.norm_bound_u - c.mod_u
    per_c_mod = c.mod_u / agreement.C_MOD  # ||mod|| in u
    c = c.assign(
        share_without=c.dnorm_u / bound,
        without=c.dnorm_u > bound,
        needs=((c.dnorm_u - bound) / per_c_mod).clip(lower=0).where(per_c_mod > 0, 0.0),
        bias_needs=_bias_needs(c),
    )
    lines = [
        "| score_mod | dtype | verdicts fwd / bwd | false alarms | without the modifier's "
        "term | share of (norm) | without the term | C_MOD needed | C_MOD_BIAS needed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    alarms = {}
    for (mod, dt), g in c.groupby(["score_mod", "dtype"]):
        old = g.assign(fail=g.fail.where(~g.without, "rel"))
        now, was = ([verdicts(frame, fwd) for fwd in (True, False)] for frame in (g, old))
        alarms[mod] = alarms.get(mod, 0) + sum(int(v.p.sum()) for v in now)
        lines.append(
            f"| {mod} | {dt} | {len(now[0])} / {len(now[1])} | "
            f"{int(now[0].p.sum())} / {int(now[1].p.sum())} | "
            f"{int(was[0].p.sum())} / {int(was[1].p.sum())} | "
            f"{g.norm_share.max():.2f} | {g.share_without.max():.2f} | {g.needs.max():.2f} | "
            + (f"{g.bias_needs.max():.3f} |" if g.bias_needs.notna().any() else "– |")
        )
    return lines, alarms


def _bias_needs(c: pd.DataFrame) -> pd.Series:
    """The C_MOD_BIAS each row needs for (bias) to hold (0: none; NaN where the dtype has no
    bias criterion, the reference is near zero or the output too small for the statistic):
    (|bias|/u - C_BIAS - the second order) over the walk along the reference."""
    c_bias = c.dtype.map(lambda dt: agreement.C_BIAS.get(getattr(torch, dt), math.nan))
    walk = c.bias_walk_u
    need = ((c.bias_u - c_bias - c.bias_second_u) / walk).clip(lower=0).where(walk > 0, 0.0)
    return need.where(c_bias.notna() & ~c.near_zero & c.statistical)


def precision_table(df: pd.DataFrame) -> tuple[list[str], dict]:
    """The precision figure (measure/precision.py) of out in the low-precision cases, per
    dtype and impl: the correct impls' largest figure and flags (must be 0 but for `naive`: a
    flag is a false alarm), and the half-type accumulator's catches (flagged, or disagreeing:
    a disagreement gets no figure) by key tiles: fewer than EDGE_TILES, EDGE_TILES to
    MANY_TILES - 1 (its expected figure at the limit), MANY_TILES or more (target >= 90%);
    ``ok``: the flags and rates."""
    out = df[(df.tensor == "out") & ~df.bug]
    d = out[out.precision_ratio.notna() | (out.precision_bug & (out.fail.fillna("") != ""))]
    d = d[d.dtype != "float32"]
    if d.empty:
        return [], {}
    figure = d.precision_ratio.astype(float)
    d = d.assign(flag=(figure > precision.PRECISION_LIMIT) | (d.fail.fillna("") != ""))
    lines = [
        f"| dtype | impl | rows | largest figure | flagged (> {precision.PRECISION_LIMIT:g}) "
        f"| fewer than {EDGE_TILES} key tiles | {EDGE_TILES}–{MANY_TILES - 1} tiles "
        f"| {MANY_TILES}+ tiles |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ok = {}
    for (dt, impl), g in d.groupby(["dtype", "impl"]):
        few, edge = g[g.tiles < EDGE_TILES], g[(g.tiles >= EDGE_TILES) & (g.tiles < MANY_TILES)]
        many = g[g.tiles >= MANY_TILES]

        def cell(x):
            return f"{int(x.flag.sum())}/{len(x)}" if len(x) else "–"

        lines.append(
            f"| {dt} | {impl} | {len(g)} | {g.precision_ratio.max():.2f} | {cell(g)} | "
            f"{cell(few)} | {cell(edge)} | {cell(many)} |"
        )
        if impl in PRECISION_BUGS:
            ok[f"precision/{impl}/{dt}"] = (many.flag.mean() if len(many) else math.nan, 0.90)
        elif impl != "naive":
            ok[f"precision_false_flags/{impl}/{dt}"] = int(g.flag.sum())
    return lines, ok


def report(df: pd.DataFrame) -> tuple[str, dict]:
    lines, ok = [], {}
    prec_lines, prec_ok = precision_table(df)
    df = df[~df.precision_bug]
    df = with_detectable(df)
    c, b = df[~df.bug], df[df.bug]
    nc = c.groupby(CASE_COLS, dropna=False).ngroups
    lines.append(
        f"Correct population: {nc} (case, seed, impl) rows, {len(c)} tensors, impls "
        f"{sorted(c.impl.unique())}; planted: "
        f"{b.groupby(CASE_COLS, dropna=False).ngroups} rows."
    )
    lines.append(
        "\nWorst correct error per dtype and tensor: rel in u (unit roundoff), and as a share "
        "of each bound (1.00 = at the bound); most terms = the longest sum an element adds:\n"
    )
    lines.append(
        "| dtype | tensor | rel/u | share of (norm) | near-zero refs: share of (norm) | "
        "bias/u | share of (bias) | share of (elem) | most terms | fewer than "
        f"{agreement.N_STAT} elements: share of (elem) |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for (dt, tensor), g in c.groupby(["dtype", "tensor"]):
        z = g[g.near_zero]
        zs = f"{z.norm_share.max():.2f} ({len(z)} tensors)" if len(z) else "–"
        stat = g[~g.near_zero & g.statistical.astype(bool)]
        c_bias = agreement.C_BIAS.get(getattr(torch, dt))
        bias_share = "–"
        if c_bias:
            bound = c_bias + agreement.C_MOD_BIAS * stat.bias_walk_u + stat.bias_second_u
            bias_share = f"{(stat.bias_u / bound).max():.2f}"
        small = g[~g.statistical.astype(bool)]
        small_share = f"{small.elem_share.max():.2f}" if len(small) else "–"
        lines.append(
            f"| {dt} | {tensor} | {g.rel_u.max():.3g} | {stat.norm_share.max():.2f} | {zs} | "
            f"{stat.bias_u.max():.3g} | {bias_share} | {g.elem_share.max():.2f} | "
            f"{int(g.terms.max())} | {small_share} |"
        )
    table, exps = growth(c)
    ok["growth"] = exps
    if table:
        lines.append(
            "\nGrowth check, single-query decode: the worst correct rel error of out, its bound "
            "and the bound's long-sum part (the smallest over the seeds), in u, against the "
            "number of keys; the bound's constant part (C_NORM u) dominates at a few thousand "
            "keys, its long-sum part beyond:\n"
        )
        lines += table
    table, ok["modifier_false_alarms"] = modified(c)
    if table:
        lines.append(
            f"\nScore modifiers (correct impls): false alarms of the rule, fwd / bwd verdicts, "
            f"and of the rule without its modifier term in (norm) (C_MOD = {agreement.C_MOD:g}, "
            "sized by the grid the modified score lands on), the worst correct error as a share "
            "of (norm) with and without that term, and the constants the worst correct row "
            f"needs (C_MOD_BIAS = {agreement.C_MOD_BIAS:g}: the modifier's term of the bias "
            "criterion, bfloat16):\n"
        )
        lines += table
    for fwd in (True, False):
        v = verdicts(c, fwd)
        fa, fo = int(v.p.sum()), int(v.o.sum())
        ok[f"false_alarms_{'fwd' if fwd else 'bwd'}"] = fa
        ok[f"previous_false_alarms_{'fwd' if fwd else 'bwd'}"] = fo
        lines.append(
            f"\nFalse alarms ({'fwd: out' if fwd else 'bwd: out, dq, dk, dv'}): "
            f"rule {fa}/{len(v)}, the previous rule {fo}/{len(v)}"
            + (f" ({', '.join(sorted(v[v.o].impl.unique()))})" if fo else "")
        )
    if prec_lines:
        ok.update(prec_ok)
        lines.append(
            "\nPrecision figure of out (bfloat16, float16; measure/precision.py): its rms error "
            "over the elements whose output is at least a quarter of its magnitude, over that of a "
            "kernel accumulating in float32 on the same inputs; flagged above the limit as "
            "precision below an fp32-accumulating kernel. `half_acc` (planted: the running "
            "output kept in the case dtype, rounded after every 64-key tile) must be flagged (or "
            f"disagree) in 90% of the cases of {MANY_TILES}+ key tiles; no correct impl but "
            "`naive` may be flagged; blank (no figure) on disagreeing rows and where fewer than "
            f"{precision.MIN_ELEMENTS} elements are compared:\n"
        )
        lines += prec_lines
    lines.append(
        "\nCatch rate of planted bugs over the cases where the bug is detectable (its exact "
        f"effect over {DETECTABLE:g}x the worst correct error on the case at some element, or, "
        f"on a tensor of {agreement.N_STAT}+ elements, in the norm or along the reference), "
        "rule (the previous rule), caught/n; [k]: k "
        "more cases where the bug changes the exact result but is not detectable:\n"
    )
    lines.append("| bug | " + " | ".join(f"{dt} fwd | {dt} bwd" for dt in DTYPES) + " |")
    lines.append("|---|" + "---|" * (2 * len(DTYPES)))
    miss = {}
    for bug in BUGS:
        cells = []
        for dt in DTYPES:
            for fwd in (True, False):
                sel = b[(b.impl == bug) & (b.dtype == dt)]
                if fwd and bug in GRAD_ONLY or sel.empty:
                    cells.append("–")
                    continue
                v = verdicts(sel, fwd)
                changed = verdicts(sel.assign(detectable=sel.effect.astype(bool)), fwd)
                hidden = int(changed.detectable.sum()) - int(v.detectable.sum())
                v = v[v.detectable]
                if v.empty:
                    cells.append(f"not detectable [{hidden}]")
                    continue
                rate = v.p.mean()
                more = f" [{hidden}]" if hidden else ""
                cells.append(f"{rate:.0%} ({v.o.mean():.0%}) {int(v.p.sum())}/{len(v)}{more}")
                target = TARGET[dt] if (bug, dt) not in NOT_DEMANDED else None
                ok[f"{bug}/{dt}/{'fwd' if fwd else 'bwd'}"] = (rate, target)
                ok[f"previous/{bug}/{dt}/{'fwd' if fwd else 'bwd'}"] = v.o.mean()
                if target is not None and rate < target:
                    miss[(bug, dt, fwd)] = rate
        lines.append(f"| {bug} | " + " | ".join(cells) + " |")
    lines.append(
        "\nExact effect of each bug (float64 bug vs reference), median [min] over detectable "
        "cases, in u, worst tensor: rel | elem (|d| / max(m, TAU rms m))\n"
    )
    lines.append("| bug | " + " | ".join(f"{dt} rel | {dt} elem" for dt in DTYPES) + " |")
    lines.append("|---|" + "---|" * (2 * len(DTYPES)))
    for bug in BUGS:
        cells = []
        for dt in DTYPES:
            sel = b[(b.impl == bug) & (b.dtype == dt) & b.detectable]
            if sel.empty:
                cells.append("– | –")
                continue
            per = sel.groupby(CASE_COLS, dropna=False)[["effect_rel_u", "effect_elem_u"]].max()
            cells.append(
                f"{per.effect_rel_u.median():.3g} [{per.effect_rel_u.min():.2g}] | "
                f"{per.effect_elem_u.median():.3g} [{per.effect_elem_u.min():.2g}]"
            )
        lines.append(f"| {bug} | " + " | ".join(cells) + " |")
    short = [
        k
        for k, v in ok.items()
        if isinstance(v, tuple) and v[1] is not None and v[0] < 1 and k.split("/")[0] in BUGS
    ]
    if short:
        lines.append("\nPer shape, where a demanded catch rate is below 100% (rule, caught/n):\n")
        for key in short:
            bug, dt, direction = key.split("/")
            v = verdicts(b[(b.impl == bug) & (b.dtype == dt)], direction == "fwd")
            v = v[v.detectable]
            per = v.groupby(SHAPE_COLS, dropna=False).p.agg(["sum", "count"]).reset_index()
            cells = [
                f"{_shape_label(r)}: {int(r['sum'])}/{int(r['count'])}"
                for _, r in per.iterrows()
                if r["sum"] < r["count"]
            ]
            lines.append(
                f"- {bug} {dt} {direction}: " + "; ".join(cells) + " (other shapes all caught)"
            )
    if miss:
        lines.append(
            "\nBelow target: "
            + ", ".join(
                f"{bug} {dt} {'fwd' if fwd else 'bwd'} {r:.0%}"
                for (bug, dt, fwd), r in miss.items()
            )
        )
    return "\n".join(lines), ok


def _shape_label(r) -> str:
    text = (
        f"B{r['batch']} H{r['heads']}/{r['kv_heads']} S{r['seq_q']}x{r['seq_kv']} D{r['head_dim']}"
    )
    if r["causal"]:
        text += " causal" + (" bottom-right" if r["causal_align"] == BR else "")
    if r["mask"] != "none":
        text += f" {r['mask']}"
        if r["window"] == r["window"] and r["window"] != -1:
            text += f" {int(r['window'])}"
    if isinstance(r["score_mod"], str) and r["score_mod"]:
        text += f" {r['score_mod']}"
    return text


def where() -> str:
    return (
        f"torch {torch.__version__}, {platform.machine()} {platform.system()}, "
        f"Python {platform.python_version()}, {torch.get_num_threads()} threads"
    )


def _indices(text: str, n: int) -> list[int]:
    """'0,3,31-38' -> [0, 3, 31, ..., 38]; exits 2 on a row outside 0..n-1."""
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    if not out or min(out) < 0 or max(out) >= n:
        sys.exit(f"calibrate_accuracy: error: --shapes {text}: rows are 0..{n - 1}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="CI-sized population")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per case (10; --small 2)")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument(
        "--shapes",
        default=None,
        help="only these shapes of the full population, by their 0-based row in its table "
        "(e.g. 31-38: the score modifiers), for a subset on a busy machine",
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--csv", type=Path, default=None, help="write the per-tensor rows here")
    ap.add_argument(
        "--markdown",
        type=Path,
        default=None,
        help="write the table as a Markdown document (docs/accuracy_calibration.md)",
    )
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: a busy machine slows 2 tenfold)"
    )
    ap.add_argument(
        "--rows", type=Path, default=None, help="make the tables from an earlier run's --csv"
    )
    ap.add_argument(
        "--jobs", type=int, default=1, help="processes, each running whole shapes (default 1)"
    )
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    seeds = a.seeds or (2 if a.small else 10)
    shapes = SMALL_SHAPES if a.small else SHAPES
    if a.shapes:
        shapes = [SHAPES[i] for i in _indices(a.shapes, len(SHAPES))]
    dtypes = a.dtypes.split(",")
    t0, load = time.time(), os.getloadavg()[0]
    if a.rows:  # the table of an earlier run's rows
        df = pd.read_csv(a.rows, keep_default_na=False, na_values=[""])
    else:
        df = population(shapes, seeds, dtypes, a.device, jobs=a.jobs)
    if a.csv:
        df.to_csv(a.csv, index=False)
    text, ok = report(df)
    tail = (
        f"{time.time() - t0:.0f} s; {len(shapes)} shapes x up to {seeds} seeds x "
        f"{len(dtypes)} dtypes; device {a.device}; {where()}, {a.jobs} process(es) on "
        f"{os.cpu_count()} CPUs at a load average of {load:.1f} (start) and "
        f"{os.getloadavg()[0]:.1f} (end)"
    )
    if a.rows:
        tail = f"the tables of the rows in {a.rows}, written by an earlier run's --csv"
    print(text)
    print(f"\n({tail})")
    if a.markdown:
        command = "python scripts/calibrate_accuracy.py " + " ".join(argv or sys.argv[1:])
        shape_lines = "\n".join(population_table(shapes, seeds))
        a.markdown.write_text(
            "# Accuracy rule calibration\n\n"
            "Generated by `scripts/calibrate_accuracy.py` (do not edit by hand); the rule and "
            "its constants are in [method.md](method.md#the-agreement-rule). Units: u, the "
            "dtype's unit roundoff. Every shape runs in float32, bfloat16 and float16, with "
            "backward unless it says forward only (mode bwd: out, dq, dk, dv checked; the "
            "forward verdict is out's alone, over every shape). "
            "`key_by_key` is a correct impl kept in the script: float32 sums taken one key at "
            "a time, the order that rounds the most. *The previous rule*, shown next to the "
            "rule for comparison: no long-sum, underflow or bias terms, and C_NORM 1.75 / "
            "2.25 for bfloat16 and float16 (the rest as now).\n\n"
            f"Command: `{command.strip()}`\n\nRan: {tail}.\n\n"
            f"Population (B, heads q/kv, S q x kv, head dim):\n\n{shape_lines}\n\n{text}\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
