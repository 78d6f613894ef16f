"""The official openai and anthropic SDKs against the proxy serving the tiny model in-process."""

from __future__ import annotations

import concurrent.futures as cf
import json

import httpx
import pytest
from claw_proxy import read_calls
from proxy_testlib import ADMIN, TINY, TOOLS, reference_logprobs

torch = pytest.importorskip(
    "torch", reason="the transformers engine needs claw-proxy[transformers]"
)


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(TINY), dtype=torch.float32)
    m.eval()
    return m


def _calls(srv, session):
    return [c for c in read_calls(srv.config.record) if c.session == session]


def _check_logprobs(model, call):
    """Recorded logprobs equal a fresh forward pass over prompt + completion under the call's
    recorded sampling settings."""
    want = reference_logprobs(model, call)
    assert len(want) == len(call.completion_logprobs) > 0
    assert max(abs(a - b) for a, b in zip(want, call.completion_logprobs, strict=True)) < 1e-4


def test_openai_chat_stream_equals_non_stream_and_logprobs_match(tiny_server, model, clients):
    """Same seed: the streamed and non-streamed answers are identical; ids and logprobs recorded."""
    client = clients.openai(tiny_server, "chat1", task="t")
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    full = client.chat.completions.create(
        model="gpt-4o", messages=msgs, tools=TOOLS, seed=7, max_tokens=16
    )
    chunks = list(
        client.chat.completions.create(
            model="gpt-4o",
            messages=msgs,
            tools=TOOLS,
            seed=7,
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == full.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens == 16
    assert full.choices[0].finish_reason == "length"
    calls = _calls(tiny_server, "chat1")
    assert len(calls) == 2 and calls[0].completion_ids == calls[1].completion_ids
    assert calls[0].tags == {"task": "t"} and calls[0].model == "gpt-4o"
    assert calls[0].sampling["seed"] == 7 and calls[0].sampling["max_tokens"] == 16
    for c in calls:
        _check_logprobs(model, c)


def test_anthropic_messages_stream_equals_non_stream(tiny_server, model, clients):
    """Anthropic SDK: message and the streamed final message agree; records match the model."""
    client = clients.anthropic(tiny_server, "anth1")
    kw = dict(
        model="claude-opus-4-1",
        max_tokens=12,
        system=[{"type": "text", "text": "sys"}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "hello"}]}],
        extra_body={"temperature": 0.0},
    )
    full = client.messages.create(**kw)
    with client.messages.stream(**kw) as s:
        final = s.get_final_message()
    assert [b.text for b in full.content] == [b.text for b in final.content]
    assert full.stop_reason == final.stop_reason == "max_tokens"
    assert full.usage.output_tokens == 12
    calls = _calls(tiny_server, "anth1")
    assert [c.api for c in calls] == ["anthropic.messages"] * 2
    _check_logprobs(model, calls[1])


def test_responses_api_stream_and_non_stream(tiny_server, clients):
    """Responses API: output text streamed equals the non-streamed output text."""
    client = clients.openai(tiny_server, "resp1")
    kw = dict(
        model="gpt-5",
        input=[{"role": "developer", "content": "sys"}, {"role": "user", "content": "hi"}],
        max_output_tokens=10,
        temperature=0.0,
    )
    full = client.responses.create(**kw)
    with client.responses.stream(**kw) as s:
        events = list(s)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == full.output_text
    assert full.status == "incomplete" and events[-1].type == "response.incomplete"


def test_multi_turn_with_tool_results_reuses_prefix(tiny_server, model, clients):
    """A tool-using multi-turn conversation: each prompt starts with the previous prompt + completion."""
    client = clients.openai(tiny_server, "multi1")
    msgs = [{"role": "user", "content": "list files"}]
    for turn in range(3):
        r = client.chat.completions.create(
            model="m", messages=msgs, tools=TOOLS, max_tokens=8, seed=turn
        )
        msgs.append({"role": "assistant", "content": r.choices[0].message.content})
        # the harness asks for a tool on the model's behalf in this test: results go back as tool messages
        msgs.append({"role": "user", "content": f"turn {turn} done"})
    calls = _calls(tiny_server, "multi1")
    for prev, cur in zip(calls, calls[1:], strict=False):
        assert (
            cur.prompt_ids[: len(prev.prompt_ids) + len(prev.completion_ids)]
            == prev.prompt_ids + prev.completion_ids
        )
        assert cur.prefix["parent_call"] == prev.call_id
        assert cur.prefix["reused_tokens"] == len(prev.prompt_ids) + len(prev.completion_ids)
    _check_logprobs(model, calls[-1])


def test_concurrent_requests_are_batched(tiny_server, clients, model):
    """Concurrent sessions are answered together: fewer engine batches than requests, and the
    logprobs of rows of different prompt lengths (left-padded together) match a forward pass."""
    admin = {"authorization": f"Bearer {ADMIN}"}
    before = httpx.get(tiny_server.url + "/admin/stats", headers=admin).json()["engines"]
    before = next(iter(before.values()))

    def one(i):
        c = cs[i]
        return c.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": f"q{i} " + "word " * (3 * i)}],
            max_tokens=24,
        )

    cs = [clients.openai(tiny_server, f"conc{i}") for i in range(8)]
    with cf.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, range(8)))
    assert all(a.usage.completion_tokens >= 1 for a in answers)
    after = next(
        iter(httpx.get(tiny_server.url + "/admin/stats", headers=admin).json()["engines"].values())
    )
    assert after["batched_rows"] - before["batched_rows"] == 8
    assert after["batches"] - before["batches"] < 8
    for i in range(8):
        (call,) = _calls(tiny_server, f"conc{i}")
        _check_logprobs(model, call)


def test_record_bodies_kept(tiny_server):
    """With record_bodies, each record carries the raw request and the non-streamed answer."""
    c = _calls(tiny_server, "chat1")[1]
    assert c.request["stream"] is True
    assert c.response["object"] == "chat.completion"
    json.dumps(c.to_dict())


@pytest.mark.slow
def test_requests_join_a_running_batch(tmp_path, model):
    """Continuous batching: short requests sent while a long one decodes join its batch, finish
    first, and every row's logprobs (merged, left-padded, trimmed caches) match a forward pass."""
    from claw_proxy import ProxyConfig, ProxyServer, mint_token
    from proxy_testlib import SECRET

    cfg = ProxyConfig(
        engine=f"transformers:{TINY}",
        secret=SECRET,
        admin_token=ADMIN,
        record=str(tmp_path / "calls.jsonl"),
        max_tokens_cap=600,
    )
    with ProxyServer(cfg) as srv, httpx.Client(base_url=srv.url, timeout=120) as h:

        def ask(session, text, n, stream=False):
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": text}],
                "max_tokens": n,
                "stream": stream,
                "ignore_eos": stream,  # the long one decodes all n tokens whatever it samples
            }
            return h.build_request(
                "POST",
                "/v1/chat/completions",
                json=body,
                headers={"authorization": f"Bearer {mint_token(session, SECRET)}"},
            )

        r = h.send(ask("long", "tell a long story", 300, stream=True), stream=True)
        try:
            lines = r.iter_lines()
            next(lines)
            with cf.ThreadPoolExecutor(4) as pool:
                short = list(
                    pool.map(
                        lambda i: h.send(ask(f"short{i}", "q " * (2 + 5 * i), 6)).status_code,
                        range(4),
                    )
                )
            rest = list(lines)
        finally:
            r.close()
        assert short == [200] * 4 and "data: [DONE]" in rest
    calls = {c.session: c for c in read_calls(cfg.record)}
    assert all(calls[f"short{i}"].ended_at < calls["long"].ended_at for i in range(4))
    assert len(calls["long"].completion_ids) == 300  # still decoding when the short ones were done
    for c in calls.values():
        _check_logprobs(model, c)


def test_engine_worker_runs_on_its_own_thread_count_and_leaves_the_default():
    """The engine's worker runs torch on `threads` intra-op threads (default 1); the caller's
    count and what a thread started afterwards gets are unchanged (a learner in the same process
    keeps its threads); threads=None leaves the worker on the default."""
    import asyncio
    import threading

    from claw_proxy._transformers import TransformersEngine

    def fresh() -> int:
        got: list[int] = []
        t = threading.Thread(target=lambda: got.append(torch.get_num_threads()))
        t.start()
        t.join()
        return got[0]

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:

        async def start(**kw) -> int:
            engine = TransformersEngine(str(TINY), **kw)
            await engine.aclose()
            return engine.worker_threads

        assert asyncio.run(start()) == 1
        assert torch.get_num_threads() == 2 and fresh() == 2
        assert asyncio.run(start(threads=None)) == 2
    finally:
        torch.set_num_threads(before)
