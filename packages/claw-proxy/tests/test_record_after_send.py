"""A call's record is on disk before its answer's last byte is sent; the prefix cache learns
the call right after (the answer does not wait for that), and before the proxy serves anything
else: the ASGI app driven directly, looking at the record file and the cache at each message
the app sends."""

from __future__ import annotations

import asyncio
import json

import pytest
from claw_proxy import ProxyConfig, read_calls
from claw_proxy.server import Proxy
from proxy_testlib import SECRET, TINY, token, write_script


def _proxy(tmp_path) -> Proxy:
    script = write_script(tmp_path / "s.jsonl", ["an answer", "another"])
    return Proxy(
        ProxyConfig(
            engine=f"scripted:{script}",
            tokenizer=str(TINY),
            secret=SECRET,
            record=str(tmp_path / "calls.jsonl"),
        )
    )


async def _drive(proxy: Proxy, body: dict, session: str, on_send):
    """POST `body` to the app; `on_send(message)` sees each message sent (and may raise)."""
    raw = json.dumps(body).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"content-type", b"application/json"),
            (b"authorization", f"Bearer {token(session)}".encode()),
            (b"content-length", str(len(raw)).encode()),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }
    sent = False

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await asyncio.sleep(3600)

    async def send(msg):
        on_send(msg)

    await proxy.app(scope, receive, send)


def _lines(tmp_path) -> list[str]:
    path = tmp_path / "calls.jsonl"
    return path.read_text().splitlines() if path.exists() else []


def _cached(proxy: Proxy, session: str) -> int:
    (cache,) = proxy.caches.values()
    return len(cache._sessions.get(session, ()))


@pytest.mark.parametrize("stream", [False, True])
def test_recorded_before_the_answer_cached_after(tmp_path, stream):
    """When the answer's last byte (the whole body, or the [DONE] frame) is sent, the call is
    recorded (with the call id its header named) but not yet in the prefix cache; when the app
    returns it is, and the session's next call extends it."""
    proxy = _proxy(tmp_path)
    seen: list[tuple[bytes, int, int]] = []
    call_ids: list[str] = []

    def on_send(msg):
        if msg["type"] == "http.response.start":
            call_ids.extend(v.decode() for k, v in msg["headers"] if k == b"x-claw-call-id")
        elif msg.get("body"):
            seen.append((msg["body"], len(_lines(tmp_path)), _cached(proxy, "s1")))

    msgs = [{"role": "user", "content": "hi"}]
    body = {"model": "m", "messages": msgs, "stream": stream}
    asyncio.run(_drive(proxy, body, "s1", on_send))
    last, recorded_then, cached_then = seen[-1]
    assert (b"[DONE]" in last) if stream else (b'"an answer"' in last)
    assert (recorded_then, cached_then, _cached(proxy, "s1")) == (1, 0, 1)
    (call,) = read_calls(tmp_path / "calls.jsonl")
    assert call_ids == [call.call_id]
    answer = {"role": "assistant", "content": "an answer"}
    nxt = {**body, "messages": [*msgs, answer, {"role": "user", "content": "more"}]}
    asyncio.run(_drive(proxy, nxt, "s1", lambda msg: None))
    first, second = read_calls(tmp_path / "calls.jsonl")
    assert second.prefix["parent_call"] == first.call_id and second.seq == 1
    assert proxy.sessions["s1"].in_flight == 0


def test_an_answer_the_client_did_not_take_is_still_recorded_and_cached(tmp_path):
    """Sending the body fails (the client is gone): the call is recorded and cached, and its
    slot is freed."""
    proxy = _proxy(tmp_path)

    def on_send(msg):
        if msg["type"] == "http.response.body":
            raise OSError("client gone")

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(OSError, match="client gone"):
        asyncio.run(_drive(proxy, body, "s2", on_send))
    (call,) = read_calls(tmp_path / "calls.jsonl")
    assert call.session == "s2" and proxy.sessions["s2"].in_flight == 0
    assert _cached(proxy, "s2") == 1
