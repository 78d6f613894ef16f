"""Teacher trajectories through the same proxy (issue 17): claw-bench's expert solutions for the
toy-steps family, played by claw-proxy's scripted engine to the real tool-calling reference agent
(claw-agent over OpenAI chat and Anthropic Messages), pass the strict verifier and are recorded
as multi-turn calls in the student's tokenization that claw-tree merges into prefix trees."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from claw_bench import load_suite
from claw_bench.agent import run_agent
from claw_bench.families import expert_script
from claw_proxy import ProxyConfig, ProxyServer, mint_token
from claw_tree import build_forest, build_sft_samples, forest_stats
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "tiny-qwen3"
SECRET = "teacher-secret"


def _verify(task, ws: Path) -> bool:
    """Run the task's verifier on the final workspace as the sandbox would (exit 0 = pass)."""
    vdir = ws / ".claw_verify"
    vdir.mkdir()
    for name, text in {**task.hidden, task.verify.name: task.verify.text}.items():
        (vdir / name).write_text(text)
    env = {"CLAW_VERIFY_DIR": ".claw_verify", "CLAW_REWARD_FILE": ".claw_verify/reward.json"}
    r = subprocess.run(
        [sys.executable, "-I", f".claw_verify/{task.verify.name}"], cwd=ws, env=env, check=False
    )
    return r.returncode == 0


def test_expert_played_through_the_agent_is_recorded_for_the_student(tmp_path):
    """Each expert rollout passes; its 3 calls carry teacher: scripted, extend each other token for token, and pack as trees."""
    tasks = list(load_suite("claw-toy").select(tags=["toy-steps", "heldout"]).tasks[:2])
    script = tmp_path / "expert.jsonl"
    script.write_text("".join(json.dumps(x) + "\n" for x in expert_script(tasks)))
    record = tmp_path / "calls.jsonl"
    cfg = ProxyConfig(
        engine=f"scripted:{script}", tokenizer=str(TINY), secret=SECRET, record=str(record)
    )
    srv = ProxyServer(cfg).start()
    try:
        for api in ("chat", "anthropic"):
            for t in tasks:
                ws = tmp_path / f"{api}-{t.id}"
                ws.mkdir()
                for name, text in t.workspace.items():
                    (ws / name).write_text(text)
                key = mint_token(f"{api}-{t.id}", SECRET, {"task": t.id, "harness": api})
                text, turns, limited = run_agent(
                    t.instruction,
                    api=api,
                    model="claw-policy",
                    base_url=srv.url + ("/v1" if api == "chat" else ""),
                    api_key=key,
                    cwd=ws,
                    max_turns=4,
                    max_tokens=64,
                )
                assert (text, turns, limited) == ("done", 3, False)
                assert _verify(t, ws), (api, t.id)
    finally:
        srv.stop()
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(calls) == 3 * 2 * len(tasks)
    assert all(c["teacher"] == "scripted" and c["trainable"] for c in calls)
    tok = AutoTokenizer.from_pretrained(TINY)
    first = next(c for c in calls if c["seq"] == 0 and c["tags"]["harness"] == "anthropic")
    assert tok.decode(first["completion_ids"]).startswith('<tool_call>\n{"name": "read_file"')
    later = [c for c in calls if c["seq"] > 0]
    assert all(
        c["prefix"]["reused_tokens"] > 0 and c["prefix"]["fresh_render_matches"] for c in later
    )
    stats = forest_stats(build_forest(calls))
    assert stats["sessions"] == 4 and stats["trajectories"] == 4 and stats["dedup_factor"] > 1.5
    batch = build_sft_samples(build_forest(calls))
    assert len(batch.samples) == 4 and not batch.excluded
    # every completion token is an SFT target: 24 + 32 + 2 per expert rollout (read, write, done)
    assert [sum(s["trainable"]) for s in batch.samples] == [58] * 4


def test_a_slipping_teacher_fails_and_only_plain_imitation_keeps_it(tmp_path):
    """With slip 1 the expert reads, then says "done" without writing: 2 calls, the verifier
    fails, rejection sampling (passed_only) drops the rollout and plain imitation keeps it."""
    task = load_suite("claw-toy").select(tags=["toy-steps", "heldout"]).tasks[0]
    script = tmp_path / "expert.jsonl"
    script.write_text("".join(json.dumps(x) + "\n" for x in expert_script([task], slip=1.0)))
    record = tmp_path / "calls.jsonl"
    cfg = ProxyConfig(
        engine=f"scripted:{script}", tokenizer=str(TINY), secret=SECRET, record=str(record)
    )
    ws = tmp_path / "ws"
    ws.mkdir()
    for name, text in task.workspace.items():
        (ws / name).write_text(text)
    with ProxyServer(cfg) as srv:
        result = run_agent(
            task.instruction,
            api="chat",
            model="claw-policy",
            base_url=srv.url + "/v1",
            api_key=mint_token("slip-0", SECRET, {"task": task.id, "harness": "chat"}),
            cwd=ws,
            max_turns=4,
            max_tokens=64,
        )
    assert result == ("done", 2, False)
    assert not _verify(task, ws)
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(calls) == 2
    outcome = {
        **{"schema": "claw.outcome/v1", "session": "slip-0", "task": task.id, "harness": "chat"},
        **{"group": task.id, "status": "ok", "passed": False, "reward": 0.0},
    }
    forest = build_forest(calls)
    assert build_sft_samples(forest, outcomes=[outcome], passed_only=True).samples == []
    kept = build_sft_samples(forest, outcomes=[outcome]).samples
    assert len(kept) == 1 and sum(kept[0]["trainable"]) > 0
