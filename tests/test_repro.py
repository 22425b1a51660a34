"""attnbench repro RUN ROW: the printed one-row command measures that row again (the same key,
plugin and seed included); report and repro load the run's plugins again (a mask kind of its
own), or take --plugin for one that moved."""

from __future__ import annotations

import json
import shlex
import textwrap

import pytest

from attnbench import plugins
from attnbench.cli import main
from attnbench.masks import KINDS
from attnbench.store.results import read_results, row_key

PLUGIN = textwrap.dedent(
    """
    import torch.nn.functional as F
    from attnbench.registry import register

    @register("plug_sdpa", masks=("window",))
    def plug_sdpa(q, k, v, *, causal, scale, mask):
        keep = mask.keep(q.shape[-2], k.shape[-2], causal, q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=scale,
                                              enable_gqa=True)
    """
)
QUIET = ["--no-report", "--no-progress", "--no-isolate"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two small runs: a plugin next to naive under window and document masks, and a
    Llama-3-8B decode step (labels model and phase)."""
    root = tmp_path_factory.mktemp("repro")
    plugin = root / "plug.py"
    plugin.write_text(PLUGIN)
    common = ["--batch", "1", "--kv-heads", "1", "--head-dim", "16", "--rep-ms", "2", *QUIET]
    a = ["sweep", "--impls", "naive,plug_sdpa", "--plugin", str(plugin), "--heads", "2"]
    a += ["--seq-len", "32", "--mask", "window,document", "--window", "8", "--docs", "fixed:16"]
    a += ["--causal", "both", "--mode", "fwd", "--seed", "3", "--threads", "1"]
    assert main([*a, *common, "--results-dir", str(root), "--run-id", "a"]) == 0
    b = ["sweep", "--impls", "naive", "--model", "llama3-8b", "--phase", "decode"]
    b += ["--seq-len-kv", "64", "--heads", "4"]
    assert main([*b, *common, "--results-dir", str(root), "--run-id", "b"]) == 0
    return root


def printed(capsys, run_dir, row) -> list[str]:
    capsys.readouterr()
    assert main(["repro", str(run_dir), str(row)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    return shlex.split(out[0])


@pytest.mark.parametrize(
    "run_id,pick",
    [
        ("a", lambda df: (df["impl"] == "plug_sdpa") & (df["mask"] == "window")),
        ("a", lambda df: (df["impl"] == "naive") & (df["mask"] == "document")),
        ("b", lambda df: df["seq_q"] == 4),
    ],
    ids=["plugin-window", "document", "model-decode"],
)
def test_the_printed_command_measures_the_same_row_again(runs, capsys, tmp_path, run_id, pick):
    df = read_results(runs / run_id)
    index = int(df.index[pick(df)][0])
    argv = printed(capsys, runs / run_id, index)
    assert argv[:2] == ["attnbench", "sweep"]
    assert argv[argv.index("--seed") + 1] == str(int(df.loc[index, "seed"]))
    if df.loc[index, "impl"] == "plug_sdpa":
        assert argv[argv.index("--plugin") + 1] == str(runs / "plug.py")
    out = tmp_path / "again"
    assert main([*argv[1:], "--results-dir", str(out), "--run-id", "r", *QUIET]) == 0
    again = read_results(out / "r")
    assert len(again) == 1
    assert row_key(again.iloc[0].to_dict()) == row_key(df.loc[index].to_dict())
    assert again.loc[0, "status"] == "ok"


def test_a_row_outside_the_run_is_bad_input(runs, capsys):
    n = len(read_results(runs / "a"))
    assert main(["repro", str(runs / "a"), str(n)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"attnbench repro: error: row {n}: {runs / 'a' / 'results.csv'} has rows 0 to {n - 1}"
    )


def test_every_measuring_option_is_given_back_by_the_reproducer():
    """options.py's measure scope is what env.json keeps and the reproducer writes back: each
    such option's flag parses to the value it was run with (a toggle: switched off)."""
    from attnbench.cli import build_parser
    from attnbench.options import MEASURE_OPTIONS, OPTIONS
    from attnbench.repro import measure_flags

    assert {"threads", "timeout", "isolate", "malloc_tunables"} <= set(MEASURE_OPTIONS)
    ran = {n: "false" if OPTIONS[n].style == "toggle" else "3" for n in MEASURE_OPTIONS}
    parsed = build_parser().parse_args(measure_flags(ran))
    assert {n: getattr(parsed, n) for n in MEASURE_OPTIONS} == ran


KIND = textwrap.dedent(
    """
    from attnbench.masks import Layout, MaskKind, register_kind

    class Every2(Layout):
        def rule(self, b, i, j, causal):
            return ((i - j) % 2 == 0) & (j <= i)

        def hidden(self, i, j, causal):
            return ((i - j).remainder(2) != 0)[None] | (j > i)[None]

    class Dilated(MaskKind):
        name = "every2"
        self_only = needs_causal = True

        def layout(self, case, seed):
            return Every2(case.seq_q, case.batch)

    register_kind(Dilated())
    """
)


def unload(plugin, monkeypatch) -> None:
    """As a new process finds the registry: the plugin's kind not registered, its file not
    loaded."""
    KINDS.pop("every2", None)
    monkeypatch.setattr(plugins, "_LOADED", plugins._LOADED - {str(plugin.resolve())})


@pytest.fixture
def kind_run(tmp_path, monkeypatch):
    """A one-row run of a plugin's mask kind (naive, forward), the plugin unloaded after."""
    plugin = tmp_path / "every2.py"
    plugin.write_text(KIND)
    argv = ["sweep", "--impls", "naive", "--plugin", str(plugin), "--mask", "every2"]
    argv += ["--causal", "true", "--batch", "1", "--heads", "2", "--seq-len", "16"]
    argv += ["--head-dim", "8", "--mode", "fwd", "--rep-ms", "1", *QUIET]
    assert main([*argv, "--results-dir", str(tmp_path), "--run-id", "k"]) == 0
    unload(plugin, monkeypatch)
    yield tmp_path / "k", plugin
    KINDS.pop("every2", None)


def test_report_and_repro_of_a_plugin_kind_run_load_its_plugin(kind_run, capsys, monkeypatch):
    run, plugin = kind_run
    env = json.loads((run / "env.json").read_text())
    assert [sorted(p) for p in env["plugins"]] == [["path", "sha256"]]
    assert env["plugins"][0]["path"] == str(plugin.resolve())
    capsys.readouterr()
    assert main(["report", str(run), "--reports-dir", str(run.parent / "reports")]) == 0
    loaded = f"plugins: loaded {plugin.resolve()} (recorded by the run)"
    assert capsys.readouterr().err.strip() == loaded
    unload(plugin, monkeypatch)
    assert main(["repro", str(run), "0"]) == 0
    out, err = capsys.readouterr()
    assert err.strip() == loaded
    argv = shlex.split(out.strip())
    assert argv[argv.index("--plugin") + 1] == str(plugin.resolve())
    again = run.parent / "again"
    assert main([*argv[1:], "--results-dir", str(again), "--run-id", "r", *QUIET]) == 0
    (row,) = read_results(again / "r").to_dict("records")
    assert row["mask"] == "every2" and row["status"] == "ok" and row["agrees"] is True


def test_a_plugin_that_moved_is_named_with_the_fix(kind_run, capsys):
    run, plugin = kind_run
    moved = plugin.rename(plugin.with_name("moved.py"))
    capsys.readouterr()
    assert main(["repro", str(run), "0"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"attnbench repro: error: the run's plugin {plugin.resolve()} is gone (moved or "
        "deleted): give its file with --plugin PATH"
    )
    moved.write_text(KIND + "# edited since the run\n")
    assert main(["repro", str(run), "0", "--plugin", str(moved)]) == 0
    out, err = capsys.readouterr()
    assert err.strip() == f"plugins: loaded {moved.resolve()} (--plugin)"
    assert f"--plugin {moved.resolve()}" in out
    moved.rename(plugin)
    KINDS.pop("every2", None)
    assert main(["repro", str(run), "0"]) == 0
    assert "(changed since the run: its sha256 differs)" in capsys.readouterr().err


def test_the_documented_repro_transcript_is_what_repro_prints(tmp_path, monkeypatch, capsys):
    """docs/cli.md's transcript: its sweep, run here, then its repro, print its output line."""
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text()
    block = text.split("$ attnbench sweep ", 1)[1].split("```", 1)[0].strip().splitlines()
    sweep_line, repro_line, printed = block
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", *shlex.split(sweep_line), "--no-progress", "--no-report"]) == 0
    capsys.readouterr()
    assert main(shlex.split(repro_line.removeprefix("$ attnbench "))) == 0
    assert capsys.readouterr().out.strip() == printed
