"""The report's first screen: what code measured the rows and how far the rendering code has
moved since (staleness, from git where there is a checkout), the verdicts, the picks, and
what the run did not cover (impls left out or not installed, phases, precision, rounds)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from attnbench import checkout
from attnbench.report.render.header import preset_left_out
from attnbench.report.render.picks import picks_table, verdict_lines
from attnbench.store.env import code_version

# the code that decides a row's numbers: a change here since a run means its rows may differ
MEASURING = ("attnbench/run", "attnbench/measure", "attnbench/impls")
GIT_TIMEOUT_S = 10


def _git(repo: Path, *args: str) -> str | None:
    """git's output in ``repo``, or None when git cannot answer (no checkout, unknown commit)."""
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), *args],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def staleness_line(env: dict, repo: Path | None = None) -> str:
    """'Measured at bf071c8; this report's code is 124 commits ahead, and the measuring code
    (attnbench/run, measure, impls) changed since: re-measure before trusting the rows'
    details' (or that it did not change, or that git cannot tell)."""
    sha = env.get("git_sha")
    if not sha:
        return f"Measured by {code_version(env) or 'unknown code (env.json says nothing)'}."
    said = f"Measured at {sha[:7]}" + (" with uncommitted changes" if env.get("git_dirty") else "")
    repo = repo or checkout.root()  # None: an installed attnbench, no history beside it
    head = _git(repo, "rev-parse", "--short", "HEAD") if repo and (repo / ".git").exists() else None
    ahead = _git(repo, "rev-list", "--count", f"{sha}..HEAD") if head else None
    if ahead is None:
        return f"{said}; this code's checkout cannot tell how far it has moved since."
    if ahead == "0":
        return f"{said}, the commit this report was rendered at."
    changed = _git(repo, "diff", "--name-only", sha, "HEAD", "--", *MEASURING)
    moved = f"{said}; rendered at {head}, {ahead} commit{'' if ahead == '1' else 's'} later"
    if changed:
        n = len(changed.splitlines())
        return (
            f"{moved}, and the measuring code (attnbench/run, measure, impls: {n} "
            f"file{'' if n == 1 else 's'}) "
            f"changed since: these rows may differ from what this code measures."
        )
    return f"{moved}; the measuring code (attnbench/run, measure, impls) is unchanged."


def not_covered(run) -> list[str]:
    """What the run (a RunAnalysis) leaves out, one item each: impls not run and why, phases
    with no rows, missing precision columns, and the rounds each interval rests on."""
    cover, items = run.coverage, []
    if cover.not_installed:
        items.append(f"not installed: {', '.join(cover.not_installed)}")
    if cover.not_run:
        items.append(
            f"left out for this device or grid: {', '.join(cover.not_run)} (env.json not_run)"
        )
    left = preset_left_out(run.env)
    if left:
        items.append(left)
    if cover.lacking_phases:
        items.append(f"no {', '.join(cover.lacking_phases)} rows (--phase)")
    if not cover.precision:
        items.append("no precision columns (rows measured before they were recorded)")
    if cover.rounds is None:
        items.append("no rounds: intervals are p20–p80 ranges, not paired per round")
    else:
        lo, hi = cover.rounds
        items.append(f"{lo if lo == hi else f'{lo}–{hi}'} rounds per paired interval")
    if cover.failed:
        said = ", ".join(f"{n} {s}" for s, n in cover.failed)
        items.append(f"rows without a number: {said} (Failures, below)")
    return [f"- {i}" for i in items]


def first_screen(run) -> list[str]:
    """Title, staleness, verdicts, picks and what the run did not cover (a RunAnalysis)."""
    rec, env = run.recommendations, run.env
    lines = [f"# attnbench report: run `{run.run_id}`", "", staleness_line(env), ""]
    if not rec.empty:
        lines += ["## Verdicts", "", *verdict_lines(run.verdicts), ""]
        lines += ["## Recommendations", "", *picks_table(rec, env)]
        lines += [
            "Each pick loses at most its worst loss to the fastest kernel agreeing with the "
            "float64 reference in every case of its workload, and in each case no more than "
            f"that case's measured noise, capped at {run.tolerance:.2f}x (`--tolerance`); "
            "decode is split by new tokens always. How it is decided: docs/reports.md.",
            "",
        ]
    lines += ["## Not covered", "", *not_covered(run), ""]
    return lines
