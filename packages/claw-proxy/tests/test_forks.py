"""A prefix-cache miss never changes what the model saw: a session whose cache entry was evicted
(`--prefix-cache-bytes`) or whose proxy restarted mid-rollout reads its earlier sampled ids back
from the record series, so its calls still form one path, with and without reasoning, over the
three APIs, with the tiny fixture's template and with Qwen3's published one. A re-render that
does fork is recorded with its reason and counted in /admin/stats."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest
from claw_proxy import ProxyConfig, ProxyServer, read_calls
from claw_proxy.render import Renderer
from proxy_testlib import ADMIN, SECRET, TINY, token, tool_call_text, write_script

QWEN3_TEMPLATE = Path(__file__).parent / "fixtures" / "chat-templates" / "qwen3.jinja"
ADMIN_H = {"authorization": f"Bearer {ADMIN}"}
TURNS = 4


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory) -> Path:
    """The tiny tokenizer with Qwen3's published chat template."""
    d = tmp_path_factory.mktemp("qwen3-template")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(TINY / name, d / name)
    shutil.copy(QWEN3_TEMPLATE, d / "chat_template.jinja")
    return d


def _script(reasoning: str, template: str) -> list[str]:
    """What the model samples: tool calls, then a final answer. With reasoning each answer
    starts with a thought; without, Qwen3 (thinking mode) still opens with an empty block;
    with thinking switched off the (Qwen3) template puts that block in the prompt instead."""
    if reasoning == "reasoning":
        head = [f"<think>step {i}: look before acting</think>\n\n" for i in range(TURNS)]
    elif template == "qwen3" and reasoning == "plain":
        head = ["<think>\n\n</think>\n\n"] * TURNS
    else:
        head = [""] * TURNS
    calls = [tool_call_text("bash", {"command": f"echo {i}"}) for i in range(TURNS - 1)]
    return [h + c for h, c in zip(head, [*calls, "All done."], strict=True)]


class _Chat:
    path = "/v1/chat/completions"
    off = {"reasoning_effort": "none"}  # the request's thinking switch, off

    def __init__(self) -> None:
        self.msgs: list[dict] = [
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": "do four things"},
        ]

    def body(self) -> dict:
        tools = [
            {
                "type": "function",
                "function": {
                    "name": "bash",
                    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
                },
            }
        ]
        return {"model": "gpt-4o", "messages": self.msgs, "tools": tools}

    def answered(self, out: dict, turn: int) -> None:
        """Append the answer as the client got it (reasoning included) and the tool results."""
        m = out["choices"][0]["message"]
        self.msgs.append(m)
        for c in m.get("tool_calls") or []:
            self.msgs.append({"role": "tool", "tool_call_id": c["id"], "content": f"out {turn}"})


class _Anthropic:
    path = "/v1/messages"
    off = {"thinking": {"type": "disabled"}}

    def __init__(self) -> None:
        self.msgs: list[dict] = [{"role": "user", "content": "do four things"}]

    def body(self) -> dict:
        tools = [
            {
                "name": "bash",
                "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
            }
        ]
        return {
            "model": "claude-sonnet-4",
            "max_tokens": 256,
            "system": "You are an agent.",
            "messages": self.msgs,
            "tools": tools,
        }

    def answered(self, out: dict, turn: int) -> None:
        """Claude Code's way: the content blocks back as they came (thinking blocks too)."""
        self.msgs.append({"role": "assistant", "content": out["content"]})
        results = [
            {"type": "tool_result", "tool_use_id": b["id"], "content": f"out {turn}"}
            for b in out["content"]
            if b["type"] == "tool_use"
        ]
        if results:
            self.msgs.append({"role": "user", "content": results})


class _Responses:
    path = "/v1/responses"
    off = {"reasoning": {"effort": "none"}}

    def __init__(self) -> None:
        self.items: list[dict] = [{"role": "user", "content": "do four things"}]

    def body(self) -> dict:
        tools = [
            {
                "type": "function",
                "name": "bash",
                "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
            }
        ]
        return {
            "model": "gpt-5",
            "instructions": "You are an agent.",
            "input": self.items,
            "tools": tools,
        }

    def answered(self, out: dict, turn: int) -> None:
        """Codex's way: every output item back as input (reasoning items too)."""
        self.items += out["output"]
        self.items += [
            {"type": "function_call_output", "call_id": i["call_id"], "output": f"out {turn}"}
            for i in out["output"]
            if i["type"] == "function_call"
        ]


CLIENTS = {"chat": _Chat, "anthropic": _Anthropic, "responses": _Responses}


def _one_path(calls) -> None:
    """Every call's prompt starts with the previous call's prompt + completion: one leaf."""
    assert [c.seq for c in calls] == list(range(len(calls)))
    for prev, cur in zip(calls, calls[1:], strict=False):
        full = prev.prompt_ids + prev.completion_ids
        assert cur.prompt_ids[: len(full)] == full, f"call {cur.seq} forks from call {prev.seq}"
        assert cur.prefix["parent_call"] == prev.call_id
        assert "fork_reason" not in cur.prefix


@pytest.mark.parametrize("mode", ["warm", "evicted", "restarted"])
@pytest.mark.parametrize("template", ["tiny", "qwen3"])
@pytest.mark.parametrize("reasoning", ["reasoning", "plain", "off"])
@pytest.mark.parametrize("api", sorted(CLIENTS))
def test_a_cache_miss_never_forks_the_session(api, reasoning, template, mode, qwen3_dir, tmp_path):
    """Four calls of one tool-using session; `evicted`: a 1-byte prefix cache forgets every
    call at once; `restarted`: a new proxy on the same record series before every call; `off`:
    the request switches thinking off (Qwen3's template then ends the prompt with an empty
    `<think>` block it never writes into history). The calls form one path: no call forks from
    the one before, and none records a fork."""
    tok_dir = str(TINY if template == "tiny" else qwen3_dir)
    script = write_script(tmp_path / "script.jsonl", _script(reasoning, template))
    config = ProxyConfig(
        engine=f"scripted:{script}",
        tokenizer=tok_dir,
        secret=SECRET,
        admin_token=ADMIN,
        record=str(tmp_path / "calls.jsonl"),
        prefix_cache_bytes=1 if mode == "evicted" else 1 << 30,
    )
    client = CLIENTS[api]()
    srv = ProxyServer(config).start()
    try:
        for turn in range(TURNS):
            if mode == "restarted" and turn > 0:
                srv.stop()
                srv = ProxyServer(config).start()
            body = {**client.body(), **(client.off if reasoning == "off" else {})}
            r = httpx.post(
                srv.url + client.path,
                json=body,
                headers={"authorization": f"Bearer {token('s1')}"},
                timeout=30,
            )
            assert r.status_code == 200, r.text
            client.answered(r.json(), turn)
        stats = httpx.get(srv.url + "/admin/stats", headers=ADMIN_H).json()
    finally:
        srv.stop()
    calls = list(read_calls(config.record))
    _one_path(calls)
    if reasoning == "reasoning":  # what the model saw next is what it sampled, thought included
        assert all(
            Renderer(tok_dir).tokenizer.decode(c.completion_ids).startswith("<think>step")
            for c in calls
        )
    cache = stats["prefix_cache"][tok_dir]
    assert cache["forks"] == {}
    if mode == "evicted":
        assert cache["recovered_calls"] == TURNS - 1
    if mode == "restarted":  # the last proxy read its one earlier call back
        assert cache["recovered_calls"] == 1


def _session_of_two_calls(srv, session: str) -> None:
    msgs = [{"role": "user", "content": "think first"}]
    for _ in range(2):
        r = httpx.post(
            srv.url + "/v1/chat/completions",
            json={"model": "m", "messages": msgs},
            headers={"authorization": f"Bearer {token(session)}"},
        )
        assert r.status_code == 200, r.text
        msgs += [r.json()["choices"][0]["message"], {"role": "user", "content": "go on"}]


def test_a_fork_without_the_record_is_recorded_with_its_reason(make_server, tmp_path):
    """When the evicted call's record line cannot be read back (its shard was rotated out and
    moved away), the next call is rendered fresh: it forks, and the record and /admin/stats
    say why and from which call."""
    srv = make_server(["<think>a thought</think>\n\nfirst", "second"], prefix_cache_bytes=1)
    msgs = [{"role": "user", "content": "think first"}]
    h = {"authorization": f"Bearer {token('s1')}"}
    r = httpx.post(
        srv.url + "/v1/chat/completions", json={"model": "m", "messages": msgs}, headers=h
    )
    assert r.status_code == 200
    rotated = httpx.post(srv.url + "/admin/rotate", headers=ADMIN_H).json()
    moved = tmp_path / "archive"
    moved.mkdir()
    for p in rotated["closed"]:
        shutil.move(p, moved / Path(p).name)
    msgs += [r.json()["choices"][0]["message"], {"role": "user", "content": "go on"}]
    r = httpx.post(
        srv.url + "/v1/chat/completions", json={"model": "m", "messages": msgs}, headers=h
    )
    assert r.status_code == 200
    first = next(read_calls(moved / "calls.jsonl"))
    (second,) = read_calls(rotated["next"])
    full = first.prompt_ids + first.completion_ids
    assert second.prompt_ids[: len(full)] != full  # the re-render dropped the thought: a fork
    assert second.prefix["fork_reason"] == "record_unreadable"
    assert second.prefix["fork_of"] == first.call_id and second.prefix["parent_call"] is None
    stats = httpx.get(srv.url + "/admin/stats", headers=ADMIN_H).json()
    assert stats["prefix_cache"][str(TINY)]["forks"] == {"record_unreadable": 1}


def test_without_a_record_an_evicted_session_fork_is_counted(make_server):
    """A proxy that keeps no record series has nothing to read an evicted call back from: the
    fork is counted by reason in /admin/stats (there is no record to carry it)."""
    srv = make_server(
        ["<think>a thought</think>\n\nfirst", "second"], prefix_cache_bytes=1, record=None
    )
    _session_of_two_calls(srv, "s1")
    stats = httpx.get(srv.url + "/admin/stats", headers=ADMIN_H).json()
    assert stats["prefix_cache"][str(TINY)]["forks"] == {"not_recorded": 1}


def test_the_index_survives_a_torn_last_line(make_server, tmp_path):
    """kill -9 while the index line was written leaves half a line: a restarted proxy skips it,
    keeps every whole line, and its next line starts on a line of its own."""
    srv = make_server(["first", "second", "third"])
    _session_of_two_calls(srv, "s1")
    srv.stop()
    index = tmp_path / "calls.jsonl.index"
    lines = index.read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(x)["session"] == "s1" for x in lines)
    with index.open("a") as f:
        f.write('{"session": "s1", "call_id": "call-to')
    srv = make_server(["first", "second", "third"], prefix_cache_bytes=1)
    _session_of_two_calls(srv, "s2")
    got = index.read_text().splitlines()
    assert got[:2] == lines and len(got) == 5
    assert [json.loads(x)["session"] for x in got[3:]] == ["s2", "s2"]


def test_the_session_index_is_bounded_and_matches_by_history(tmp_path):
    """In memory the index keeps `per_session` calls a session (superseded ones forgotten
    first) and `max_entries` in all (the coldest sessions forgotten first); a request matches
    the call with the longest history it continues, under the same tokenizer only."""
    from claw_proxy._history import SessionIndex

    index = SessionIndex(None, per_session=2, max_entries=3)
    keys = [f"{i:032x}" for i in range(8)]

    def add(session, call_id, n, extends=None, tok="tok"):
        index.add(session, call_id, tok, keys[:n], 5, True, None, extends)

    add("a", "a0", 2)
    add("a", "a1", 4, extends="a0")
    add("a", "a2", 3)  # a branch: a0 (superseded by a1) is forgotten, a1 and a2 stay
    assert index.candidate("a", "tok", keys, 0).call_id == "a1"
    assert index.candidate("a", "tok", keys[:4], 0).call_id == "a2"  # a1 is not a proper prefix
    assert (
        index.candidate("a", "tok", keys, 4) is None
        and index.candidate("a", "other", keys, 0) is None
    )
    assert index.candidate("a", "tok", ["f" * 32, *keys[1:]], 0) is None  # another history
    add("b", "b0", 2)
    add("b", "b1", 3)  # 4 entries > 3: session a, the coldest, is forgotten
    assert index.stats() == {
        "sessions": 1,
        "entries": 2,
        "evicted_sessions": 1,
        "skipped_lines": 0,
        "write_errors": 0,
    }
    assert index.candidate("a", "tok", keys, 0) is None
    assert index.candidate("b", "tok", keys, 0).call_id == "b1"


def test_a_template_that_cannot_continue_a_turn_records_its_forks(make_server, tmp_path):
    """A chat template that ends assistant turns with another token than the eos the model
    stops on cannot be continued: each later call is rendered fresh, forks from the call it
    continues, and says so (`no_continuation`), in the record and in /admin/stats."""
    d = tmp_path / "other-eos"
    d.mkdir()
    for name in ("tokenizer.json", "chat_template.jinja"):
        shutil.copy(TINY / name, d / name)
    config = json.loads((TINY / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<|endoftext|>"}))
    srv = make_server(["first", "second"], tokenizer=str(d))
    _session_of_two_calls(srv, "s1")
    first, second = read_calls(tmp_path / "calls.jsonl")
    full = first.prompt_ids + first.completion_ids
    assert second.prompt_ids[: len(full)] != full
    assert (second.prefix["fork_reason"], second.prefix["fork_of"]) == (
        "no_continuation",
        first.call_id,
    )
    stats = httpx.get(srv.url + "/admin/stats", headers=ADMIN_H).json()
    assert stats["prefix_cache"][str(d)]["forks"] == {"no_continuation": 1}


def test_an_index_that_cannot_be_written_loses_no_answer(make_server, tmp_path):
    """The session index is an aid, not the record: when its file cannot be written the calls
    are still answered and recorded, and /admin/stats counts the failed writes."""
    (tmp_path / "calls.jsonl.index").mkdir()  # a directory in its place: every open fails
    srv = make_server(["first", "second"])
    _session_of_two_calls(srv, "s1")
    first, second = read_calls(tmp_path / "calls.jsonl")
    assert second.prefix["parent_call"] == first.call_id  # the warm cache still reuses
    stats = httpx.get(srv.url + "/admin/stats", headers=ADMIN_H).json()
    assert stats["prefix_cache"][str(TINY)]["session_index"]["write_errors"] == 2
