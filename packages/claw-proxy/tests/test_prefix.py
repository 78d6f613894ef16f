"""Prefix reuse across turns with the scripted engine: tool calls, rewritten ids, reformatted
JSON, stripped reasoning, divergence and interleaved side calls."""

from __future__ import annotations

import json

from claw_proxy import read_calls
from proxy_testlib import TOOLS, tool_call_text


def _assert_chain(calls):
    for prev, cur in zip(calls, calls[1:], strict=False):
        full = prev.prompt_ids + prev.completion_ids
        assert cur.prompt_ids[: len(full)] == full, (
            f"call {cur.seq} does not extend call {prev.seq}"
        )
        assert cur.prefix["parent_call"] == prev.call_id
        assert cur.prefix["reused_tokens"] == len(full)
        assert cur.prefix["rendered_tokens"] == len(cur.prompt_ids) - len(full)


def test_ten_turn_tool_conversation_chat(make_server, clients):
    """10 turns of tool calls and results over chat completions: every prompt extends the last."""
    script = [tool_call_text("bash", {"command": f"echo {i}"}) for i in range(9)] + ["All done."]
    srv = make_server(script)
    client = clients.openai(srv, "ten")
    msgs = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "do ten things"},
    ]
    for turn in range(10):
        r = client.chat.completions.create(model="gpt-4o", messages=msgs, tools=TOOLS)
        m = r.choices[0].message
        if turn < 9:
            assert r.choices[0].finish_reason == "tool_calls"
            call = m.tool_calls[0]
            assert call.function.name == "bash" and json.loads(call.function.arguments) == {
                "command": f"echo {turn}"
            }
            # like OpenClaw: ids rewritten, arguments re-serialised with other whitespace
            new_id = call.id.replace("_", "")
            args = json.dumps(json.loads(call.function.arguments), indent=2)
            msgs.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": new_id,
                            "type": "function",
                            "function": {"name": "bash", "arguments": args},
                        }
                    ],
                }
            )
            msgs.append({"role": "tool", "tool_call_id": new_id, "content": f"output {turn}"})
        else:
            assert m.content == "All done." and r.choices[0].finish_reason == "stop"
    calls = [c for c in read_calls(srv.config.record) if c.session == "ten"]
    assert [c.seq for c in calls] == list(range(10))
    _assert_chain(calls)
    assert all(c.prefix["fresh_render_matches"] for c in calls)
    assert calls[0].finish_reason == "tool_calls" and calls[-1].finish_reason == "stop"


def test_anthropic_tool_use_round_trip_and_reasoning_stripped(make_server, clients):
    """Anthropic tool_use / tool_result round trip; a <think> block the client never sees still
    counts as the same history."""
    script = ["<think>plan it</think>" + tool_call_text("Bash", {"command": "ls"}), "Finished."]
    srv = make_server(script)
    client = clients.anthropic(srv, "anth")
    tools = [
        {
            "name": "Bash",
            "description": "shell",
            "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
        }
    ]
    msgs = [{"role": "user", "content": "list"}]
    r1 = client.messages.create(
        model="claude-opus-4", max_tokens=200, tools=tools, messages=msgs, system="sys"
    )
    kinds = [b.type for b in r1.content]
    assert kinds == ["thinking", "tool_use"] and r1.stop_reason == "tool_use"
    use = r1.content[1]
    assert use.input == {"command": "ls"} and use.id.startswith("toolu_")
    msgs += [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": use.id, "name": "Bash", "input": use.input}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "a.txt"}],
        },
    ]
    with client.messages.stream(
        model="claude-opus-4", max_tokens=200, tools=tools, messages=msgs, system="sys"
    ) as s:
        r2 = s.get_final_message()
    assert r2.content[0].text == "Finished." and r2.stop_reason == "end_turn"
    calls = [c for c in read_calls(srv.config.record) if c.session == "anth"]
    _assert_chain(calls)
    # the fresh re-render drops the reasoning the model sampled: reuse keeps it, so they differ
    assert calls[1].prefix["fresh_render_matches"] is False


def test_divergence_branches_and_side_calls_keep_the_main_chain(make_server, clients):
    """An edited history starts from a fresh render; an interleaved side call with another model
    name does not break the main chain's reuse."""
    srv = make_server(["one", "two", "three"])
    client = clients.openai(srv, "branchy")
    main = [{"role": "user", "content": "start"}]
    r = client.chat.completions.create(model="main", messages=main)
    main += [
        {"role": "assistant", "content": r.choices[0].message.content},
        {"role": "user", "content": "more"},
    ]
    client.chat.completions.create(
        model="haiku", messages=[{"role": "user", "content": "title please"}]
    )
    client.chat.completions.create(model="main", messages=main)
    edited = [
        {"role": "user", "content": "start"},
        {"role": "assistant", "content": "something else"},
        {"role": "user", "content": "more"},
    ]
    client.chat.completions.create(model="main", messages=edited)
    c0, side, c2, c3 = [c for c in read_calls(srv.config.record) if c.session == "branchy"]
    assert side.model == "haiku" and side.prefix["parent_call"] is None
    assert c2.prefix["parent_call"] == c0.call_id
    assert (
        c2.prompt_ids[: len(c0.prompt_ids) + len(c0.completion_ids)]
        == c0.prompt_ids + c0.completion_ids
    )
    assert c3.prefix["parent_call"] is None and c3.prefix["reused_tokens"] == 0


def test_responses_function_calls_round_trip(make_server, clients):
    """Responses API: function_call output items come back as input items and extend the prefix."""
    srv = make_server([tool_call_text("exec_command", {"cmd": "ls"}), "ok"])
    client = clients.openai(srv, "resp")
    tools = [
        {
            "type": "function",
            "name": "exec_command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
        {"type": "web_search"},
    ]
    inp = [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "sys"}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
    ]
    with client.responses.stream(model="gpt-5", input=inp, tools=tools) as s:
        r1 = s.get_final_response()
    fc = r1.output[0]
    assert fc.type == "function_call" and json.loads(fc.arguments) == {"cmd": "ls"}
    inp += [
        {
            "type": "function_call",
            "call_id": fc.call_id,
            "name": fc.name,
            "arguments": fc.arguments,
        },
        {"type": "function_call_output", "call_id": fc.call_id, "output": "a.txt"},
    ]
    r2 = client.responses.create(model="gpt-5", input=inp, tools=tools)
    assert r2.output_text == "ok"
    _assert_chain([c for c in read_calls(srv.config.record) if c.session == "resp"])


def test_stop_sequences_cut_the_answer(make_server, clients):
    """A stop sequence ends the answer before it; the recorded ids stop at the token holding it."""
    srv = make_server(["alpha beta STOP gamma delta"])
    r = clients.openai(srv, "stop").chat.completions.create(
        model="m", messages=[{"role": "user", "content": "x"}], stop=["STOP"]
    )
    assert r.choices[0].message.content == "alpha beta" and r.choices[0].finish_reason == "stop"
    (call,) = read_calls(srv.config.record)
    assert call.finish_reason == "stop" and 0 < len(call.completion_ids) < 12


def test_main_chain_survives_many_interleaved_side_calls(make_server, clients):
    """A sub-agent making many calls between two main-agent turns does not push the main
    agent's last call out of the session's memory: the next main turn still reuses it."""
    srv = make_server(["ok"])
    client = clients.openai(srv, "subagents")
    main = [{"role": "user", "content": "main task"}]
    client.chat.completions.create(model="opus", messages=main)
    main += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "next"}]
    sub = [{"role": "user", "content": "sub-agent task"}]
    for i in range(40):  # more than the 32 calls a session remembers
        client.chat.completions.create(model="haiku", messages=sub)
        sub += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": f"step {i}"}]
    client.chat.completions.create(model="opus", messages=main)
    calls = [c for c in read_calls(srv.config.record) if c.session == "subagents"]
    assert calls[-1].prefix["parent_call"] == calls[0].call_id
    assert all(
        c.prefix["parent_call"] == p.call_id for p, c in zip(calls[1:-2], calls[2:-1], strict=True)
    )
