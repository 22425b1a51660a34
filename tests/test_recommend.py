"""Recommendations per workload, a kernel as one contestant, and case labels that tell the
cases of a table apart."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
from synth import ok_row

from attnbench.case import Case
from attnbench.report.decide import verdicts
from attnbench.report.decide.recommend import TOLERANCE, recommendations

ROOT = Path(__file__).resolve().parent.parent
REPORTS = ROOT / "reports"


def decode(batch, new_tokens, cache):
    return Case(batch, 32, 8, new_tokens, cache, 128, dtype="bfloat16", causal=True,
                causal_align="bottom_right", model="llama3-8b", phase="decode")  # fmt: skip


def decode_rows(time_of):
    """Decode rows over B {1, 32} x new tokens {1, 4} x cache {4096, 32768}; time_of(impl,
    case) gives each impl's time."""
    rows = []
    for b in (1, 32):
        for sq in (1, 4):
            for skv in (4096, 32768):
                case = decode(b, sq, skv)
                rows += [ok_row("r", i, case, time_of(i, case), 1.0) for i in ("one", "four")]
    return pd.DataFrame(rows)


def test_a_phase_whose_winner_changes_with_new_tokens_is_split_there():
    # "one" is best for one new token, 3x slower for four; "four" the other way round
    def time_of(impl, c):
        fast = (impl == "one") == (c.seq_q == 1)
        return c.batch * c.seq_kv * (1.0 if fast else 3.0)

    rec = recommendations(decode_rows(time_of))
    assert list(rec["workload"]) == ["Sq=1 B=1,32 Skv=4096,32768", "Sq=4 B=1,32 Skv=4096,32768"]
    assert list(rec["part"]) == ["1-token decode", "4-token decode"]
    assert list(rec["impl"]) == ["one", "four"]
    assert (rec["worst_loss"] == 1.0).all() and (rec["wins"] == 4).all()


def test_a_pick_that_loses_somewhere_says_where_and_never_by_more_than_the_tolerance():
    # "one" wins everywhere but at B32 Sq4 Skv32768, where it is 1.05x slower: one pick per
    # number of new tokens, with its loss and where; at 1.2x there (over the 1.10x
    # tolerance) the 4-token part is split instead, unless --tolerance allows 1.25x
    def time_of(slower):
        def t(impl, c):
            worst = c.batch == 32 and c.seq_q == 4 and c.seq_kv == 32768
            if impl == "one":
                return slower if worst else 1.0
            return 1.0 if worst else 2.0

        return t

    rec = recommendations(decode_rows(time_of(1.05)))
    assert list(rec["impl"]) == ["one", "one"] and list(rec["where"]) == ["", ""]
    assert rec.loc[1, "worst_loss"] == pytest.approx(1.05)
    assert rec.loc[1, "worst_at"] == "Sq=4 B=32 Skv=32768"
    assert TOLERANCE == pytest.approx(1.10)
    split = recommendations(decode_rows(time_of(1.2)))
    assert len(split) > 2 and (split["worst_loss"] <= TOLERANCE).all()
    assert "four" in set(split["impl"]) and "one" in set(split["impl"])
    loose = recommendations(decode_rows(time_of(1.2)), tolerance=1.25)
    assert len(loose) == 2 and loose.loc[1, "worst_loss"] == pytest.approx(1.2)


def alias_rows():
    rows = []
    for n in (1024, 4096):
        case = Case(1, 16, 16, n, n, 128, dtype="bfloat16", device="cuda", model="llama3-8b",
                    phase="prefill")  # fmt: skip
        for impl, backend, t in (
            ("sdpa", "cudnn", 1.00),
            ("sdpa_cudnn", "cudnn", 0.99),  # the same kernel, a hair faster by noise
            ("sdpa_flash", "flash", 1.60),
            ("triton_flash", None, 1.50),
        ):
            rows.append({**ok_row("r", impl, case, t, 1.0), "backend": backend})
    return pd.DataFrame(rows)


def test_an_alias_is_one_contestant_and_the_margin_is_over_the_next_kernel():
    w = verdicts.fastest_agreeing(alias_rows())  # the kernel with its fastest row's time
    assert (w["impl"] == "sdpa_cudnn").all() and (w["same_kernel"] == "sdpa").all()
    assert (w["runner_up"] == "triton_flash").all()
    assert w["margin"].to_numpy() == pytest.approx([1.5 / 0.99, 1.5 / 0.99])
    rec = recommendations(alias_rows()).iloc[0]
    assert rec["impl"] == "sdpa" and rec["same_kernel"] == "sdpa_cudnn"
    assert rec["worst_loss"] == 1.0  # sdpa_cudnn's 1% is the same kernel's noise, not a loss
    assert rec["margin"] == pytest.approx(1.5) and rec["runner_up"] == "triton_flash"


def tables(text: str) -> list[list[dict]]:
    """Every markdown table of a report as a list of {header: cell} rows."""
    out, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|---") and i > 0 and lines[i - 1].startswith("|"):
            head = [h.strip() for h in lines[i - 1].strip("|").split(" | ")]
            rows = []
            for row in lines[i + 1 :]:
                if not row.startswith("|"):
                    break
                rows.append(dict(zip(head, (c.strip() for c in row.strip("|").split(" | ")))))
            out.append(rows)
    return out


def label_clashes(text: str) -> list[str]:
    """Case labels that two cases of one table share: within a cell that lists cases, and
    within a column of cases for one impl."""
    clashes = []
    for rows in tables(text):
        for col in rows[0] if rows else {}:
            if col not in ("case", "cases") and not col.startswith("each case"):
                continue
            seen = set()
            for r in rows:
                impl = r.get("impl", "")
                listed = [re.sub(r":.*$", "", p) for p in r[col].split("; ") if "more" not in p]
                if len(listed) != len(set(listed)):
                    clashes.append(f"{col}: {r[col][:120]}")
                if col == "case" and (impl, r[col]) in seen:
                    clashes.append(f"{col}: {impl} {r[col]}")
                seen.add((impl, r[col]))
    return clashes + _list_clashes(text)


def _list_clashes(text: str) -> list[str]:
    """Case labels repeated within one impl's folded list of cases ('- **impl**, family:'
    and its '  - label: value' lines)."""
    clashes, seen, head = [], set(), ""
    for line in text.splitlines():
        if line.startswith("- **"):
            head, seen = line, set()
        elif line.startswith("  - ") and head:
            label = re.sub(r":.*$", "", line[4:])
            if label in seen:
                clashes.append(f"{head} {label}")
            seen.add(label)
        else:
            head = ""
    return clashes


@pytest.mark.parametrize("report", sorted(REPORTS.glob("*/report.md")), ids=lambda p: p.parent.name)
def test_every_case_label_in_every_committed_report_is_unique_within_its_table(report):
    text = report.read_text()
    assert tables(text), "the parser found no table"
    assert label_clashes(text) == []


def test_the_label_check_catches_a_table_whose_labels_hide_a_dimension():
    text = "| impl | each case |\n|---|---|\n| sdpa | 4096: 0.39x; 4096: 0.47x |\n"
    assert label_clashes(text) == ["each case: 4096: 0.39x; 4096: 0.47x"]
    text = "- **sdpa**, decode:\n  - 4096: 0.39x\n  - 4096: 0.47x\n"
    assert label_clashes(text) == ["- **sdpa**, decode: 4096"]


def test_a_case_where_only_the_pick_ran_leaves_its_margin_to_the_others():
    rows = alias_rows()
    lone = rows["seq_q"] == 4096
    rows = rows[~lone | (rows["impl"] == "sdpa")]  # at 4096 only sdpa ran
    rec = recommendations(rows).iloc[0]
    assert rec["impl"] == "sdpa" and rec["runner_up"] == "triton_flash"
    assert rec["margin"] == pytest.approx(1.5)  # from the case where others ran


def test_a_pick_whose_precision_is_below_fp32_accumulation_is_marked():
    rows = alias_rows()
    rows["precision_low"] = (rows["impl"] == "sdpa") & (rows["seq_q"] == 4096)
    rec = recommendations(rows).iloc[0]
    assert rec["impl"] == "sdpa" and "precision below fp32 accumulation in 1 case" in rec["marks"]
    assert "precision" not in recommendations(alias_rows()).iloc[0]["marks"]


def losing_rows(contended_at=None):
    """Two decode cases: "a" is 2x faster at Skv=4096 and 1.06x slower than "b" at 32768;
    ``contended_at``: the cache length whose rows were contended."""
    rows = []
    for skv, (ta, tb) in ((4096, (1.0, 2.0)), (32768, (1.06, 1.0))):
        c = decode(1, 1, skv)
        busy = {"contended": skv == contended_at}
        rows += [{**ok_row("r", i, c, t, 1.0), **busy} for i, t in (("a", ta), ("b", tb))]
    return pd.DataFrame(rows)


def with_noise(winners: pd.DataFrame, noise: float) -> pd.DataFrame:
    """The winners with each margin's paired interval ``noise`` either way."""
    margin = winners["margin"].astype(float)
    return winners.assign(margin_lo=margin / noise, margin_hi=margin * noise)


def test_a_pick_may_lose_only_what_the_noise_cannot_tell_from_no_loss():
    # "a" loses 6% at Skv=32768: under the 1.10x cap, so one pick without a measured noise;
    # where the noise is 1% the run tells that 6% apart and the part is split, where it is
    # 8% it cannot, and "a" stays the one pick
    rows = losing_rows()
    winners = verdicts.fastest_agreeing(rows)
    capped = recommendations(rows, winners=winners)
    assert list(capped["impl"]) == ["a"] and capped.loc[0, "worst_loss"] == pytest.approx(1.06)
    assert capped.loc[0, "tolerance_max"] == pytest.approx(TOLERANCE)
    quiet = recommendations(rows, winners=with_noise(winners, 1.01))
    assert list(quiet["impl"]) == ["a", "b"] and (quiet["worst_loss"] == 1.0).all()
    assert list(quiet["tolerance_max"]) == pytest.approx([1.01, 1.01])
    loud = recommendations(rows, winners=with_noise(winners, 1.08))
    assert list(loud["impl"]) == ["a"] and loud.loc[0, "tolerance_min"] == pytest.approx(1.08)
    # a noise over the cap is held to the cap, and --tolerance still sets the cap
    assert recommendations(rows, winners=with_noise(winners, 1.3)).loc[0, "tolerance_max"] == 1.1
    strict = recommendations(rows, tolerance=1.02, winners=with_noise(winners, 1.08))
    assert list(strict["impl"]) == ["a", "b"]


def test_the_noise_is_read_from_the_rounds_and_the_table_says_the_tolerance(tmp_path):
    from synth import write_rounds_run

    from attnbench.report.analyse.rounds import Rounds
    from attnbench.report.render.picks import picks_table
    from attnbench.store.results import read_results

    run = write_rounds_run(tmp_path, "q", losing_rows().to_dict("records"), baseline="a",
                           noise=0.01)  # fmt: skip
    rec = recommendations(read_results(run), Rounds.read(run))
    assert list(rec["impl"]) == ["a", "b"]  # 1% noise: the 6% loss is told apart
    assert (rec["tolerance_max"] < 1.03).all()
    text = "\n".join(picks_table(rec, {}))
    assert "tolerance (the noise, ≤ cap)" in text and "| 1.01x |" in text


def test_a_pick_resting_on_contended_rows_says_so_and_its_verdict_is_no_fact():
    from attnbench.report.decide.parts import part_verdicts
    from attnbench.report.render.picks import picks_table, verdict_lines

    rows = losing_rows(contended_at=32768)  # "a" loses 6% (under the cap) on contended rows
    rec = recommendations(rows)
    assert list(rec["impl"]) == ["a"] and rec.loc[0, "contended"] == 1
    said = "contended in 1 of 2 cases: re-measure on a quiet machine"
    assert said in "\n".join(picks_table(rec, {}))
    line = verdict_lines(part_verdicts(rec))[0]
    assert line.startswith(f"- **1-token decode**: a ({said}), within 1.06x")
    quiet = recommendations(losing_rows())
    assert (
        quiet.loc[0, "contended"] == 0 and "contended" not in verdict_lines(part_verdicts(quiet))[0]
    )
    # the rival's row counts too: contended where "a" wins, only "b"'s row
    rows.loc[(rows["seq_kv"] == 4096) & (rows["impl"] == "b"), "contended"] = True
    assert recommendations(rows).loc[0, "contended"] == 2


@pytest.mark.skipif(not (ROOT / "results" / "llama3-8b-cpu-2core-xeon").exists(), reason="no run")
def test_the_picks_reuse_the_analysis_winners_and_decide_the_same():
    from attnbench.report.analyse.rounds import Rounds
    from attnbench.report.analysis import analyse
    from attnbench.store.results import load_run

    run = ROOT / "results" / "llama3-8b-cpu-2core-xeon"
    df, env = load_run(run)
    rounds = Rounds.read(run)
    a = analyse(df, env, "r", rounds=rounds)
    pd.testing.assert_frame_equal(a.recommendations, recommendations(df, rounds))
    assert [v.label for v in a.verdicts] == ["prefill", "1-token decode", "4-token decode"]
