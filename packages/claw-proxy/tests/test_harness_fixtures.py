"""Real harness requests (captured from Claude Code, Codex, OpenClaw, mini-swe-agent, opencode,
pi) replayed through the proxy: each renders, answers and is recorded."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import jsonschema
import pytest
from claw_proxy import api_anthropic, api_chat, api_responses, read_calls
from claw_proxy.render import Renderer
from proxy_testlib import HARNESS_REQUESTS, ROOT, TINY, token, tool_call_text

FIXTURES = sorted(HARNESS_REQUESTS.glob("*.json"))
_API = {
    "/v1/messages": api_anthropic,
    "/v1/chat/completions": api_chat,
    "/v1/responses": api_responses,
}


def _load(path):
    d = json.loads(path.read_text())
    return d["path"], d["body"]


def test_fixtures_exist():
    """The captured requests cover the three APIs."""
    paths = {_load(p)[0].split("?")[0] for p in FIXTURES}
    assert paths == set(_API)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_fixture_renders(path):
    """Every captured request parses and renders; system prompts and tools land in the prompt."""
    route, body = _load(path)
    req = _API[route.split("?")[0]].parse(body)
    r = Renderer(str(TINY))
    ids = r.render_full(req)
    text = r.tokenizer.decode(ids)
    assert text.endswith("<|im_start|>assistant\n")
    if req.tools:
        assert "<tools>" in text and req.tools[0]["function"]["name"] in text
    assert req.messages[-1].content.strip()[-20:] in text or req.messages[-1].role == "tool"


def test_fixtures_replayed_through_the_proxy(make_server):
    """Each fixture goes through HTTP as the harness sent it (stream or not) and is recorded."""
    srv = make_server([tool_call_text("bash", {"command": "printf hi > hello.txt"}), "done"])
    for i, path in enumerate(FIXTURES):
        route, body = _load(path)
        headers = {
            "x-api-key" if "messages" in route else "authorization": token(f"fx{i}")
            if "messages" in route
            else f"Bearer {token(f'fx{i}')}",
            "content-type": "application/json",
            "anthropic-version": "2023-06-01",
        }
        with httpx.Client(base_url=srv.url, timeout=60) as h:
            r = h.post(route, content=json.dumps(body), headers=headers)
        assert r.status_code == 200, (path.name, r.text[:500])
        first_turn = not any(
            m.get("role") == "assistant" or m.get("type") == "function_call"
            for m in body.get("messages") or body.get("input") or []
        )
        if body.get("stream"):
            assert "text/event-stream" in r.headers["content-type"]
            if "messages" in route:
                assert "event: message_stop" in r.text
                assert ("input_json_delta" in r.text) == first_turn
            elif "responses" in route:
                assert "event: response.completed" in r.text
            else:
                assert r.text.rstrip().endswith("data: [DONE]")
                if body.get("stream_options", {}).get("include_usage"):
                    assert '"usage":{"prompt_tokens"' in r.text
        elif "chat" in route:
            assert (r.json()["choices"][0]["finish_reason"] == "tool_calls") == first_turn
    calls = list(read_calls(srv.config.record))
    assert len(calls) == len(FIXTURES)
    schema = json.loads((ROOT / "formats" / "claw.call.v1.schema.json").read_text())
    for line in Path(srv.config.record).read_text().splitlines():
        jsonschema.validate(json.loads(line), schema)
    for c in calls:
        assert (
            c.prompt_ids
            and c.completion_ids
            and len(c.completion_logprobs) == len(c.completion_ids)
        )
    assert {c.api for c in calls} == {"openai.chat", "openai.responses", "anthropic.messages"}
    assert any(c.model == "claude-opus-5-5" for c in calls)
