"""attnbench fidelity judges two back-to-back runs of one grid, both profiled: any other pair is
bad input (one line, exit 2, nothing written)."""

import json

import pandas as pd
import pytest
from synth import env, smoke_rows, write_run

from attnbench.cli import main
from attnbench.store.schema import CASE_KEY

SEQS = (64, 128, 256)


def run(root, name, seqs=SEQS, profile=("all",), grid=True):
    rows = smoke_rows(name, seqs=seqs)
    data = env()
    if profile is not False:
        data["profile"] = None if profile is None else list(profile)
    path = write_run(root, name, rows, data)
    if grid:
        cases = sorted({f"{r['impl']} {r['seq_q']} {r['mode']} {r['causal']}" for r in rows})
        impls = sorted({r["impl"] for r in rows})
        grid_json = {"device": "cpu", "impls": impls, "cases": cases}
        (path / "grid.json").write_text(json.dumps(grid_json))
    return path


def fidelity(a, b, out):
    return main(["fidelity", str(a), str(b), "--out", str(out)])


def test_two_profiled_runs_of_one_grid_are_judged(tmp_path, capsys):
    a, b = run(tmp_path, "a"), run(tmp_path, "b")
    assert fidelity(a, b, tmp_path / "out") == 0
    out = capsys.readouterr().out
    assert "fidelity: repeatability:" in out
    # where the runs ran, first, in the terminal and in both files
    assert out.startswith("fidelity: runs: A a and B b on ")
    text = (tmp_path / "out" / "fidelity.txt").read_text()
    assert text.startswith("runs: A a and B b on ") and "torch " in text.splitlines()[0]
    table = pd.read_csv(tmp_path / "out" / "fidelity.csv")
    assert table["device_name"].notna().all() and table["device_name"].nunique() == 1


@pytest.mark.parametrize(
    "b_kwargs, needle",
    [
        ({"profile": None}, "run B"),  # env.json says: made without --profile
        ({"profile": False}, "run B"),  # an older env.json without the field, no kernels.csv
        ({"seqs": (64, 128, 512)}, "sweep different grids (cases item"),
        ({"seqs": (64, 128, 512), "grid": False}, "sweep different grids (rows item"),
    ],
)
def test_other_pairs_are_refused(tmp_path, capsys, b_kwargs, needle):
    a, b = run(tmp_path, "a"), run(tmp_path, "b", **b_kwargs)
    assert fidelity(a, b, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err
    assert not (tmp_path / "out").exists()


def test_an_older_run_with_a_kernel_table_counts_as_profiled(tmp_path, capsys):
    a, b = run(tmp_path, "a", profile=False), run(tmp_path, "b", profile=False)
    for path in (a, b):
        (path / "kernels.csv").write_text(",".join([*CASE_KEY, "kernel"]) + "\n")
    assert fidelity(a, b, tmp_path / "out") == 0
