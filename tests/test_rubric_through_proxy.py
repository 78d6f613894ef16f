"""Rubric chains judged through claw-proxy (issue 29): claw-bench asks each criterion of a chain
as one request to the proxy (its scripted engine stands in for any policy or passthrough
endpoint), and every verdict's call_id is the claw.call/v1 record of the judge call that gave it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from claw_bench.loaders import Judge, JudgeCache
from claw_bench.score import score_run
from claw_proxy import ProxyConfig, ProxyServer, mint_token, read_calls

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "tiny-qwen3"
SECRET = "judge-secret"
CHAIN = [
    {"id": "exists", "text": "memo.md exists.", "weight": 2},
    {"id": "bullets", "text": "memo.md has one bullet per decision.", "requires": ["exists"]},
    {"id": "tone", "text": "memo.md is neutral in tone."},
]


def _run() -> dict:
    return {
        "schema": "claw.run/v1",
        "job_id": "j1",
        "status": "ok",
        "exit_code": 0,
        "verify": {"exit_code": 0, "passed": True, "reward": 1.0},
        "collected": {"memo.md": "# Memo\n- ship Friday\n"},
        "stdout_tail": "memo.md written",
        "meta": {
            "session": "s1",
            "task": "memo",
            "harness": "h",
            "judge": {"instruction": "Write memo.md", "criteria": CHAIN},
        },
    }


@pytest.mark.parametrize(
    ("api", "answer", "verdicts", "reward"),
    [
        ("openai", "YES", ["pass", "pass", "pass"], 1.0),
        ("anthropic", "NO", ["fail", "skipped", "fail"], 0.0),
    ],
)
def test_chain_verdicts_link_to_the_proxys_call_records(tmp_path, api, answer, verdicts, reward):
    """The scripted policy answers every criterion alike (each request is a first turn): all YES
    passes; all NO fails exists, so bullets is never sent. Each asked verdict's call_id is a
    recorded call, in chain order; scoring again with the cache sends nothing."""
    script = tmp_path / "judge.jsonl"
    script.write_text(json.dumps({"text": answer}) + "\n")
    record = tmp_path / "calls.jsonl"
    cfg = ProxyConfig(
        engine=f"scripted:{script}", tokenizer=str(TINY), secret=SECRET, record=str(record)
    )
    srv = ProxyServer(cfg).start()
    try:
        judge = Judge(
            base_url=srv.url + ("/v1" if api == "openai" else ""),
            model="judge",
            api=api,
            api_key=mint_token("judge-session", SECRET, {"role": "judge"}),
            cache=JudgeCache(tmp_path / "cache.jsonl"),
        )
        out = score_run(_run(), judge=judge)
        again = score_run(_run(), judge=judge)
    finally:
        srv.stop()
    assert out["status"] == "ok" and out["reward"] == reward
    got = out["details"]["criteria"]
    assert [v["verdict"] for v in got] == verdicts
    calls = sorted(read_calls(record), key=lambda c: c.seq)
    assert [v["call_id"] for v in got if v["verdict"] != "skipped"] == [c.call_id for c in calls]
    assert len(calls) == sum(v != "skipped" for v in verdicts)
    assert again["reward"] == reward and len(list(read_calls(record))) == len(calls)
