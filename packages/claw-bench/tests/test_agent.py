"""claw-agent: the tool loop over OpenAI chat and Anthropic Messages, garbage tolerance, limits, errors."""

from __future__ import annotations

import json

import pytest
from bench_testlib import SECRET, ModelServer
from claw_bench.agent import Endpoint, EndpointError, main, run_agent, tool_specs
from claw_bench.token import mint_token


def _chat_post(replies, seen):
    def post(path, body):
        seen.append((path, json.loads(json.dumps(body))))  # a copy, as sent at that moment
        msg = replies[len(seen) - 1]
        return {"choices": [{"index": 0, "message": msg, "finish_reason": "stop"}]}

    return post


def _call(name, args, i=0, raw=None):
    return {
        "id": f"c{i}",
        "type": "function",
        "function": {"name": name, "arguments": raw if raw is not None else json.dumps(args)},
    }


def test_chat_loop_runs_tools_and_returns_the_final_answer(tmp_path):
    """write_file, bash and read_file run in the workspace; results go back as tool messages."""
    replies = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [_call("write_file", {"path": "out/hello.txt", "content": "hi\n"})],
        },
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                _call("bash", {"command": "cat out/hello.txt; echo err >&2"}, 1),
                _call("read_file", {"path": "out/hello.txt"}, 2),
            ],
        },
        {"role": "assistant", "content": "All done."},
    ]
    seen = []
    text, turns, limited = run_agent(
        "make hello",
        api="chat",
        model="m",
        base_url="http://x/v1",
        api_key="tok",
        cwd=tmp_path,
        post=_chat_post(replies, seen),
    )
    assert (text, turns, limited) == ("All done.", 3, False)
    assert (tmp_path / "out/hello.txt").read_text() == "hi\n"
    path, body = seen[0]
    assert path == "/chat/completions"
    assert [t["function"]["name"] for t in body["tools"]] == ["bash", "read_file", "write_file"]
    last = seen[2][1]["messages"]
    assert [m["role"] for m in last] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "tool",
    ]
    assert (
        "exit code 0" in last[5]["content"]
        and "hi" in last[5]["content"]
        and "err" in last[5]["content"]
    )
    assert last[6]["content"] == "hi\n" and last[6]["tool_call_id"] == "c2"


def test_garbage_output_is_a_final_answer(tmp_path):
    """Unparseable tool arguments or plain garbage end the loop without a crash."""
    for msg in (
        {"role": "assistant", "content": "\u0000#%$ garbage ]]"},
        {"role": "assistant", "content": "x", "tool_calls": [_call("bash", None, raw="{not json")]},
        {"role": "assistant", "content": None, "tool_calls": [_call("bash", None, raw="[1, 2]")]},
    ):
        text, turns, limited = run_agent(
            "t",
            api="chat",
            model="m",
            base_url="http://x/v1",
            api_key="k",
            cwd=tmp_path,
            post=_chat_post([msg], []),
        )
        assert turns == 1 and not limited


def test_tools_stay_inside_the_workspace(tmp_path):
    """Paths that escape the workspace are refused; unknown tools and missing arguments are error results."""
    from claw_bench.agent import run_tool

    assert "outside the workspace" in run_tool(
        "write_file", {"path": "../x", "content": "y"}, tmp_path
    )
    assert not (tmp_path.parent / "x").exists()
    assert "unknown tool" in run_tool("rm_rf", {}, tmp_path)
    assert "KeyError" in run_tool("bash", {}, tmp_path)


def test_anthropic_loop(tmp_path):
    """Anthropic Messages: x-api-key, input_schema tools, tool_use blocks answered with tool_result blocks."""
    seen = []

    def post(path, body):
        seen.append((path, json.loads(json.dumps(body))))
        if len(seen) == 1:
            content = [
                {"type": "text", "text": "writing"},
                {
                    "type": "tool_use",
                    "id": "tu1",
                    "name": "write_file",
                    "input": {"path": "a.txt", "content": "A"},
                },
            ]
        else:
            content = [{"type": "text", "text": "finished"}]
        return {"type": "message", "role": "assistant", "content": content}

    text, turns, _ = run_agent(
        "t",
        api="anthropic",
        model="m",
        base_url="http://x",
        api_key="tok",
        cwd=tmp_path,
        post=post,
    )
    assert (text, turns) == ("finished", 2) and (tmp_path / "a.txt").read_text() == "A"
    path, body = seen[1]
    assert path == "/v1/messages"
    assert body["tools"] == tool_specs("anthropic") and body["system"]
    assert body["messages"][2]["content"][0] == {
        "type": "tool_result",
        "tool_use_id": "tu1",
        "content": "wrote 1 characters to a.txt",
    }


def test_cli_turn_limit_answer_file_and_no_tools(tmp_path, monkeypatch, capsys):
    """The module's CLI against a real loopback server: turn limit said on stderr (exit 0); --no-tools; answer file."""

    def policy(tags, turn, body):
        if "tools" not in body:
            return {"text": "hello there"}
        return {"tool_calls": [("bash", {"command": "echo again"})]}

    monkeypatch.chdir(tmp_path)
    with ModelServer(policy) as srv:
        monkeypatch.setenv("OPENAI_BASE_URL", srv.url + "/v1")
        monkeypatch.setenv(
            "OPENAI_API_KEY", mint_token("s1", SECRET, {"task": "t", "harness": "h"})
        )
        assert main(["--api", "chat", "--instruction", "loop", "--max-turns", "3"]) == 0
        assert "turn limit (3 turns)" in capsys.readouterr().err
        assert (
            main(
                [
                    "--api",
                    "chat",
                    "--instruction",
                    "say hi",
                    "--no-tools",
                    "--answer-file",
                    "answer.txt",
                ]
            )
            == 0
        )
        assert (tmp_path / "answer.txt").read_text() == "hello there"
        monkeypatch.setenv("OPENAI_API_KEY", "forged.token")
        assert main(["--api", "chat", "--instruction", "x"]) == 2
        assert "401" in capsys.readouterr().err
    assert len(srv.requests) == 4


def test_endpoint_sends_the_key_keeps_the_connection_and_reports_errors():
    """Endpoint: both APIs' key headers reach a real loopback server, two requests in a row on
    one Endpoint; an HTTP error status and a refused connection (after its retries) are
    EndpointErrors."""

    def policy(tags, turn, body):
        return {"text": f"turn {turn}"}

    with ModelServer(policy) as srv:
        token = mint_token("s2", SECRET, {"task": "t", "harness": "h"})
        chat = Endpoint(srv.url + "/v1", {"authorization": f"Bearer {token}"}, timeout=10)
        body = {"model": "m", "messages": [{"role": "user", "content": "naïve ✓ \\u"}]}
        first = chat("/chat/completions", body)["choices"][0]["message"]["content"]
        second = chat("/chat/completions", body)["choices"][0]["message"]["content"]
        assert (first, second) == ("turn 0", "turn 1")
        chat.close()
        anth = Endpoint(srv.url, {"x-api-key": token, "anthropic-version": "2023-06-01"}, 10)
        assert anth("/v1/messages", body)["content"][0]["text"] == "turn 2"
        anth.close()
        forged = Endpoint(srv.url + "/v1", {"authorization": "Bearer forged.token"}, timeout=10)
        with pytest.raises(EndpointError, match="HTTP 401"):
            forged("/chat/completions", body)
        forged.close()
        port = int(srv.url.rsplit(":", 1)[1])
    assert [r["path"] for r in srv.requests] == ["/v1/chat/completions"] * 2 + ["/v1/messages"]
    assert all(r["body"] == body for r in srv.requests)  # UTF-8 JSON arrives as it was
    gone = Endpoint(f"http://127.0.0.1:{port}", {}, timeout=10, retries=1)
    with pytest.raises(EndpointError, match="POST /x"):
        gone("/x", {})
