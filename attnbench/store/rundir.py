"""The run folder: ``RunDir`` owns the name of every file a run writes (results.csv,
samples.csv, kernels.csv, anchor.csv, env.json, grid.json, draws.jsonl, errors.log, traces/)
and of its report, so no other module spells one. It also picks a run's id and folder
(checking a resume against grid.json, what the run sweeps), and appends to the line files (the
draws file: what each case drew from the seed; the errors log: failed rows' full errors)."""

from __future__ import annotations

import json
import os
import re
from datetime import datetime
from pathlib import Path

from attnbench.errors import UsageError
from attnbench.store.atomic import write_json_atomic

RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
RUN_ID_MAX = 100  # characters: a folder's name has 255 at most, and compare's joins two


class RunDir:
    """One run's folder and the path of each of its files."""

    RESULTS = "results.csv"  # one row per (case, impl): store/schema.py COLUMNS
    SAMPLES = "samples.csv"  # every timing sample of every row
    KERNELS = "kernels.csv"  # --profile: the kernel (or op) table of each profiled row
    ANCHOR = "anchor.csv"  # the speed anchor's samples, per case and round (measure/anchor.py)
    ENV = "env.json"  # where and with what the run ran (store/env.py)
    ENV_RESUME = "env-resume-{time:%H%M%S}.json"  # the same, for each --resume
    GRID = "grid.json"  # what the run sweeps; a resumed run must sweep the same
    DRAWS = "draws.jsonl"  # one JSON line per case that draws data (run/measuring/inputs.py draws)
    ERRORS = "errors.log"  # the full error of each row whose reason had to be cut short
    TRACES = "traces"  # --profile: one Chrome trace per (case, impl)
    REPORT = "report.md"  # in <reports-dir>/<run-id>/, with its figures

    def __init__(self, path: Path | str):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __str__(self) -> str:
        return str(self.path)

    @property
    def run_id(self) -> str:
        return self.path.resolve().name

    @property
    def results(self) -> Path:
        return self.path / self.RESULTS

    @property
    def samples(self) -> Path:
        return self.path / self.SAMPLES

    @property
    def kernels(self) -> Path:
        return self.path / self.KERNELS

    @property
    def anchor(self) -> Path:
        return self.path / self.ANCHOR

    @property
    def env(self) -> Path:
        return self.path / self.ENV

    @property
    def grid(self) -> Path:
        return self.path / self.GRID

    @property
    def draws(self) -> Path:
        return self.path / self.DRAWS

    @property
    def errors(self) -> Path:
        return self.path / self.ERRORS

    @property
    def traces(self) -> Path:
        return self.path / self.TRACES

    def env_to_write(self, resume: bool) -> Path:
        """env.json for a new run; a resume keeps it and writes env-resume-HHMMSS.json."""
        return self.path / self.ENV_RESUME.format(time=datetime.now()) if resume else self.env

    def report_dir(self, reports_dir: Path | str) -> Path:
        """The folder of this run's report: <reports-dir>/<run-id>."""
        return Path(reports_dir) / self.run_id

    def report(self, reports_dir: Path | str) -> Path:
        return self.report_dir(reports_dir) / self.REPORT

    # -- starting or continuing a run ------------------------------------------------------
    @classmethod
    def choose(
        cls, results_dir: Path, run_id: str | None, *, resume: bool, default_id: str, grid: dict
    ) -> tuple[str, RunDir]:
        """The run's id and folder (not yet created), or UsageError: a bad id, a new run
        whose folder holds results, or a resume whose grid differs from the first run's."""
        if resume and not run_id:
            raise UsageError("--resume needs the --run-id of the run to continue")
        if run_id == "":
            raise UsageError(
                "--run-id is empty; give a name, or leave out --run-id for a dated one"
            )
        run_id = run_id or default_id
        if len(run_id) > RUN_ID_MAX:
            raise UsageError(
                f"--run-id {run_id[:20]}...: {len(run_id)} characters, at most {RUN_ID_MAX} "
                f"(it names the run's folder and its report's); give a shorter one"
            )
        if not RUN_ID.match(run_id):
            raise UsageError(
                f"--run-id {run_id!r}: use letters, digits, '.', '_' and '-' only (no path "
                f"separators)"
            )
        run = cls(Path(results_dir) / run_id)
        started = run.results.exists()
        if started and not resume:
            raise UsageError(
                f"--run-id {run_id}: {run.path} already holds results; add --resume "
                f"to continue it, or pick another --run-id"
            )
        if resume and not started:
            raise UsageError(
                f"--resume: {run.path} holds no {cls.RESULTS} to continue; check "
                f"--run-id and --results-dir"
            )
        if resume:
            run.check_same_grid(grid)
        return run_id, run

    def read_grid(self) -> dict:
        """grid.json, or {} when it is missing or unreadable."""
        try:
            return json.loads(self.grid.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}

    def write_grid(self, grid: dict) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.grid, grid)

    def check_same_grid(self, grid: dict) -> None:
        try:
            old = json.loads(self.grid.read_text())
        except (OSError, ValueError):
            raise UsageError(
                f"--resume: {self.grid} is missing or unreadable, so the "
                f"grid cannot be checked; start a new --run-id"
            ) from None
        for key in sorted(set(old) | set(grid)):
            if old.get(key) != grid.get(key):
                raise UsageError(
                    f"--resume: {first_difference(key, old.get(key), grid.get(key))}; "
                    f"resume with the same options or start a new --run-id"
                )

    # -- the line files --------------------------------------------------------------------
    def read_draws(self) -> dict[str, dict]:
        """The draws file: case label -> its record (the last one, if written twice); empty
        when the run drew nothing. A torn last line (a killed write) is skipped."""
        if not self.draws.is_file():
            return {}
        out = {}
        for line in self.draws.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            out[record["case"]] = record
        return out


def read_draws(run_dir: Path) -> dict[str, dict]:
    """The draws file of the run folder ``run_dir`` (RunDir.read_draws)."""
    return RunDir(run_dir).read_draws()


def append_line(path: Path, text: str) -> None:
    """``text`` (ending in a newline) appended to ``path``, flushed and fsynced; after a
    torn last line (a killed write) on a line of its own."""
    data = text.encode("utf-8")
    with open(path, "a+b") as f:
        if f.tell() > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                data = b"\n" + data
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def first_difference(key: str, was, now) -> str:
    """The first place two grid values differ, in words (lists: the first differing item)."""
    if isinstance(was, list) and isinstance(now, list):
        i = next((i for i, (a, b) in enumerate(zip(was, now)) if a != b), min(len(was), len(now)))
        a = was[i] if i < len(was) else f"no item (it had {len(was)})"
        b = now[i] if i < len(now) else f"no item (now {len(now)})"
        return f"{key} item {i + 1} was {a!r} in the run but is now {b!r}"
    return f"the run used {key}={was!r} but now {key}={now!r}"
