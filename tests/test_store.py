"""The run folder on disk (attnbench/store/): rows appended durably, a torn last line cut,
resume's done keys and the samples of rows that never reached results.csv dropped, and the
run folder chosen or refused before anything is written."""

import csv

import pytest
from synth import ok_row

from attnbench.case import Case
from attnbench.errors import UsageError
from attnbench.store.results import (
    CsvAppender,
    done_keys,
    repair_tail,
    row_key,
    row_writer,
    samples_writer,
)
from attnbench.store.rundir import RunDir
from attnbench.store.schema import SAMPLE_COLUMNS


def test_an_appender_with_no_row_writes_no_file(tmp_path):
    path = tmp_path / "x.csv"
    with CsvAppender(path, ("a", "b")) as out:
        out.write([])
    assert not path.exists()
    with CsvAppender(path, ("a", "b")) as out:
        out.write({"a": 1})
    with CsvAppender(path, ("a", "b")) as out:  # appended to: one header
        out.write({"a": 2, "b": "x"})
    assert path.read_text().splitlines() == ["a,b", "1,", "2,x"]


def test_a_torn_last_line_is_cut_and_a_whole_file_left_alone(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("a,b\n1,2\n3,")
    assert repair_tail(path) is True and path.read_text() == "a,b\n1,2\n"
    assert repair_tail(path) is False and path.read_text() == "a,b\n1,2\n"
    assert repair_tail(tmp_path / "missing.csv") is False


def test_done_keys_are_the_written_rows_and_orphan_samples_are_dropped(tmp_path):
    kept, lost = (ok_row("r", "naive", Case(1, 2, 2, s, s, 16), 1.0, 1.0) for s in (64, 128))
    with row_writer(tmp_path) as rows:
        rows.write(kept)
    with samples_writer(tmp_path) as samples:  # the second row was killed before its row
        samples.write([{**r, "sample": 0, "time_ms": 1.0, "round": 0} for r in (kept, lost)])
    with open(RunDir(tmp_path).results, "a") as f:
        f.write("naive,torn")  # a write cut off by a kill
    keys = done_keys(tmp_path)
    assert list(keys) == [row_key(kept)]
    with open(RunDir(tmp_path).samples, newline="") as f:
        left = list(csv.DictReader(f))
    assert [row_key(r) for r in left] == [row_key(kept)] and list(left[0]) == list(SAMPLE_COLUMNS)


@pytest.mark.parametrize(
    "run_id, resume, started, needle",
    [
        ("a/b", False, False, "use letters, digits"),
        ("r", False, True, "already holds results; add --resume"),
        ("r", True, False, "holds no results.csv to continue"),
        (None, True, False, "--resume needs the --run-id"),
    ],
)
def test_a_run_folder_is_refused_before_anything_is_written(
    tmp_path, run_id, resume, started, needle
):
    if started:
        (tmp_path / "r").mkdir()
        (tmp_path / "r" / RunDir.RESULTS).write_text("impl\n")
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(UsageError, match=needle):
        RunDir.choose(tmp_path, run_id, resume=resume, default_id="d", grid={})
    assert sorted(tmp_path.rglob("*")) == before


def test_a_resume_with_another_grid_names_the_first_difference(tmp_path):
    _, run = RunDir.choose(tmp_path, "r", resume=False, default_id="d", grid={})
    run.write_grid({"seq_len": [64], "dtype": ["float32"]})
    run.results.write_text("impl\n")
    same = {"seq_len": [64], "dtype": ["float32"]}
    assert RunDir.choose(tmp_path, "r", resume=True, default_id="d", grid=same)[1].path == run.path
    with pytest.raises(UsageError, match="seq_len"):
        RunDir.choose(tmp_path, "r", resume=True, default_id="d", grid={**same, "seq_len": [128]})
