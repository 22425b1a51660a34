"""What the run folder's store refuses or survives: --resume reads what it continues before it
writes (a damaged results.csv or env.json is one line naming the file, exit 2, and the run
folder exactly as it was); a full disk and a run id no folder can have are one line, exit 2;
a report reads no torn last line as a row and refuses a results.csv with no rows or no
time_ms in one line."""

import errno
import io
import os

import pandas as pd
import pytest
from torchlog import own_lines

from attnbench.cli import main

GRID = [
    *("--device", "cpu", "--batch", "1", "--heads", "2", "--head-dim", "16", "--seq-len", "64"),
    *("--causal", "false", "--mode", "fwd", "--dtype", "fp32", "--rep-ms", "1"),
    *("--impls", "naive", "--no-isolate", "--no-progress", "--no-report", "--run-id", "r"),
]


def _said(capsys) -> list[str]:
    """stderr's lines but a busy machine's warning."""
    return [x for x in own_lines(capsys.readouterr().err) if not x.startswith("warning: load")]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    res = tmp_path_factory.mktemp("resume")
    assert main(["sweep", *GRID, "--results-dir", str(res)]) == 0
    return {p.name: p.read_bytes() for p in (res / "r").iterdir() if p.is_file()}


def _damage(tmp_path, finished, name: str, data: bytes):
    run = tmp_path / "r"
    run.mkdir()
    for file, content in {**finished, name: data}.items():
        (run / file).write_bytes(content)
    return run


@pytest.mark.parametrize(
    "name, damage, needle",
    [
        ("results.csv", b"garbage,not,a,header\n1,2,3,4\n5,6", "header lacks"),
        ("results.csv", None, "line 3 is not a row"),  # a whole line that is no row
        ("env.json", b'{"python": "3.1', "not valid JSON"),
    ],
)
def test_a_damaged_run_is_refused_before_anything_is_written(
    tmp_path, capsys, finished, name, damage, needle
):
    data = damage if damage is not None else finished[name] + b"1,2,3\n"
    run = _damage(tmp_path, finished, name, data)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    capsys.readouterr()
    assert main(["sweep", *GRID, "--results-dir", str(tmp_path), "--resume"]) == 2
    lines = _said(capsys)
    assert len(lines) == 1 and str(run / name) in lines[0] and needle in lines[0], lines
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_a_full_disk_before_the_first_row_is_one_line_and_the_same_command_then_runs(
    tmp_path, capsys
):
    run = tmp_path / "r"
    run.mkdir()
    (run / "samples.csv").symlink_to("/dev/full")  # every write to it: ENOSPC
    capsys.readouterr()
    assert main(["sweep", *GRID, "--results-dir", str(tmp_path)]) == 2
    lines = _said(capsys)
    assert len(lines) == 1, lines
    assert "No space left on device (writing" in lines[0] and "samples.csv" in lines[0]
    assert "run the same command again" in lines[0]
    (run / "samples.csv").unlink()
    assert main(["sweep", *GRID, "--results-dir", str(tmp_path)]) == 0
    assert len((run / "results.csv").read_text().splitlines()) == 2


def test_a_disk_full_mid_sweep_is_one_line_with_the_resume_that_finishes_it(
    tmp_path, capsys, monkeypatch
):
    grid = [*GRID, "--seq-len", "32,64,96"]
    calls, fsync = [], os.fsync

    def full_after_a_row(fd):
        calls.append(fd)
        if len(calls) > 3:  # the first row's samples, anchor and row are written
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", full_after_a_row)
    capsys.readouterr()
    assert main(["sweep", *grid, "--results-dir", str(tmp_path)]) == 2
    lines = _said(capsys)
    assert len(lines) == 1 and "No space left on device (writing" in lines[0], lines
    resume = lines[0].split("continue with: attnbench sweep ")[1].split()
    assert resume[-3:] == ["--results-dir", str(tmp_path), "--resume"], resume
    monkeypatch.setattr(os, "fsync", fsync)
    assert main(["sweep", *resume]) == 0
    rows = pd.read_csv(tmp_path / "r" / "results.csv")
    assert sorted(rows["seq_kv"]) == [32, 64, 96]


@pytest.mark.parametrize(
    "run_id, needle",
    [("x" * 300, "300 characters, at most 100"), ("", "--run-id is empty")],
)
def test_a_run_id_no_folder_can_have_is_one_line(tmp_path, capsys, run_id, needle):
    capsys.readouterr()
    assert main(["sweep", *GRID[:-1], run_id, "--results-dir", str(tmp_path)]) == 2
    lines = _said(capsys)
    assert len(lines) == 1 and needle in lines[0], lines
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "damage, needle",
    [
        ("drop time_ms", "lacks columns time_ms"),  # no number, yet "all ok rows agree"
        ("header only", "has no rows, only its header"),
    ],
)
def test_a_report_on_results_it_cannot_read_as_measured_is_one_line(
    tmp_path, capsys, finished, damage, needle
):
    table = pd.read_csv(io.BytesIO(finished["results.csv"]), dtype=str, keep_default_na=False)
    table = table.iloc[:0] if damage == "header only" else table.drop(columns="time_ms")
    run = _damage(tmp_path, finished, "results.csv", table.to_csv(index=False).encode())
    capsys.readouterr()
    assert main(["report", str(run), "--reports-dir", str(tmp_path / "rep")]) == 2
    lines = _said(capsys)
    assert len(lines) == 1 and needle in lines[0], lines
    assert not (tmp_path / "rep").exists()


def test_a_torn_last_line_is_no_row_of_the_report(tmp_path, finished):
    from attnbench.store.results import read_results

    whole = finished["results.csv"]
    torn = whole + whole.splitlines(keepends=True)[1][:40]  # a row cut off by a kill
    run = _damage(tmp_path, finished, "results.csv", torn)
    assert len(read_results(run)) == len(whole.splitlines()) - 1
    assert (run / "results.csv").read_bytes() == torn  # reading never writes
