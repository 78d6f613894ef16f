"""OpenAI chat completions return the engine's logprobs when asked (`logprobs: true`)."""

from __future__ import annotations

import json

import httpx
import pytest
from claw_proxy import read_calls
from proxy_testlib import TINY, token


def _post(srv, body, session="s1"):
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        return c.post(
            "/v1/chat/completions",
            content=json.dumps(body),
            headers={
                "content-type": "application/json",
                "authorization": f"Bearer {token(session)}",
            },
        )


def _chat(**kw) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw}


def _joined(entries) -> str:
    return bytes(b for e in entries for b in e["bytes"]).decode("utf-8")


def test_scripted_answer_carries_one_entry_per_token(make_server):
    """logprobs: true gives one {token, logprob, bytes, top_logprobs} per completion token (no EOS); their bytes spell the answer."""
    srv = make_server(["héllo wörld"])
    r = _post(srv, _chat(logprobs=True, top_logprobs=0))
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    entries = choice["logprobs"]["content"]
    assert _joined(entries) == choice["message"]["content"] == "héllo wörld"
    assert all(set(e) == {"token", "logprob", "bytes", "top_logprobs"} for e in entries)
    assert all(
        e["logprob"] == 0.0 and e["top_logprobs"] == [] for e in entries
    )  # a script is deterministic
    (call,) = read_calls(srv.config.record)
    assert len(entries) == len(call.completion_ids) - 1  # the recorded ids end with the EOS


def test_no_logprobs_unless_asked(make_server):
    """Without logprobs: true the choice's logprobs is null, in answers and in chunks."""
    srv = make_server(["hello", "hello"])
    assert _post(srv, _chat()).json()["choices"][0]["logprobs"] is None
    lines = [
        ln for ln in _post(srv, _chat(stream=True)).text.splitlines() if ln.startswith("data: {")
    ]
    assert lines and all(json.loads(ln[6:])["choices"][0]["logprobs"] is None for ln in lines)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"logprobs": True, "top_logprobs": 3}, "not supported beyond 0"),
        ({"logprobs": True, "top_logprobs": 21}, "between 0 and 20"),
        ({"logprobs": "yes"}, "boolean"),
    ],
)
def test_unsupported_logprob_requests_are_400(make_server, extra, message):
    """top_logprobs > 0 (the engines report only the sampled token) and malformed values get a 400 naming the field."""
    srv = make_server()
    r = _post(srv, _chat(**extra))
    assert r.status_code == 400
    err = r.json()["error"]
    assert message in err["message"] and err["param"] in ("top_logprobs", "logprobs")


def test_sdk_stream_and_non_stream_logprobs_agree_with_the_record(tiny_server, clients):
    """The openai SDK: streamed chunks' logprobs equal the non-streamed answer's and the recorded completion_logprobs."""
    pytest.importorskip("torch", reason="the transformers engine needs claw-proxy[transformers]")
    client = clients.openai(tiny_server, "lp1")
    kw = dict(
        model="m",
        messages=[{"role": "user", "content": "say something"}],
        seed=5,
        temperature=1.0,
        max_tokens=12,
        logprobs=True,
    )
    full = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True))
    streamed = [
        e
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    plain = full.choices[0].logprobs.content
    assert [(e.token, e.bytes, e.logprob) for e in streamed] == [
        (e.token, e.bytes, e.logprob) for e in plain
    ]
    assert len(plain) > 0 and any(e.logprob < 0 for e in plain)
    calls = [c for c in read_calls(tiny_server.config.record) if c.session == "lp1"]
    assert len(calls) == 2 and calls[0].completion_ids == calls[1].completion_ids
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TINY))
    stops = {tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")}
    kept = [
        (i, lp)
        for i, lp in zip(calls[0].completion_ids, calls[0].completion_logprobs, strict=True)
        if i not in stops
    ]
    assert [e.logprob for e in plain] == [lp for _, lp in kept]
    assert bytes(b for e in plain for b in e.bytes) == tok.decode([i for i, _ in kept]).encode(
        "utf-8"
    )


def _responses(srv, body, session="s1"):
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        return c.post(
            "/v1/responses",
            content=json.dumps(body),
            headers={
                "content-type": "application/json",
                "authorization": f"Bearer {token(session)}",
            },
        )


def test_responses_include_output_text_logprobs(make_server):
    """Responses API: include message.output_text.logprobs puts the entries on output_text, streamed deltas carry the same ones."""
    srv = make_server(["héllo wörld", "héllo wörld", "héllo wörld"])
    body = {"model": "m", "input": "hi", "include": ["message.output_text.logprobs"]}
    (part,) = _responses(srv, body).json()["output"][0]["content"]
    assert _joined(part["logprobs"]) == part["text"] == "héllo wörld"
    events = [
        json.loads(ln[6:])
        for ln in _responses(srv, {**body, "stream": True}).text.splitlines()
        if ln.startswith("data: ")
    ]
    deltas = [
        e for ev in events if ev["type"] == "response.output_text.delta" for e in ev["logprobs"]
    ]
    (done,) = [ev for ev in events if ev["type"] == "response.completed"]
    assert deltas == part["logprobs"] == done["response"]["output"][0]["content"][0]["logprobs"]
    plain = _responses(srv, {"model": "m", "input": "hi"}).json()
    assert "logprobs" not in plain["output"][0]["content"][0]


def test_sdk_responses_stream_and_non_stream_logprobs_agree(tiny_server, clients):
    """The openai SDK's Responses client reads the output_text logprobs; streamed deltas give the same entries."""
    pytest.importorskip("torch", reason="the transformers engine needs claw-proxy[transformers]")
    client = clients.openai(tiny_server, "lp2")
    kw = dict(
        model="m",
        input="say something",
        temperature=1.0,
        max_output_tokens=12,
        include=["message.output_text.logprobs"],
    )
    full = client.responses.create(**kw, extra_body={"seed": 3})
    entries = [
        (e.token, e.logprob)
        for item in full.output
        if item.type == "message"
        for p in item.content
        for e in p.logprobs
    ]
    events = list(client.responses.create(**kw, stream=True, extra_body={"seed": 3}))
    streamed = [
        (e.token, e.logprob)
        for ev in events
        if ev.type == "response.output_text.delta"
        for e in ev.logprobs
    ]
    assert entries and streamed == entries
