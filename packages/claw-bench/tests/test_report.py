"""Reports on a hand-made outcomes file: numbers checked by hand, comparison, plot, JSON."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from claw_bench import ClawError, compare, plot_report, read_records, render_text, report

DATA = Path(__file__).parent / "data" / "outcomes_handmade.jsonl"
# Hand-made: per task passes out of 4 samples.
#   claw-agent-chat: 4, 3, 2, 1, 0  -> pass@1 = 0.5,  pass@2 = (1+1+5/6+1/2+0)/5, pass@4 = 0.8
#   openclaw-chat:   4, 4, 2, 2, 1  -> pass@1 = 0.65, pass@2 = (1+1+5/6+5/6+1/2)/5, pass@4 = 1.0
EXPECTED = {
    "claw-agent-chat": {1: 0.5, 2: (1 + 1 + 5 / 6 + 1 / 2 + 0) / 5, 4: 0.8},
    "openclaw-chat": {1: 0.65, 2: (1 + 1 + 5 / 6 + 5 / 6 + 1 / 2) / 5, 4: 1.0},
}


def _rep(**kw):
    return report(read_records(DATA, "claw.outcome/v1"), **kw)


def test_pass_at_k_per_harness_matches_hand_computation():
    """Pass@1, @2, @4 per harness equal the hand-computed means; infra errors are counted apart."""
    rep = _rep(ks=[1, 2, 4])
    rows = {h["harness"]: h for h in rep["harnesses"]}
    for h, want in EXPECTED.items():
        for k, v in want.items():
            cell = rows[h][f"pass@{k}"]
            assert math.isclose(cell["value"], v), (h, k)
            assert cell["lo"] <= cell["value"] <= cell["hi"]
    assert rows["openclaw-chat"]["infra_errors"] == 1 and rows["openclaw-chat"]["samples"] == 20
    assert rows["claw-agent-chat"]["tasks"] == 5
    assert math.isclose(rows["openclaw-chat"]["pass_rate"], 0.65) and math.isclose(
        rows["claw-agent-chat"]["mean_reward"], 0.55
    )


def test_not_scorable_outcomes_are_counted_apart():
    """not_scorable outcomes neither pass nor fail; they are counted in their own column."""
    rows = read_records(DATA, "claw.outcome/v1")
    rows.append(dict(rows[0], session="x", status="not_scorable", reward=None, passed=None))
    h = {r["harness"]: r for r in report(rows)["harnesses"]}["claw-agent-chat"]
    assert (h["not_scorable"], h["infra_errors"], h["samples"]) == (1, 0, 20)


def test_default_ks_and_per_task_rows():
    """Default k values are 1 and the largest sample count; per-task rows carry n, passes and CIs."""
    rep = _rep()
    assert rep["ks"] == [1, 4]
    t = [r for r in rep["tasks"] if r["harness"] == "claw-agent-chat" and r["task"] == "t1"][0]
    assert (t["n"], t["passed"]) == (4, 3) and math.isclose(t["pass@1"]["value"], 0.75)
    text = render_text(rep)
    assert "pass@4 (95% CI)" in text and "claw-agent-chat" in text and " 50.0 [" in text


def test_compare_before_after():
    """--compare: per harness and task, before/after and delta in Pass@k."""
    before = _rep()
    after_rows = [
        dict(o, passed=True, reward=1.0) if o["status"] == "ok" else o
        for o in read_records(DATA, "claw.outcome/v1")
    ]
    cmp = compare(before, report(after_rows, ks=before["ks"]))
    row = [r for r in cmp["harnesses"] if r["harness"] == "claw-agent-chat"][0]
    assert math.isclose(row["pass@1"]["delta"], 0.5) and math.isclose(
        row["pass@4"]["after"]["value"], 1.0
    )


def test_plot_writes_a_png(tmp_path):
    """--plot draws Pass@k bars with CI error bars to a PNG file (with and without a comparison)."""
    pytest.importorskip("matplotlib")
    rep = _rep()
    plot_report(rep, str(tmp_path / "a.png"))
    plot_report(rep, str(tmp_path / "b.png"), other=_rep())
    for name in ("a.png", "b.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_empty_and_bad_k():
    """No outcomes, or k < 1, are errors."""
    with pytest.raises(ClawError, match="no outcomes"):
        report([])
    with pytest.raises(ClawError, match="k must be"):
        _rep(ks=[0])
