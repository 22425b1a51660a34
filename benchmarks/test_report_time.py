"""benchmarks/report_time.py, run once on a small committed run with this checkout's code:
every try is timed, with the CPU its interpreter and drawing processes used."""

import re
from pathlib import Path

import report_time

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "results" / "fidelity-a-nvidia-h100-80gb-hbm3"


def test_each_try_says_its_wall_and_cpu_time(capsys):
    walls = report_time.main([str(RUN), "--repeat", "1", "--code", str(ROOT)])
    out = capsys.readouterr().out
    line = re.search(r"try 1 \S+: ([\d.]+) s, CPU ([\d.]+) s  \(load ", out)
    assert line, out
    assert float(line[1]) > 0 and float(line[2]) > 0  # the report's CPU, children included
    assert list(walls) == [str(ROOT)] and len(walls[str(ROOT)]) == 1
    assert f"median {ROOT}: " in out
    assert f"{ROOT}: times {ROOT / 'attnbench'}" in out


def test_a_checkout_is_timed_with_its_own_attnbench(tmp_path, monkeypatch):
    """--code DIR times DIR's attnbench, wherever the benchmark is started from."""
    (tmp_path / "attnbench").mkdir()
    (tmp_path / "attnbench" / "__init__.py").write_text("")
    monkeypatch.chdir(ROOT)  # a folder with an attnbench of its own
    assert report_time.timed_package(str(tmp_path)) == str(tmp_path / "attnbench")
