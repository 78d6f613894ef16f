"""A reasoning session that outlives its prefix-cache entry records one path (issue 26).

Twelve calls of one Claude-Code-style session (Anthropic Messages, thinking blocks sent back as
they came) through claw-proxy, warm, with every call evicted from a 1-byte prefix cache, and with
the proxy restarted between calls; claw-tree builds each recording into a tree. Evicted and
restarted, the session reads its sampled ids back from the record series: one leaf and the same
tree as warm (before: a fresh render dropped the thinking, and every call became a new leaf)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from claw_proxy import ProxyConfig, ProxyServer, mint_token
from claw_tree import build_forest, forest_stats

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "tiny-qwen3"
SECRET = "miss-secret"
CALLS = 12


def _tool_call(i: int) -> str:
    args = json.dumps({"command": f"echo {i}"})
    return f'<tool_call>\n{{"name": "bash", "arguments": {args}}}\n</tool_call>'


def _record(tmp_path: Path, mode: str) -> Path:
    script = tmp_path / "script.jsonl"
    answers = [f"<think>turn {i}: what next?</think>\n\n{_tool_call(i)}" for i in range(CALLS)]
    script.write_text("".join(json.dumps({"text": a}) + "\n" for a in answers))
    cfg = ProxyConfig(
        engine=f"scripted:{script}",
        tokenizer=str(TINY),
        secret=SECRET,
        record=str(tmp_path / f"{mode}.jsonl"),
        prefix_cache_bytes=1 if mode == "evicted" else 1 << 30,
    )
    key = mint_token("rollout-1", SECRET, {"task": "t1"})
    tools = [{"name": "bash", "input_schema": {"type": "object"}}]
    msgs: list[dict] = [{"role": "user", "content": "work through it"}]
    srv = ProxyServer(cfg).start()
    try:
        for i in range(CALLS):
            if mode == "restarted" and i % 3 == 2:  # a restart every third call
                srv.stop()
                srv = ProxyServer(cfg).start()
            body = {"model": "claude-sonnet-4", "max_tokens": 256, "tools": tools, "messages": msgs}
            r = httpx.post(srv.url + "/v1/messages", json=body, headers={"x-api-key": key})
            assert r.status_code == 200, r.text
            content = r.json()["content"]
            assert content[0]["type"] == "thinking"
            msgs.append({"role": "assistant", "content": content})
            use = next(b for b in content if b["type"] == "tool_use")
            msgs.append(
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "ok"}],
                }
            )
    finally:
        srv.stop()
    return Path(cfg.record)


@pytest.fixture(scope="module")
def warm(tmp_path_factory) -> dict:
    return forest_stats(build_forest(_record(tmp_path_factory.mktemp("warm"), "warm")))


@pytest.mark.parametrize("mode", ["evicted", "restarted"])
def test_a_reasoning_session_that_outlives_its_cache_entry_is_one_path(mode, warm, tmp_path):
    """One leaf, the warm session's tree token for token, no re-render fork recorded."""
    stats = forest_stats(build_forest(_record(tmp_path, mode)))
    assert warm["trajectories"] == 1 and warm["calls"] == CALLS
    assert stats["trajectories"] == 1 and stats["branches"] == 0
    assert stats["tree_tokens"] == warm["tree_tokens"]
    assert stats["tree_token_ratio"] == warm["tree_token_ratio"]
    assert stats["rerender_forks"] == {} and stats["calls_reusing_prefix"] == CALLS - 1
