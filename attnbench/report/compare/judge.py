"""How a case compared between two runs is judged (report/compare/compare.py builds the table):
the ratio of its per-round times, normalised by the speed anchor where both runs have it, its
bootstrap interval, the run-to-run noise of all compared cases, and the verdict."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from attnbench.measure import paired
from attnbench.report.analyse import derived
from attnbench.report.analyse.rounds import RESOURCES

WITHIN_NOISE = "unchanged (within noise)"
CONTENDED = "contended (not judged)"  # another process held a CPU while a run timed the row
MIN_EFFECT_PCT = 3.0  # a change smaller than this is "unchanged" however sure (as pyperf, asv)
# a change is called only past NOISE_Z robust standard deviations of the run-to-run spread of
# the compared cases' log ratios (4: identical runs gave no call in four pairs of runs on a
# 2-core VM, benchmarks/stability.py), measured from at least NOISE_MIN_CASES cases
NOISE_Z = 4.0
NOISE_MIN_CASES = 10
RULE_ANCHOR = "rounds, anchor-normalised"
RULE_ROUNDS = "rounds (no anchor)"
RULE_OVERLAP = "p20–p80 overlap (no rounds)"
RULE_WILD_ANCHOR = "rounds (anchor not used: it changed past MAX_MACHINE_CHANGE)"
# The anchor is the same small workload on the same kind of device in both runs: clocks and a
# busy machine move it by percents to tens of percents. Past this factor either way it timed
# something else (a scheduler's time slice on a shared CPU, another device), not the machine's
# drift, and dividing the impls' times by it would put that into every ratio.
MAX_MACHINE_CHANGE = 3.0
ROUND_RULES = (RULE_ANCHOR, RULE_ROUNDS, RULE_WILD_ANCHOR)  # the cases timed in rounds
MACHINE = ("machine", "machine_compute", "machine_memory")  # the anchor's B/A, per resource


def run_to_run_noise(ratios) -> float | None:
    """The robust standard deviation (1.4826 x the median absolute deviation) of the log
    ratios of the compared cases, as a fraction; None from fewer than NOISE_MIN_CASES."""
    logs = np.log(np.asarray(list(ratios), dtype=float))
    if len(logs) < NOISE_MIN_CASES:
        return None
    return float(1.4826 * np.median(np.abs(logs - np.median(logs))))


def judge_rows(out: pd.DataFrame, usable: pd.Series, judged: dict) -> pd.DataFrame:
    """ratio, its interval, machine, rule and verdict of every compared row: by the test
    over rounds where ``judged`` has the row, past the run-to-run noise, else by the p20–p80
    overlap; a row contended in either run is not judged."""
    cols = {c: [None] * len(out) for c in ("ratio", "ratio_lo", "ratio_hi", *MACHINE)}
    rule, verdict = [None] * len(out), [None] * len(out)
    held = (out["contended_a"].eq(True) | out["contended_b"].eq(True)).fillna(False)
    noise = run_to_run_noise(v[0] for k, v in judged.items() if not held[k])
    floor = max(math.log1p(MIN_EFFECT_PCT / 100), NOISE_Z * (noise or 0.0))
    for i, (idx, r) in enumerate(out.iterrows()):
        if not usable[idx]:
            continue
        if idx in judged:
            value, lo, hi, *machine, rule[i] = judged[idx]
            past = abs(math.log(value)) >= floor
            sure = lo > 1 or hi < 1
            verdict[i] = ("slower" if value > 1 else "faster") if past and sure else WITHIN_NOISE
            verdict[i] = CONTENDED if held[idx] else verdict[i]
        else:  # no p20/p80 (an older CSV): no noise to judge by, the ratio alone decides
            value, lo, hi, machine, rule[i] = float(r["ratio_raw"]), None, None, [], RULE_OVERLAP
            within = derived.flag(r["overlap"]) or value == 1
            verdict[i] = WITHIN_NOISE if within else ("slower" if value > 1 else "faster")
        for c, v in zip(cols, (value, lo, hi, *machine)):
            cols[c][i] = v
    for c, v in cols.items():
        out[c] = pd.array(v, dtype="Float64")
    out["rule"] = pd.array(rule, dtype="string")
    out["verdict"] = pd.array(verdict, dtype="string")
    judged_rows = out.index.isin(list(judged))
    out["noise_pct"] = pd.array(
        np.where(judged_rows, np.nan if noise is None else noise * 100, np.nan), dtype="Float64"
    )
    out["min_change_pct"] = pd.array(
        np.where(judged_rows, math.expm1(floor) * 100, np.nan), dtype="Float64"
    )
    return out


def judge_rounds(cmp: pd.DataFrame, rounds: tuple, anchors: tuple) -> dict[int, tuple]:
    """Per compared row with rounds in both runs (row index ->): the ratio B/A of the
    medians of the per-round times, each divided by its round's speed anchor for the
    resource the row is bound by where both runs have it; its bootstrap interval; the
    anchor's own B/A for that resource, for compute and for memory (the machine's change;
    None without it); and the rule that judged."""
    out = {}
    if rounds[0] is None or rounds[1] is None:
        return out
    for i, r in cmp[cmp["outcome"] == "compared"].iterrows():
        times = [rounds[0].of(r), rounds[1].of(r)]
        if not all(t and len(t) >= paired.MIN_ROUNDS for t in times):
            continue
        speeds = {res: _change(r, anchors, res) for res in (*RESOURCES, "both")}
        resource = _resource(r)
        machine = speeds[resource][0]
        rule = RULE_ROUNDS if machine is None else RULE_ANCHOR
        if machine is not None and not plausible_change(machine):
            rule = RULE_WILD_ANCHOR
        if rule == RULE_ANCHOR:
            pair = speeds[resource][1]
            times = [{k: t[k] / s[k] for k in t if k in s} or t for t, s in zip(times, pair)]
        va, vb = (np.array(list(t.values())) for t in times)
        value = float(np.median(vb) / np.median(va))
        lo, hi = _ratio_interval(va, vb)
        by_resource = tuple(speeds[res][0] for res in RESOURCES)
        out[i] = (value, lo, hi, machine, *by_resource, rule)
    return out


def plausible_change(machine: float) -> bool:
    """Whether the anchor's B/A time could be the machine's drift (MAX_MACHINE_CHANGE)."""
    return 1 / MAX_MACHINE_CHANGE <= machine <= MAX_MACHINE_CHANGE


def _change(row, anchors, resource: str) -> tuple[float | None, tuple]:
    """The anchor's B/A change in the row's case for ``resource`` (the ratio of its
    median times; None unless both runs have it), and its rounds in A and in B."""
    pair = tuple(a.of(row, resource) if a is not None else None for a in anchors)
    if not all(pair):
        return None, pair
    return float(np.median(list(pair[1].values())) / np.median(list(pair[0].values()))), pair


def _resource(row) -> str:
    """The anchor resource a row is bound by: compute, memory, or both (their geometric mean)
    for a balanced row or one without a bound."""
    bound = row.get("bound_a")
    bound = row.get("bound_b") if pd.isna(bound) else bound
    return str(bound) if not pd.isna(bound) and str(bound) in RESOURCES else "both"


def _ratio_interval(a: np.ndarray, b: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """The percentile bootstrap interval of median(b) / median(a), the two resampled apart
    (the rounds of two runs are not paired)."""
    rng = np.random.default_rng(seed)
    ma = np.median(rng.choice(a, size=(paired.BOOTSTRAP_DRAWS, len(a))), axis=1)
    mb = np.median(rng.choice(b, size=(paired.BOOTSTRAP_DRAWS, len(b))), axis=1)
    tail = (1 - paired.CONFIDENCE) / 2 * 100
    ratios = mb / ma
    return float(np.percentile(ratios, tail)), float(np.percentile(ratios, 100 - tail))
