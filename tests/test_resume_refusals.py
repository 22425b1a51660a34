"""--resume reads what it continues before it writes: a damaged results.csv or env.json is
one line naming the file, exit 2, and the run folder exactly as it was."""

import pytest
from torchlog import own_lines

from attnbench.cli import main

GRID = [
    *("--device", "cpu", "--batch", "1", "--heads", "2", "--head-dim", "16", "--seq-len", "64"),
    *("--causal", "false", "--mode", "fwd", "--dtype", "fp32", "--rep-ms", "1"),
    *("--impls", "naive", "--no-isolate", "--no-progress", "--no-report", "--run-id", "r"),
]


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
    lines = own_lines(capsys.readouterr().err)
    assert len(lines) == 1 and str(run / name) in lines[0] and needle in lines[0], lines
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
