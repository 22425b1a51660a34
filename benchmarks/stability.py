"""How far a run's verdicts can be trusted on this machine: one grid run twice back to back,
with a planted slowdown in it, and the figures that say whether the verdicts hold still.

    python benchmarks/stability.py [--impls naive,sdpa,tiled] [--seq-len 512,1024,2048]
        [--mode fwd,bwd] [--causal both] [--rep-ms MS] [--dir DIR]

Each run sweeps the impls plus two versions of one kernel (tests/plugins/ab_old.py and
ab_new.py: the same code, ab_new doing a quarter of its work again, so 1.25x slower). Printed:
- false alarms: `attnbench compare A B --fail-above 10` of the two identical runs (cases
  called slower or faster, and whether the gate passes);
- within-run stability: how far each paired speedup over the baseline moved between the runs
  (median and max);
- power: in one run, the share of cases where ab_new's paired speedup over ab_old has an
  interval below 1; across runs, the share of cases the gate calls slower when run B's ab_new
  rows stand in for ab_old (a run B made of the slower kernel);
- the machine's load average before and after, and its core count.
Runs made before rounds existed are judged by the rules they have (said in the output).
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from attnbench.report.analyse import derived  # noqa: E402
from attnbench.report.analyse.rounds import Rounds, anchor_path  # noqa: E402
from attnbench.report.compare.compare import cannot_judge, regressions, write_compare  # noqa: E402
from attnbench.report.decide import verdicts  # noqa: E402
from attnbench.store.results import load_run  # noqa: E402
from attnbench.store.rundir import RunDir  # noqa: E402

PLUGINS = (ROOT / "tests" / "plugins" / "ab_old.py", ROOT / "tests" / "plugins" / "ab_new.py")
GATE_PCT = 10.0


def sweep(args, run_dir: Path) -> None:
    """One run of the grid, with the two versions of the kernel, into ``run_dir``."""
    impls = f"{args.impls},ab_old,ab_new"
    command = [sys.executable, str(ROOT / "scripts" / "sweep.py"), "--impls", impls]
    command += ["--seq-len", args.seq_len, "--mode", args.mode, "--causal", args.causal]
    command += ["--results-dir", str(run_dir.parent), "--run-id", run_dir.name]
    command += ["--no-report", "--no-progress"]
    command += ["--rep-ms", str(args.rep_ms)] if args.rep_ms else []
    for plugin in PLUGINS:
        command += ["--plugin", str(plugin)]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)


def compare(a: Path, b: Path, out: Path):
    runs = [(p.name, *load_run(p)) for p in (a, b)]
    cmp, _ = write_compare(runs[0], runs[1], out, GATE_PCT, (a, b))
    return cmp


def false_alarms(a: Path, b: Path, work: Path) -> list[str]:
    cmp = compare(a, b, work / "cmp_ab")
    judged = cmp[cmp["ratio"].notna()]
    called = judged["verdict"].isin(["slower", "faster"])
    rules = ", ".join(f"{n} {r}" for r, n in judged["rule"].value_counts().items())
    fails = len(regressions(cmp, GATE_PCT))
    noise, floor = (judged[c].dropna() for c in ("noise_pct", "min_change_pct"))
    spread = (
        f"run-to-run noise ±{noise.iloc[0]:.1f}%, smallest change called {floor.iloc[0]:.1f}%"
        if len(noise)
        else "run-to-run noise not measured"
    )
    held = int(judged["verdict"].eq("contended (not judged)").sum())
    gate = "FAIL" if fails else "CANNOT JUDGE" if cannot_judge(cmp) else "PASS"
    return [
        f"false alarms (compare --fail-above {GATE_PCT:g}, identical runs): {int(called.sum())} "
        f"of {len(judged)} cases called slower or faster; gate {gate} "
        f"({fails} failing); {held} contended, not judged; {spread}; rules: {rules}"
    ]


def stability(a: Path, b: Path, baseline: str) -> list[str]:
    """How far each speedup over ``baseline`` moved between the two runs."""
    frames = []
    for run in (a, b):
        df, env = load_run(run)
        sp = verdicts.speedups(df, baseline, Rounds.read(run), env.get("baseline") == baseline)
        sp = sp[(sp["impl"] != baseline) & sp["speedup"].notna()]
        frames.append(sp.set_index(["impl", *derived.CASE_COLUMNS]))
    later = frames[1][["speedup"]].rename(columns={"speedup": "speedup_b"})
    both = frames[0][["speedup", "paired"]].join(later, how="inner")
    if both.empty:
        return [f"within-run stability: no speedup over {baseline} in both runs"]
    moved = np.abs(np.log(both["speedup_b"].astype(float) / both["speedup"].astype(float)))
    pct = (np.exp(moved) - 1) * 100
    how = "paired by round" if both["paired"].eq(True).all() else "not all paired (no rounds)"
    return [
        f"within-run stability: speedups over {baseline} moved by a median of "
        f"{np.median(pct):.1f}% and at most {np.max(pct):.1f}% between the runs "
        f"({len(both)} speedups, {how})"
    ]


def renamed_run(source: Path, target: Path) -> Path:
    """A copy of run ``source`` in which ab_new's rows stand in for ab_old's."""
    target.mkdir(parents=True)
    run = RunDir(source)
    for path in (run.results, run.samples):
        if not path.is_file():
            continue
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            rows = [r for r in reader if r["impl"] != "ab_old"]
            fields = reader.fieldnames
        for r in rows:
            r["impl"] = "ab_old" if r["impl"] == "ab_new" else r["impl"]
        with open(target / path.name, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows(rows)
    for path in (run.env, anchor_path(source)):
        if path.is_file():
            shutil.copy(path, target / path.name)
    return target


def power(a: Path, b: Path, work: Path) -> list[str]:
    df, _ = load_run(b)
    sp = verdicts.speedups(df, "ab_old", Rounds.read(b))
    new = sp[(sp["impl"] == "ab_new") & sp["speedup"].notna()]
    if new["paired"].eq(True).any():
        caught = (new["speedup_hi"] < 1).fillna(False)
        rule = "paired interval below 1"
    else:
        caught = new["speedup"] < 1
        rule = "no rounds: median ratio below 1, no interval"
    lines = [
        f"power, one run: ab_new (1.25x the work) slower than ab_old in {int(caught.sum())} of "
        f"{len(new)} cases ({rule}); median speedup {new['speedup'].median():.3f}"
    ]
    cmp = compare(a, renamed_run(b, work / "b_slow"), work / "cmp_slow")
    twin = cmp[(cmp["impl"] == "ab_old") & cmp["ratio"].notna()]
    gated = len(regressions(twin, GATE_PCT))
    lines.append(
        f"power, across runs: the gate (--fail-above {GATE_PCT:g}) calls the slower twin slower "
        f"in {gated} of {len(twin)} cases; median ratio {twin['ratio'].median():.3f}"
    )
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--impls", default="naive,sdpa,tiled")
    p.add_argument("--seq-len", default="512,1024,2048")
    p.add_argument("--mode", default="fwd,bwd")
    p.add_argument("--causal", default="both")
    p.add_argument("--baseline", default="sdpa", help="the impl speedups are over")
    p.add_argument("--rep-ms", type=float, default=None, help="the sweep's --rep-ms")
    p.add_argument(
        "--dir", type=Path, default=None, help="keep the runs here (default: a temp dir)"
    )
    args = p.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="attnbench-stability-"))
    load_before = os.getloadavg()[0]
    a, b = work / "a", work / "b"
    for run in (a, b):
        sweep(args, run)
    lines = false_alarms(a, b, work) + stability(a, b, args.baseline) + power(a, b, work)
    lines.append(
        f"machine: {os.cpu_count()} cores, 1-minute load {load_before:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after; runs in {work}"
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
