"""Can the numbers be trusted? Three checks on two back-to-back runs of the same grid, both
with ``--profile``:

- timer vs profiler: per ok row of run A taking at least ``MIN_MS``, the harness median
  against the profiler's summed device time per call (``profiler_ms``; CUDA only);
- repeatability: per case ok in both runs, ``|time_B / time_A - 1|``; the median over cases;
- backend label: per row with a ``backend``, the label against the SDPA backends the
  profiled kernels (or, on a CPU, ops) show (``kernels.csv``).

One line per check in ``fidelity.csv`` (check, impl, case, value, goal, verdict), and one
verdict line per check for the console."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from attnbench.errors import UsageError
from attnbench.measure.backends import PYTORCH_PREFIX, backends_in
from attnbench.report.analyse.derived import CASE_COLUMNS, ok_rows
from attnbench.report.analyse.machine import device_title
from attnbench.store.atomic import atomic_dir
from attnbench.store.rundir import RunDir
from attnbench.store.schema import CASE_KEY, LATER_KEYS

MIN_MS = 0.05  # rows shorter than this are dominated by launch overhead: not judged
TIMER_GOAL_PCT = 3.0
REPEAT_GOAL_PCT = 2.0


def _label(row) -> str:
    return " ".join(f"{c}={row[c]}" for c in CASE_COLUMNS if pd.notna(row[c]))


def timer_vs_profiler(a: pd.DataFrame) -> pd.DataFrame:
    ok = ok_rows(a)
    ok = ok[(ok["time_ms"] >= MIN_MS) & ok["profiler_ms"].notna()]
    pct = (ok["time_ms"] / ok["profiler_ms"] - 1) * 100
    return pd.DataFrame(
        {
            "check": "timer_vs_profiler",
            "impl": ok["impl"],
            "case": ok.apply(_label, axis=1),
            "value": pct.astype(float),
            "goal": f"|diff| <= {TIMER_GOAL_PCT}%",
            "verdict": ["pass" if abs(p) <= TIMER_GOAL_PCT else "miss" for p in pct],
        }
    )


def repeatability(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    key = list(CASE_KEY)
    both = ok_rows(a)[[*key, "time_ms"]].merge(
        ok_rows(b)[[*key, "time_ms"]], on=key, suffixes=("_a", "_b")
    )
    pct = ((both["time_ms_b"] / both["time_ms_a"] - 1) * 100).abs()
    return pd.DataFrame(
        {
            "check": "repeatability",
            "impl": both["impl"],
            "case": both.apply(_label, axis=1),
            "value": pct.astype(float),
            "goal": f"median <= {REPEAT_GOAL_PCT}%",
            "verdict": "",
        }
    )


def backend_labels(a_text: pd.DataFrame, kernels_text: pd.DataFrame | None) -> pd.DataFrame:
    """Both frames as the CSVs' text, so that a row and its kernels match by the same key."""
    by_row = {}
    if kernels_text is not None:
        for key, g in kernels_text.groupby(list(CASE_KEY), sort=False):
            by_row[key] = backends_in(g["kernel"])
    out = []
    for _, row in a_text[a_text["backend"] != ""].iterrows():
        seen = by_row.get(tuple(row[c] for c in CASE_KEY))
        # pytorch:flash (xformers running PyTorch's kernels) claims the flash kernels ran;
        # an xformers:* operator of its own has no SDPA name to check against
        parts = row["backend"].split("+")
        claimed = "+".join(p.removeprefix(PYTORCH_PREFIX) for p in parts)
        verdict = "pass" if seen == claimed else "miss"
        if seen is None or any(p.startswith("xformers:") for p in parts):
            verdict = "n/a"
        case = " ".join(f"{c}={row[c]}" for c in CASE_COLUMNS if row[c] != "")
        out.append(
            {
                "check": "backend_label",
                "impl": row["impl"],
                "case": case,
                "value": f"{row['backend']} vs {seen or 'not profiled'}",
                "goal": "label = what ran",
                "verdict": verdict,
            }
        )
    return pd.DataFrame(out, columns=["check", "impl", "case", "value", "goal", "verdict"])


def _text(path: Path) -> pd.DataFrame | None:
    if not path.exists():
        return None
    text = pd.read_csv(path, dtype=str, keep_default_na=False)
    for name, default in LATER_KEYS.items():  # files written before the column existed
        if name not in text:
            text[name] = default or ""
    return text


def verdicts(checks: pd.DataFrame) -> list[str]:
    """One line per check: what was measured, against which goal, and the verdict."""
    lines = []
    timer = checks[checks["check"] == "timer_vs_profiler"]
    if timer.empty:
        lines.append(
            "timer vs profiler: n/a (no ok row >= 0.05 ms with profiler_ms: the "
            "profiler cross-check runs on CUDA only)"
        )
    else:
        worst = timer.loc[timer["value"].abs().idxmax()]
        n_pass = int((timer["verdict"] == "pass").sum())
        lines.append(
            f"timer vs profiler: {n_pass}/{len(timer)} rows within "
            f"{TIMER_GOAL_PCT:g}% (worst {worst['value']:+.1f}%: {worst['impl']} "
            f"{worst['case']}) {'PASS' if n_pass == len(timer) else 'MISS'}"
        )
    rep = checks[checks["check"] == "repeatability"]
    if rep.empty:
        lines.append("repeatability: n/a (no case ok in both runs)")
    else:
        median = float(rep["value"].median())
        lines.append(
            f"repeatability: median |delta| {median:.2f}% over {len(rep)} cases "
            f"(max {rep['value'].max():.1f}%) "
            f"{'PASS' if median <= REPEAT_GOAL_PCT else 'MISS'}"
        )
    lab = checks[checks["check"] == "backend_label"]
    judged = lab[lab["verdict"] != "n/a"]
    if judged.empty:
        lines.append("backend label: n/a (no row with a backend was profiled)")
    else:
        n_pass = int((judged["verdict"] == "pass").sum())
        lines.append(
            f"backend label: {n_pass}/{len(judged)} labels match what ran "
            f"{'PASS' if n_pass == len(judged) else 'MISS'}"
        )
    return lines


def _grid(path: Path, df: pd.DataFrame, from_rows: bool = False) -> dict:
    """What a run sweeps: grid.json's device, impls and cases, or its rows' case keys."""
    if not from_rows:
        try:
            grid = json.loads(RunDir(path).grid.read_text())
            return {key: grid.get(key) for key in ("device", "impls", "cases")}
        except (OSError, ValueError):
            pass
    keys = df[list(CASE_KEY)].apply(lambda r: " ".join(map(str, r)), axis=1)
    return {"rows": sorted(set(keys))}


def _difference(key: str, a, b) -> str:
    if isinstance(a, list) and isinstance(b, list):
        i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        x = repr(a[i]) if i < len(a) else f"missing (A has {len(a)})"
        y = repr(b[i]) if i < len(b) else f"missing (B has {len(b)})"
        return f"{key} item {i + 1}: {x} in A, {y} in B"
    return f"{key}: {a!r} in A, {b!r} in B"


def check_runs(runs: list[tuple[Path, pd.DataFrame, dict]]) -> None:
    """UsageError unless both runs were made with --profile and sweep the same grid (the same
    device, impls and cases in grid.json, or the same rows for runs without one)."""
    for label, (path, _, env) in zip("AB", runs):
        if "profile" in env:
            profiled = env["profile"] is not None
        else:  # env.json written before it recorded --profile: its kernel table says
            profiled = RunDir(path).kernels.exists()
        if not profiled:
            raise UsageError(
                f"run {label} ({path}) was made without --profile; fidelity needs two runs "
                f"of the same grid, both made with --profile (e.g. --profile all)"
            )
    grids = [_grid(Path(path), df) for path, df, _ in runs]
    if grids[0].keys() != grids[1].keys():  # one run without grid.json: compare rows
        grids = [_grid(Path(path), df, from_rows=True) for path, df, _ in runs]
    for key in grids[0]:
        if grids[0][key] != grids[1][key]:
            where = _difference(key, grids[0][key], grids[1][key])
            raise UsageError(
                f"runs A and B sweep different grids ({where}); fidelity compares two "
                f"back-to-back runs of the same grid"
            )


def _ran(name_a: str, name_b: str, where: str, env_a: dict, env_b: dict) -> str:
    """Which runs were judged, where and when they ran, and with which torch and commit."""
    when = " and ".join(str(e.get("time_utc") or "an unrecorded time") for e in (env_a, env_b))
    sha = str(env_a.get("git_sha") or "")[:10] or "no recorded commit"
    return (
        f"runs: A {name_a} and B {name_b} on {where}, at {when}; torch "
        f"{env_a.get('torch') or '?'}, commit {sha}"
    )


def write_fidelity(run_a: Path, run_b: Path, out: Path) -> tuple[pd.DataFrame, list[str]]:
    from attnbench.store.results import load_run

    a, env_a = load_run(run_a)
    b, env_b = load_run(run_b)
    labels = backend_labels(_text(RunDir(run_a).results), _text(RunDir(run_a).kernels))
    checks = pd.concat([timer_vs_profiler(a), repeatability(a, b), labels], ignore_index=True)
    where = device_title(env_a, a)
    checks.insert(0, "device_name", where)
    lines = [_ran(Path(run_a).name, Path(run_b).name, where, env_a, env_b), *verdicts(checks)]
    with atomic_dir(out) as tmp:
        checks.to_csv(tmp / "fidelity.csv", index=False)
        (tmp / "fidelity.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return checks, lines
