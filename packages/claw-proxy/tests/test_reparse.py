"""Work per call that does not grow with the re-sent history, and changes nothing: messages
read against the session's last request (`_jsonbody.loads_split`, `_reparse.ParseMemo`) give
the plain parse's values and errors and the same records; a prompt built by reuse travels as
the prefix cache's array of ids (not as Python ints) and is recorded as the same list."""

from __future__ import annotations

import functools
import json
import random

import httpx
import pytest
from claw_proxy import read_calls
from claw_proxy._jsonbody import loads, loads_split
from claw_proxy.errors import RequestError
from proxy_testlib import HARNESS_REQUESTS, TINY, TOOLS, token, tool_call_text


def _outcome(fn, raw):
    try:
        return "ok", json.dumps(fn(raw))  # json.dumps tells 1, 1.0 and true apart
    except RequestError as e:
        return "error", str(e)


BODIES = [
    b'{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[]}',
    b' { "messages" : [ 1 , {"a": [true, false, null]} ,"s" ] , "x" : 1.5e3 } ',
    b'{"messages":[1],"messages":"later wins"}',
    b'{"messages":"x","messages":[1,2]}',
    b'{"messages":[]}',
    b"{}",
    b"[1]",
    b'"text"',
    b'{"messages":[NaN]}',
    b'{"messages":[1e999]}',
    b'{"messages":[-Infinity]}',
    b'{"a":1,}',
    b'{"messages":[1,]}',
    b'{"messages":[1 2]}',
    b'{"messages":[1]',
    b'{"messages":[1]} trailing',
    b'{"messages":[{"role":"user","content":"cut here',
    b"",
    b'{"messages":["\\ud800"]}',
    b'{"messages":[{"\\udc00":1}]}',
    b'{"\\ud800":1}',
    b'{"x":"\xed\xa0\x80"}',
    b'{"messages":["\\ud83d\\ude00", "\xc3\xa9"]}',
    b'\xef\xbb\xbf{"messages":[1]}',
    '{"messages":[1]}'.encode("utf-16"),
    b'{"messages":["\xff"]}',
    b'{"messages":[' + b"[" * 200 + b"]" * 200 + b"]}",
    b'{"messages":[' + b"[" * 5000 + b"]" * 5000 + b"]}",
]


@pytest.mark.parametrize("raw", BODIES)
def test_split_reading_gives_the_plain_value_or_error(raw):
    """Read member by member, a body gives exactly what the plain parse gives: the same value
    (types included) or the same error."""
    assert _outcome(lambda r: loads_split(r)[0], raw) == _outcome(loads, raw)


def _split_value(raw, known):
    return loads_split(raw, known)[0]


def _message(rng, k):
    return rng.choice(
        [
            {"role": "user", "content": f"u{k} " * rng.randint(1, 4)},
            {"role": "tool", "tool_call_id": f"t{k}", "content": "é" * k},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"function": {"name": "f", "arguments": {"n": rng.choice([1, 1.0, True])}}}
                ],
            },
            7,
            12,
            "text",
            [1, [2]],
            None,
        ]
    )


def test_known_messages_give_the_plain_value_under_every_edit():
    """Read against an earlier body's messages, every edit (append, change, reorder, drop, a
    number's type, truncation, other whitespace) gives the plain parse's value or error; only
    elements with the earlier element's exact text are taken from it."""
    rng = random.Random(7)
    for _ in range(1500):
        msgs = [_message(rng, k) for k in range(rng.randint(1, 7))]
        sep = rng.choice([(",", ":"), (", ", ": "), (" ,\n ", " : ")])
        first = json.dumps({"model": "m", "messages": msgs}, separators=sep).encode()
        _, known = loads_split(first)
        assert known is not None
        edited = list(msgs)
        op = rng.choice(["append", "edit", "swap", "drop", "retype", "cut", "space"])
        if op == "append":
            edited += [_message(rng, 90), _message(rng, 91)]
        elif op == "edit":
            edited[rng.randrange(len(edited))] = _message(rng, 50)
        elif op == "swap" and len(edited) > 1:
            i = rng.randrange(len(edited) - 1)
            edited[i], edited[i + 1] = edited[i + 1], edited[i]
        elif op == "drop":
            edited.pop(rng.randrange(len(edited)))
        elif op == "retype":
            edited = [12.0 if m == 12 else m for m in edited] + [1]
        raw = json.dumps({"model": "m", "messages": edited}, separators=sep).encode()
        if op == "cut":
            raw = raw[: rng.randrange(len(raw))]
        elif op == "space":
            raw = raw.replace(b",", b" ,", 1)
        split_value = functools.partial(_split_value, known=known)
        assert _outcome(split_value, raw) == _outcome(loads, raw)
        try:
            _, split = loads_split(raw, known)
        except RequestError:
            continue
        if split is not None:
            for j in range(len(split.spans)):
                if j not in split.fresh:
                    assert split.text(j) == known.text(j)


def test_new_messages_are_still_checked():
    """A known message skips the checks; a new one after it does not: a lone surrogate in it
    is refused, naming where it is."""
    first = json.dumps({"messages": [{"role": "user", "content": "a"}]}).encode()
    _, known = loads_split(first)
    bad = first[:-2] + b',{"role": "user", "content": "\\udfff"}]}'
    with pytest.raises(RequestError, match="surrogate") as e:
        loads_split(bad, known)
    assert e.value.param == "messages[1].content"


# --- through the proxy: the same records with and without the memo -----------------------------


def _post(srv, path, body, session):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": "application/json", "authorization": f"Bearer {token(session)}"}
    r = httpx.post(srv.url + path, content=raw, headers=headers, timeout=30)
    return r.status_code, r.json()


def _chat_steps():
    """OpenAI chat requests of one session: normal turns, then an edited earlier message, a
    reordered pair, a changed tool definition, bad bodies, a number's type changed in a tool
    call's arguments, and normal turns again. Each step: (body or a function of the last
    answer and messages)."""
    tools = json.loads(json.dumps(TOOLS))
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "do it"}]
    steps = []

    def extend(answer, msgs):
        m = answer["choices"][0]["message"]
        msgs.append({k: m[k] for k in ("role", "content", "tool_calls") if k in m})
        for c in m.get("tool_calls") or []:
            msgs.append({"role": "tool", "tool_call_id": c["id"], "content": f"out {len(msgs)}"})
        if not m.get("tool_calls"):
            msgs.append({"role": "user", "content": f"next {len(msgs)}"})

    for _ in range(4):
        steps.append(("turn", lambda: {"model": "m", "messages": msgs, "tools": tools}))
    steps.append(("edit", lambda: {"model": "m", "messages": [msgs[0], {**msgs[1], "content": "x"}, *msgs[2:]], "tools": tools}))  # fmt: skip
    steps.append(("swap", lambda: {"model": "m", "messages": [msgs[1], msgs[0], *msgs[2:]], "tools": tools}))  # fmt: skip
    other = json.loads(json.dumps(TOOLS))
    other[0]["function"]["description"] = "changed"
    steps.append(("tools", lambda: {"model": "m", "messages": msgs, "tools": other}))
    steps.append(("cut", lambda: json.dumps({"model": "m", "messages": msgs}).encode()[:-9]))
    steps.append(("invalid", lambda: b'{"model": "m", "messages": [' + b"{}," * 3 + b"]}"))
    steps.append(("surrogate", lambda: {"model": "m", "messages": [*msgs, {"role": "user", "content": "\udfff"}]}))  # fmt: skip
    steps.append(("retype", lambda: {"model": "m", "messages": _retyped(msgs), "tools": tools}))
    for _ in range(3):
        steps.append(("turn", lambda: {"model": "m", "messages": msgs, "tools": tools}))
    return msgs, steps, extend


def _retyped(msgs):
    """The history with the first tool call's arguments sent as an object with a float."""
    out = json.loads(json.dumps(msgs))
    for m in out:
        for c in m.get("tool_calls") or []:
            c["function"]["arguments"] = {**json.loads(c["function"]["arguments"]), "n": 1.0}
            return out
    return out


def _run_chat(srv, session):
    msgs, steps, extend = _chat_steps()
    answers = []
    for kind, body in steps:
        b = body()
        if isinstance(b, dict) and kind == "surrogate":
            b = json.dumps(b).encode()  # json.dumps writes the lone surrogate as an escape
        status, answer = _post(srv, "/v1/chat/completions", b, session)
        answers.append((kind, status, _strip_ids(answer)))
        if kind == "turn" and status == 200:
            extend(answer, msgs)
    return answers


def _strip_ids(answer):
    s = json.dumps(answer)
    for key in ("id", "created"):
        s = json.dumps(_drop(json.loads(s), key))
    return json.loads(s)


def _drop(v, key):
    if isinstance(v, dict):
        return {k: _drop(x, key) for k, x in v.items() if k != key}
    if isinstance(v, list):
        return [_drop(x, key) for x in v]
    return v


def _records(path, session):
    calls = [c for c in read_calls(path) if c.session == session]
    index = {c.call_id: i for i, c in enumerate(calls)}
    out = []
    for c in calls:
        d = c.to_dict()
        for k in ("call_id", "started_at", "ended_at", "engine"):  # engine: the script path
            d.pop(k)
        d["prefix"] = {**d["prefix"], "parent_call": index.get(d["prefix"]["parent_call"])}
        out.append(d)
    return out


def _script():
    return [
        tool_call_text("bash", {"command": f"ls {i}"}) if i % 3 else f"text answer {i}"
        for i in range(12)
    ]


def test_chat_records_are_the_same_with_and_without_the_memo(make_server, tmp_path):
    """A chat session with normal turns, an edited earlier message, a reordered pair, a changed
    tool definition, truncated / invalid / unpaired-surrogate bodies and a retyped tool-call
    argument: the proxy that reuses parsed history answers and records exactly what a proxy
    that parses every body in full does (prompt ids, prefix bookkeeping, drift verdicts)."""
    fast = make_server(_script(), record=str(tmp_path / "fast.jsonl"))
    slow = make_server(_script(), record=str(tmp_path / "slow.jsonl"))
    slow.proxy._passthrough_only = True  # reads every body the plain way
    answers = _run_chat(fast, "c")
    assert answers == _run_chat(slow, "c")
    bad = {"cut", "invalid", "surrogate"}
    assert [status for kind, status, _ in answers] == [
        400 if k in bad else 200 for k, *_ in answers
    ]
    got, want = _records(tmp_path / "fast.jsonl", "c"), _records(tmp_path / "slow.jsonl", "c")
    assert got == want and len(got) == len(answers) - len(bad)
    kinds = [r["prefix"]["parent_call"] is not None for r in got]
    assert kinds.count(True) >= 4  # reuse happened: the comparison is not vacuous
    memo = fast.proxy.parse_memo.stats()
    assert memo["reused_messages"] > 20 and slow.proxy.parse_memo.stats()["reused_messages"] == 0


def _anthropic_turns():
    """The captured Claude Code and OpenClaw (Anthropic) requests, cut at each assistant
    message: the bodies a harness sent turn by turn."""
    for path in sorted(HARNESS_REQUESTS.glob("*.json")):
        d = json.loads(path.read_text())
        if not d["path"].startswith("/v1/messages"):
            continue
        body = d["body"]
        cuts = [i for i, m in enumerate(body["messages"]) if m["role"] == "assistant"]
        for cut in [*cuts, len(body["messages"])]:
            yield path.stem, {**body, "messages": body["messages"][:cut], "stream": False}


def test_harness_requests_record_the_same_with_and_without_the_memo(make_server, tmp_path):
    """The captured Anthropic harness requests replayed turn by turn (with a re-sent history
    that grows): the same answers and records with the memo as without."""
    turns = list(_anthropic_turns())
    assert len(turns) >= 4
    script = [f"answer {i}" for i in range(len(turns))]
    fast = make_server(script, record=str(tmp_path / "fast.jsonl"))
    slow = make_server(script, record=str(tmp_path / "slow.jsonl"))
    slow.proxy._passthrough_only = True
    for srv in (fast, slow):
        for name, body in turns:
            status, answer = _post(srv, "/v1/messages", body, name)
            assert status == 200, answer
    for name in {n for n, _ in turns}:
        got = _records(tmp_path / "fast.jsonl", name)
        assert got == _records(tmp_path / "slow.jsonl", name) and got
    assert fast.proxy.parse_memo.stats()["reused_messages"] > 0


# --- the prompt as an array ---------------------------------------------------------------------


def test_a_reused_prompt_is_an_array_recorded_as_the_same_list(tmp_path):
    """A prompt built by reuse is held as array('q') (its list is made only when asked for);
    a record of it, written with or without its cached JSON, holds the same ids as a list."""
    from array import array

    from claw_proxy.messages import Answer, ChatRequest, Message
    from claw_proxy.records import Call, CallWriter
    from claw_proxy.render import PrefixCache, Renderer

    r = Renderer(str(TINY))
    cache = PrefixCache(r)
    first = (Message(role="user", content="hi"),)
    r1 = cache.render("s", ChatRequest(api="openai.chat", model="m", messages=first))
    sampled = r.render_answer("hello")
    answer = Answer(
        text="hello",
        reasoning="",
        tool_calls=(),
        finish_reason="stop",
        prompt_tokens=0,
        completion_tokens=0,
    )
    cache.remember("s", "c0", r1, answer, sampled)
    nxt = (*first, Message(role="assistant", content="hello"), Message(role="user", content="go"))
    r2 = cache.render("s", ChatRequest(api="openai.chat", model="m", messages=nxt))
    assert r2.parent_call == "c0" and isinstance(r2.prompt_array, array)
    n = len(r1.prompt_ids) + len(sampled)
    assert r2.prompt_ids[:n] == r1.prompt_ids + sampled and len(r2.prompt_ids) > n
    assert r2.prompt_ids == r2.prompt_array.tolist() == json.loads(f"[{r2.prompt_json}]")
    writer = CallWriter(tmp_path / "calls.jsonl")
    for cached in (r2.prompt_json, None):
        call = Call(
            call_id="c1",
            session="s",
            seq=1,
            api="openai.chat",
            model="m",
            policy={"name": "p", "version": 0},
            engine="vllm:x",
            trainable=True,
            prompt_ids=r2.prompt_array,
            completion_ids=[1],
            completion_logprobs=[-0.5],
            prefix=r2.prefix_record(),
            finish_reason="stop",
            sampling={"temperature": 1.0, "top_p": 1.0, "top_k": 0},
            usage={"prompt_tokens": len(r2.prompt_array), "completion_tokens": 1},
            started_at=0.0,
            ended_at=0.0,
            tags={},
        )
        writer.write(call, prompt_ids_json=cached)
    writer.close()
    got = [c.prompt_ids for c in read_calls(tmp_path / "calls.jsonl")]
    assert got == [r2.prompt_ids, r2.prompt_ids]


def test_records_are_the_same_with_the_one_pass_render(make_server, tmp_path):
    """The chat session of the memo test (normal turns, edits, reorders, bad bodies) and the
    captured Anthropic harness requests: a proxy that renders by the one-pass boundary check
    on the event loop records exactly what a proxy on the two-pass path does."""
    fast = make_server(_script(), record=str(tmp_path / "fast.jsonl"))
    slow = make_server(_script(), record=str(tmp_path / "slow.jsonl"))
    for cache in slow.proxy.caches.values():
        cache.one_pass = False  # two passes, always on a worker thread
    quick = []
    for cache in fast.proxy.caches.values():
        real = cache.quick_render
        cache.quick_render = lambda *a, real=real: quick.append(real(*a)) or quick[-1]
    assert _run_chat(fast, "c") == _run_chat(slow, "c")
    for srv in (fast, slow):
        for name, body in _anthropic_turns():
            status, answer = _post(srv, "/v1/messages", body, name)
            assert status == 200, answer
    sessions = {"c", *(name for name, _ in _anthropic_turns())}
    for session in sessions:
        got = _records(tmp_path / "fast.jsonl", session)
        assert got == _records(tmp_path / "slow.jsonl", session) and got, session
    assert any(r is not None for r in quick)  # the one-pass path was taken
