"""Limits that once had holes (token counting, oversize prompts, surrogates inside tool-call
arguments) and protocol gaps (a no-argument tool call streamed by a passthrough teacher)."""

from __future__ import annotations

import json

import httpx
import pytest
from claw_proxy import read_calls
from claw_proxy.render import Renderer
from proxy_testlib import ADMIN, TINY, token
from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route

ADMIN_H = {"authorization": f"Bearer {ADMIN}"}
R = Renderer(str(TINY))


def _post(srv, path: str, body: dict | bytes, session: str = "s1") -> httpx.Response:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    h = {"content-type": "application/json", "x-api-key": token(session)}
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        return c.post(path, content=raw, headers=h)


# --- lone surrogates inside tool-call arguments ---------------------------------------------

_ARGS = json.dumps({"path": "\ud800"}, ensure_ascii=True)  # '{"path": "\\ud800"}': valid JSON text


@pytest.mark.parametrize(
    ("path", "body", "where"),
    [
        (
            "/v1/chat/completions",
            {
                "model": "m",
                "messages": [
                    {"role": "user", "content": "hi"},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "read", "arguments": _ARGS},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "c1", "content": "x"},
                ],
            },
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            "/v1/responses",
            {
                "model": "m",
                "input": [
                    {"role": "user", "content": "hi"},
                    {"type": "function_call", "call_id": "c1", "name": "read", "arguments": _ARGS},
                    {"type": "function_call_output", "call_id": "c1", "output": "x"},
                ],
            },
            "input[1].arguments",
        ),
    ],
)
def test_lone_surrogate_inside_tool_call_arguments_gets_400(make_server, tmp_path, path, body, where):
    """A tool call's `arguments` string whose JSON decodes to a lone surrogate is a 400 naming
    the field (it was a 500: the body passed the surrogate check, the decoded arguments did not
    encode); nothing is recorded."""
    srv = make_server()
    r = _post(srv, path, body)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "lone UTF-16 surrogate" in message and where in message
    record = tmp_path / "calls.jsonl"
    assert not record.exists() or not list(read_calls(str(record)))


# --- a passthrough teacher's no-argument tool call --------------------------------------------


def _no_arg_teacher() -> Starlette:
    """An Anthropic upstream that streams a tool call without arguments the way the real API
    does: one input_json_delta whose partial_json is the empty string."""

    async def messages(request):
        events = [
            {"type": "message_start", "message": {"id": "m", "content": []}},
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {}},
            },
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": ""},
            },
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": "tool_use"}},
            {"type": "message_stop"},
        ]

        async def gen():
            for e in events:
                yield f"event: {e['type']}\ndata: {json.dumps(e)}\n\n"

        return StreamingResponse(gen(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/messages", messages, methods=["POST"])])


def test_passthrough_no_argument_tool_call_streamed_is_recorded_with_ids(make_server):
    """An empty `partial_json` is a call with `{}` input: the teacher's turn is recorded in the
    student's ids (it raised and was recorded without ids)."""
    srv = make_server(
        engine="passthrough:http://teacher.test",
        tokenizer=str(TINY),
        student_ids=True,
        transport=httpx.ASGITransport(app=_no_arg_teacher()),
    )
    body = {
        "model": "claude-x",
        "max_tokens": 64,
        "stream": True,
        "tools": [{"name": "ls", "input_schema": {"type": "object", "properties": {}}}],
        "messages": [{"role": "user", "content": "list"}],
    }
    r = _post(srv, "/v1/messages", body)
    assert r.status_code == 200 and '"partial_json": ""' in r.text
    (call,) = read_calls(srv.config.record)
    assert call.trainable and call.finish_reason == "tool_calls"
    assert call.completion_ids == R.render_answer("", [("ls", {})])
    with httpx.Client(base_url=srv.url) as c:
        assert c.get("/admin/stats", headers=ADMIN_H).json()["errors"] == 0
