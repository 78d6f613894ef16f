"""The scripted expert plays toy-steps through the real Claude Code and the real OpenClaw (issue 28).

`claw_bench.families.expert_script(tasks, harness=H)` writes the expert's steps in H's own tools
(Claude Code's Read / Write, OpenClaw's read / write); claw-proxy's scripted engine renders them
in the student's (the tiny policy's) tool-call format, the proxy turns them into the harness's
API (Anthropic tool_use blocks, OpenAI tool_calls) and the real harness runs them in bwrap. The
recorded calls are in the student's tokens: SFT data (claw_tree.build_sft_samples), slips
included, as the quickstart's claw-agent teacher.
"""

from __future__ import annotations

import json

import claw_bench
import claw_rl
import claw_tree
import pytest
from _real import REAL, missing, per_harness, play, proxy, sandbox_env

TASKS = 2


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    """The tiny policy whose tokenizer and chat template the teacher's calls are recorded in."""
    return claw_rl.init_tiny(tmp_path_factory.mktemp("tiny") / "v0")


@pytest.mark.slow
@pytest.mark.parametrize("harness", sorted(REAL))
def test_expert_through_real_harness_is_sft_data(harness, student, tmp_path, monkeypatch):
    """Through the real harness the expert's rollouts pass (reward 1) except the slipped one
    (reward 0), every call is a scripted (teacher) call in the student's tokens, and the
    sessions build SFT samples whose trainable tokens are exactly the teacher's answers."""
    if why := missing(harness):
        pytest.skip(why)
    sandbox_env(monkeypatch)
    tasks = claw_bench.load_suite("claw-toy").select(tags=["toy-steps", "train"]).tasks[:TASKS]
    # slip 0.5 over 2 tasks: one task's expert stops one tool call early and fails
    lines = claw_bench.families.expert_script(tasks, slip=0.5, seed=0, harness=harness)
    script = tmp_path / "expert.jsonl"
    script.write_text("".join(json.dumps(x) + "\n" for x in lines))
    calls_file = tmp_path / "calls.jsonl"
    with proxy(f"scripted:{script}", calls_file, str(student), max_tokens=256) as server:
        batch = play(tasks, [harness], server.url, tmp_path / "runs.jsonl", "teach")
    outcomes = batch.outcomes
    assert [o["status"] for o in outcomes] == ["ok"] * TASKS, batch.runs
    slipped = {
        t.id for t in tasks if sum(x["tags"]["task"] == t.id for x in lines) < len(t.meta["expert"])
    }
    assert len(slipped) == 1
    assert {o["task"]: o["reward"] for o in outcomes} == {
        t.id: 0.0 if t.id in slipped else 1.0 for t in tasks
    }

    calls = [json.loads(x) for x in calls_file.read_text().splitlines() if x.strip()]
    assert calls and all(c.get("teacher") == "scripted" for c in calls)
    mine = per_harness(calls, outcomes)[harness]
    # one call per expert step: read, write, final answer (the slipped session: read, answer)
    per_session = sorted(sum(c["session"] == o["session"] for c in calls) for o in outcomes)
    assert per_session == [2, 3], per_session

    sft = claw_tree.build_sft_samples(mine["forest"], outcomes=outcomes)
    assert not sft.excluded and len(sft.samples) == TASKS  # slips included
    trained = sorted(
        tok for s in sft.samples for tok, t in zip(s["input_ids"], s["trainable"], strict=True) if t
    )
    assert trained == sorted(t for c in calls for t in c["completion_ids"])
    print(
        f"\n{harness}: {len(calls)} calls, {mine['prompt_tokens_per_call']:.0f} prompt tokens "
        f"per call, dedup (flat/tree) {mine['dedup_factor']:.2f}, "
        f"{sum(len(s['input_ids']) for s in sft.samples)} SFT tokens"
    )
