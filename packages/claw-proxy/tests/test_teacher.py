"""Teacher trajectories recorded for the student: the scripted engine replaying expert tool calls
(keyed by session tags), and a passthrough teacher recorded in the student's tokenization."""

from __future__ import annotations

import json

import httpx
import pytest
from claw_proxy import ProxyConfig, ProxyServer, api_anthropic, api_chat, api_responses, read_calls
from claw_proxy.errors import ConfigError
from claw_proxy.render import Renderer
from proxy_testlib import SECRET, TINY, token
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

R = Renderer(str(TINY))
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} a file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
    for name in ("read_file", "write_file")
]
USER = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "Read a.txt"},
]


def _script(tmp_path, lines: list[dict]) -> dict:
    """make_server arguments for a scripted engine on these lines, with the tiny tokenizer."""
    path = tmp_path / "expert.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return {"engine": f"scripted:{path}", "tokenizer": str(TINY)}


def _chat(srv, messages, key=None, **kw):
    r = httpx.post(
        srv.url + "/v1/chat/completions",
        json={"model": "m", "messages": messages, "tools": TOOLS, **kw},
        headers={"authorization": f"Bearer {key or token('s1')}"},
        timeout=30,
    )
    return r


def _second_turn(first_message: dict, result: str = "42") -> list[dict]:
    """The conversation a harness sends after running the first answer's tool call."""
    calls = first_message["tool_calls"]
    return [
        *USER,
        {"role": "assistant", "content": first_message.get("content"), "tool_calls": calls},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": result},
    ]


# --- the scripted teacher -----------------------------------------------------------------------


def test_scripted_tool_calls_are_played_in_the_students_format(make_server, tmp_path):
    """A script line's tool_calls come back as a real tool call, recorded as the template writes it."""
    srv = make_server(
        **_script(
            tmp_path,
            [
                {"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}]},
                {"text": "done"},
            ],
        )
    )
    r = _chat(srv, USER)
    assert r.status_code == 200, r.text
    msg = r.json()["choices"][0]["message"]
    assert r.json()["choices"][0]["finish_reason"] == "tool_calls"
    assert [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg["tool_calls"]
    ] == [("read_file", {"path": "a.txt"})]
    r2 = _chat(srv, _second_turn(msg))
    assert r2.json()["choices"][0]["message"]["content"] == "done"
    first, second = read_calls(srv.config.record)
    assert R.tokenizer.decode(first.completion_ids) == (
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call><|im_end|>'
    )
    assert first.extra["teacher"] == "scripted" and first.trainable
    assert first.completion_logprobs == [0.0] * len(first.completion_ids)
    # turn 2 extends turn 1 token for token, and that is exactly how the template renders history
    assert second.prompt_ids[: len(first.prompt_ids) + len(first.completion_ids)] == (
        first.prompt_ids + first.completion_ids
    )
    assert second.prefix["parent_call"] == first.call_id
    assert second.prefix["fresh_render_matches"] is True


def test_scripted_lines_are_chosen_by_session_tags(make_server, tmp_path):
    """Each task's sessions get that task's expert answers; a session no line is for gets a clear error."""
    lines = [
        {
            "tags": {"task": t},
            "tool_calls": [{"name": "read_file", "arguments": {"path": f"{t}.txt"}}],
        }
        for t in ("t1", "t2")
    ]
    srv = make_server(**_script(tmp_path, lines))
    for t in ("t2", "t1"):
        r = _chat(srv, USER, key=token(f"s-{t}", task=t, harness="h"))
        args = r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
        assert json.loads(args) == {"path": f"{t}.txt"}
    r = _chat(srv, USER, key=token("s-t3", task="t3"))
    assert r.status_code == 500 and "no answer for model 'm' and session tags" in r.text
    assert {c.tags["task"] for c in read_calls(srv.config.record)} == {"t1", "t2"}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ({"model": "x"}, "needs a string 'text' or a list 'tool_calls'"),
        ({"tool_calls": [{"name": "f"}]}, "field 'tool_calls' must be a list"),
        ({"tool_calls": {"name": "f", "arguments": {}}}, "field 'tool_calls' must be a list"),
        ({"text": "a", "tags": {"task": 1}}, "field 'tags' must be an object of strings"),
        ({"text": 3}, "field 'text' must be a string"),
        ([1, 2], "each line must be a JSON object"),
    ],
)
def test_bad_script_line_is_named(tmp_path, line, message):
    """A malformed script line is a ConfigError naming the file and line number."""
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"text": "ok"}) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(ConfigError, match=f"{path}:2: ") as e:
        ProxyServer(ProxyConfig(engine=f"scripted:{path}", tokenizer=str(TINY), secret=SECRET))
    assert message in str(e.value)


def test_render_answer_is_the_templates_history_turn():
    """render_answer gives the ids the template writes for that assistant turn, eos included."""
    calls = [("write_file", {"path": "b.txt", "content": "7"})]
    ids = R.render_answer("ok", calls)
    msgs = [{"role": "user", "content": "u"}]
    head = R.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    turn = {
        "role": "assistant",
        "content": "ok",
        "tool_calls": [
            {"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls
        ],
    }
    full = R.tokenizer.apply_chat_template([*msgs, turn], tokenize=False)
    assert R.tokenizer.decode(ids) == full[len(head) :].rstrip("\n")
    assert ids[-1] == R.tokenizer.eos_token_id


# --- a passthrough teacher, recorded in the student's tokenization ------------------------------

READ = {"name": "read_file", "arguments": {"path": "a.txt"}}
READ_RAW = (
    '{ "path" :"a.txt"}'  # the teacher's own JSON spacing: the student's template rewrites it
)


def _is_second_turn(body: dict) -> bool:
    """Whether the conversation ends in a tool result (in any of the three APIs' shapes)."""
    history = body.get("messages", body.get("input"))
    if not isinstance(history, list):
        return False
    last = history[-1]
    content = last.get("content")
    return (
        last.get("role") == "tool"
        or (isinstance(content, list) and any(b.get("type") == "tool_result" for b in content))
        or last.get("type") == "function_call_output"
    )


def _sse(events: list[dict], done: bool = False):
    async def gen():
        for e in events:
            kind = f"event: {e['type']}\n" if "type" in e else ""
            yield f"{kind}data: {json.dumps(e)}\n\n"
        if done:
            yield "data: [DONE]\n\n"

    return StreamingResponse(gen(), media_type="text/event-stream")


def fake_teacher():
    """A stronger model upstream: a tool call first, 'done' once the tool answered; all three APIs,
    streamed and not."""

    async def chat(request):
        body = await request.json()
        if _is_second_turn(body):
            msg, finish = {"role": "assistant", "content": "done"}, "stop"
        else:
            call = {
                "id": "up_1",
                "type": "function",
                "function": {"name": "read_file", "arguments": READ_RAW},
            }
            msg, finish = {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
        if not body.get("stream"):
            return JSONResponse(
                {
                    "id": "c",
                    "object": "chat.completion",
                    "model": body["model"],
                    "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
                }
            )
        chunks = []
        if msg.get("tool_calls"):
            head = {
                "index": 0,
                "id": "up_1",
                "type": "function",
                "function": {"name": "read_file", "arguments": ""},
            }
            chunks += [{"tool_calls": [head]}]
            chunks += [
                {"tool_calls": [{"index": 0, "function": {"arguments": p}}]}
                for p in (READ_RAW[:6], READ_RAW[6:])
            ]
        else:
            chunks += [{"content": "do"}, {"content": "ne"}]
        events = [{"choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in chunks]
        events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        return _sse(events, done=True)

    async def messages(request):
        body = await request.json()
        if _is_second_turn(body):
            content, stop = [{"type": "text", "text": "done"}], "end_turn"
        else:
            content = [
                {"type": "thinking", "thinking": "hmm", "signature": "x"},
                {"type": "text", "text": "Reading."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "read_file",
                    "input": READ["arguments"],
                },
            ]
            stop = "tool_use"
        if not body.get("stream"):
            return JSONResponse(
                {
                    "id": "m",
                    "type": "message",
                    "role": "assistant",
                    "model": body["model"],
                    "content": content,
                    "stop_reason": stop,
                }
            )
        events: list[dict] = [{"type": "message_start", "message": {"id": "m", "content": []}}]
        for i, b in enumerate(content):
            if b["type"] == "tool_use":
                events.append(
                    {"type": "content_block_start", "index": i, "content_block": {**b, "input": {}}}
                )
                events += [
                    {
                        "type": "content_block_delta",
                        "index": i,
                        "delta": {"type": "input_json_delta", "partial_json": p},
                    }
                    for p in (READ_RAW[:4], READ_RAW[4:])
                ]
            elif b["type"] == "text":
                events.append(
                    {
                        "type": "content_block_start",
                        "index": i,
                        "content_block": {"type": "text", "text": ""},
                    }
                )
                events.append(
                    {
                        "type": "content_block_delta",
                        "index": i,
                        "delta": {"type": "text_delta", "text": b["text"]},
                    }
                )
            else:
                events.append({"type": "content_block_start", "index": i, "content_block": b})
            events.append({"type": "content_block_stop", "index": i})
        events += [
            {"type": "message_delta", "delta": {"stop_reason": stop}},
            {"type": "message_stop"},
        ]
        return _sse(events)

    async def responses(request):
        body = await request.json()
        if _is_second_turn(body):
            output = [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "done"}],
                }
            ]
        else:
            output = [
                {
                    "type": "function_call",
                    "call_id": "fc_1",
                    "name": "read_file",
                    "arguments": READ_RAW,
                }
            ]
        return JSONResponse(
            {"id": "r", "object": "response", "status": "completed", "output": output}
        )

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/messages", messages, methods=["POST"]),
            Route("/v1/responses", responses, methods=["POST"]),
        ]
    )


@pytest.fixture
def teacher(make_server):
    return make_server(
        engine="passthrough:http://teacher.test",
        tokenizer=str(TINY),
        student_ids=True,
        transport=httpx.ASGITransport(app=fake_teacher()),
    )


@pytest.mark.parametrize("stream", [False, True])
def test_passthrough_teacher_over_chat_is_recorded_for_the_student(teacher, stream):
    """A teacher's chat answers are recorded as the student's template renders prompt and answer, with prefix reuse."""
    key = token(f"chat-{stream}", task="t", harness="h")
    first = _chat(teacher, USER, key=key)  # non-streamed: the harness needs the whole message
    msg = first.json()["choices"][0]["message"]
    assert (
        msg["tool_calls"][0]["function"]["arguments"] == READ_RAW
    )  # the answer is the teacher's, unchanged
    body2 = {"model": "m", "messages": _second_turn(msg), "tools": TOOLS, "stream": stream}
    r = httpx.post(
        teacher.url + "/v1/chat/completions",
        json=body2,
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert r.status_code == 200
    a, b = read_calls(teacher.config.record)
    req1 = api_chat.parse({"model": "m", "messages": USER, "tools": TOOLS})
    assert a.prompt_ids == R.render_full(req1)
    assert a.completion_ids == R.render_answer("", [(READ["name"], READ["arguments"])])
    assert R.tokenizer.decode(a.completion_ids).startswith(
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}'
    )
    for c in (a, b):
        assert (
            c.trainable
            and c.extra["teacher"] == "passthrough"
            and c.engine == "passthrough:http://teacher.test"
        )
        assert c.completion_logprobs == [0.0] * len(c.completion_ids) and c.tags == {
            "task": "t",
            "harness": "h",
        }
    assert b.completion_ids == R.render_answer("done") and b.finish_reason == "stop"
    assert b.prefix["parent_call"] == a.call_id and b.prefix["fresh_render_matches"] is True
    assert b.prompt_ids == R.render_full(api_chat.parse(body2))
    assert (
        "sse" in b.response if stream else b.response["choices"][0]["message"]["content"] == "done"
    )


@pytest.mark.parametrize("stream", [False, True])
def test_passthrough_teacher_over_anthropic_is_recorded_for_the_student(teacher, stream):
    """Anthropic text + tool_use (thinking left out), streamed or not, become the student's ids."""
    key = token(f"an-{stream}")
    headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
    tools = [
        {
            "name": t["function"]["name"],
            "description": "d",
            "input_schema": t["function"]["parameters"],
        }
        for t in TOOLS
    ]
    body = {
        "model": "claude-x",
        "max_tokens": 64,
        "system": "You are an agent.",
        "tools": tools,
        "messages": [{"role": "user", "content": "Read a.txt"}],
        "stream": stream,
    }
    r = httpx.post(teacher.url + "/v1/messages", json=body, headers=headers, timeout=30)
    assert r.status_code == 200
    (a,) = read_calls(teacher.config.record)
    assert a.trainable and a.extra["teacher"] == "passthrough" and a.finish_reason == "tool_calls"
    assert a.completion_ids == R.render_answer("Reading.", [(READ["name"], READ["arguments"])])
    assert a.prompt_ids == R.render_full(api_anthropic.parse(body))


def test_passthrough_teacher_over_responses(teacher):
    """A Responses API function_call answer is recorded in the student's tokenization too."""
    body = {
        "model": "m",
        "input": "Read a.txt",
        "tools": [{"type": "function", **TOOLS[0]["function"]}],
    }
    r = httpx.post(
        teacher.url + "/v1/responses",
        json=body,
        headers={"authorization": f"Bearer {token('r1')}"},
        timeout=30,
    )
    assert r.status_code == 200
    (a,) = read_calls(teacher.config.record)
    assert a.trainable and a.extra["teacher"] == "passthrough" and a.finish_reason == "tool_calls"
    assert a.completion_ids == R.render_answer("", [(READ["name"], READ["arguments"])])
    assert a.prompt_ids == R.render_full(api_responses.parse(body))


def test_passthrough_without_student_ids_stays_text_only(make_server):
    """Without --student-ids a passthrough call keeps no ids, is not trainable and carries no teacher mark."""
    srv = make_server(
        engine="passthrough:http://teacher.test",
        tokenizer=str(TINY),
        transport=httpx.ASGITransport(app=fake_teacher()),
    )
    assert _chat(srv, USER).status_code == 200
    (a,) = read_calls(srv.config.record)
    assert not a.trainable and a.prompt_ids == [] and "teacher" not in a.extra


def test_unreadable_teacher_answer_is_recorded_without_ids(make_server):
    """An upstream answer of a shape the proxy cannot read still reaches the client and is recorded text-only."""

    async def odd(request):
        return JSONResponse(
            {"choices": [{"message": {"tool_calls": [{"function": {"arguments": "{}"}}]}}]}
        )

    srv = make_server(
        engine="passthrough:http://teacher.test",
        tokenizer=str(TINY),
        student_ids=True,
        transport=httpx.ASGITransport(
            app=Starlette(routes=[Route("/v1/chat/completions", odd, methods=["POST"])])
        ),
    )
    assert _chat(srv, USER).status_code == 200
    (a,) = read_calls(srv.config.record)
    assert not a.trainable and a.completion_ids == [] and "teacher" not in a.extra


def test_student_ids_need_the_students_tokenizer():
    """--student-ids without --tokenizer is a ConfigError saying what to pass."""
    with pytest.raises(ConfigError, match="--student-ids needs the student's HF directory"):
        ProxyServer(
            ProxyConfig(engine="passthrough:http://x.test", secret=SECRET, student_ids=True)
        )
