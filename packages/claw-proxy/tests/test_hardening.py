"""Hostile inputs: request shapes that once gave 500, bodies over the limit while they stream,
oversized prompts, the prefix cache's memory budget, sequence numbers across restarts, slow
connections."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from claw_proxy import ProxyConfig, read_calls
from claw_proxy.render import Renderer
from claw_proxy.server import Proxy
from proxy_testlib import ADMIN, SECRET, TINY, token, write_script

ADMIN_H = {"authorization": f"Bearer {ADMIN}"}


def _post(srv, path, raw: bytes, session="s1"):
    h = {"content-type": "application/json", "x-api-key": token(session)}
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        return c.post(path, content=raw, headers=h)


def _chat(content="hi", **extra) -> bytes:
    return json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": content}], **extra}
    ).encode()


@pytest.mark.parametrize(
    ("path", "raw", "needle"),
    [
        (
            "/v1/chat/completions",
            b'{"model":"m","messages":[{"role":"user","content":"a\\ud800b"}]}',
            "messages[0].content: the request body has a string with a lone UTF-16 surrogate",
        ),
        (
            "/v1/chat/completions",
            '{"model":"m","messages":[{"role":"user","content":"\ud800"}]}'.encode(
                "utf-8", "surrogatepass"
            ),
            "messages[0].content: the request body has a string with a lone UTF-16 surrogate",
        ),
        (
            "/v1/messages",
            b'{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}],"x":'
            + b"[" * 1000
            + b"]" * 1000
            + b"}",
            "nested too deeply",
        ),
        (
            "/v1/chat/completions",
            b'{"model":"m","messages":[{"role":"user","content":"hi"}],"metadata":'
            + b'{"a":' * 200
            + b"1"
            + b"}" * 200
            + b"}",
            "nested too deeply",
        ),
        (
            "/v1/responses",
            json.dumps({"model": "m", "input": "hi", "tools": [{"type": {}}]}).encode(),
            "tools[0].type: a tool needs a string 'type', got dict",
        ),
        (
            "/v1/chat/completions",
            json.dumps(
                {
                    "model": "m",
                    "messages": [
                        {"role": "user", "content": "x"},
                        {"role": "assistant", "content": [{"type": "refusal", "refusal": 5}]},
                        {"role": "user", "content": "y"},
                    ],
                }
            ).encode(),
            "messages[1].content[0].refusal: a refusal part needs a string 'refusal', got int",
        ),
        (
            "/v1/chat/completions",
            b'{"model":"m","temperature":NaN,"messages":[{"role":"user","content":"x"}]}',
            "holds the number NaN",
        ),
        (
            "/v1/chat/completions",
            b'{"model":"m","temperature":1e999,"messages":[{"role":"user","content":"x"}]}',
            "holds the number 1e999",
        ),
    ],
    ids=[
        "surrogate",
        "surrogate-utf8",
        "deep-1000",
        "deep-200",
        "tool-type-object",
        "refusal-int",
        "nan",
        "1e999",
    ],
)
def test_former_500s_get_400_and_no_record(make_server, tmp_path, path, raw, needle):
    """Each request shape that once crashed the handler is a 400 naming the problem."""
    srv = make_server()
    r = _post(srv, path, raw)
    assert r.status_code == 400, r.text
    assert needle in r.text
    assert not (tmp_path / "calls.jsonl").exists() or not (tmp_path / "calls.jsonl").read_text()


def test_chunked_body_is_refused_as_soon_as_it_passes_the_limit(tmp_path):
    """A chunked upload gets 413 once it passes --max-body-bytes; the rest is never read."""
    script = write_script(tmp_path / "s.jsonl", ["hi"])
    proxy = Proxy(
        ProxyConfig(
            engine=f"scripted:{script}", tokenizer=str(TINY), secret=SECRET, max_body_bytes=4096
        )
    )
    received, sent = [], []

    async def receive():
        received.append(1)
        return {"type": "http.request", "body": b" " * 1024, "more_body": len(received) < 500_000}

    async def send(message):
        sent.append(message)

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
            (b"transfer-encoding", b"chunked"),
            (b"x-api-key", token("s1").encode()),
            (b"content-type", b"application/json"),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }
    asyncio.run(proxy.app(scope, receive, send))
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 413
    assert len(received) <= 6  # 4 KiB in 1 KiB chunks, then the one that passes the limit
    assert b"over the limit of 4096" in sent[1]["body"]
    proxy.workers.shutdown()


def test_prompt_over_max_prompt_tokens_gets_413(make_server, tmp_path):
    """A rendered prompt longer than --max-prompt-tokens is refused with 413 and not recorded."""
    srv = make_server(max_prompt_tokens=200)
    assert _post(srv, "/v1/chat/completions", _chat("word " * 20)).status_code == 200
    r = _post(srv, "/v1/chat/completions", _chat("word " * 400), session="s2")
    assert r.status_code == 413 and "over this proxy's limit of 200" in r.text
    assert len((tmp_path / "calls.jsonl").read_text().splitlines()) == 1
    with httpx.Client(base_url=srv.url) as c:  # the session's in-flight slot was released
        sess = c.get("/admin/sessions/s2", headers=ADMIN_H).json()
    assert sess["in_flight"] == 0


def test_prefix_cache_budget_evicts_cold_sessions_without_changing_tokens(make_server, tmp_path):
    """With a tiny --prefix-cache-bytes, cold sessions are evicted; continuing one reads its
    earlier ids back from the records (the same ids a fresh render gives here, where nothing was
    dropped), just as a warm one reuses them."""
    srv = make_server(["first answer", "second answer"], prefix_cache_bytes=2500)
    first = [{"role": "user", "content": "hello there"}]
    for s in ("a", "b", "c", "d"):
        assert (
            _post(srv, "/v1/chat/completions", _chat("hello there"), session=s).status_code == 200
        )
    with httpx.Client(base_url=srv.url) as c:
        cache = c.get("/admin/stats", headers=ADMIN_H).json()["prefix_cache"][str(TINY)]
    assert cache["evicted_sessions"] >= 1 and cache["bytes"] <= 2500
    second = [
        *first,
        {"role": "assistant", "content": "first answer"},
        {"role": "user", "content": "go on"},
    ]
    body = json.dumps({"model": "m", "messages": second}).encode()
    assert _post(srv, "/v1/chat/completions", body, session="a").status_code == 200  # evicted
    assert _post(srv, "/v1/chat/completions", body, session="d").status_code == 200  # warm
    calls = {(c.session, c.seq): c for c in read_calls(tmp_path / "calls.jsonl")}
    from claw_proxy import api_chat

    fresh = Renderer(str(TINY)).render_full(api_chat.parse({"model": "m", "messages": second}))
    for s in ("a", "d"):
        prev, cur = calls[(s, 0)], calls[(s, 1)]
        assert cur.prompt_ids == fresh and cur.prefix["fresh_render_matches"] is True
        assert cur.prefix["parent_call"] == prev.call_id and "fork_reason" not in cur.prefix
        assert (
            cur.prompt_ids[: cur.prefix["reused_tokens"]] == prev.prompt_ids + prev.completion_ids
        )
    with httpx.Client(base_url=srv.url) as c:
        cache = c.get("/admin/stats", headers=ADMIN_H).json()["prefix_cache"][str(TINY)]
    assert cache["recovered_calls"] >= 1 and cache["forks"] == {}


def _closed_by_server(sock, timeout: float) -> bool:
    """True when the server closes the socket within `timeout` seconds (EOF or reset)."""

    sock.settimeout(timeout)
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_slow_header_connections_do_not_stop_a_normal_client(make_server):
    """200 connections that never finish their headers, over a cap of 50: the oldest are
    closed to make room, a normal client is served, and the rest time out."""
    import socket

    srv = make_server(max_connections=50, header_timeout=3.0)
    slow = []
    try:
        for _ in range(200):
            s = socket.create_connection((srv.host, srv.port))
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: 1")
            slow.append(s)
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            assert c.get("/healthz").status_code == 200
            r = c.post(
                "/v1/chat/completions",
                content=_chat(),
                headers={"x-api-key": token("ok"), "content-type": "application/json"},
            )
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "hello"
        # the cap closed at least the 150 oldest; the header timeout closes the others
        assert sum(_closed_by_server(s, 0.5) for s in slow[:150]) == 150
        assert all(_closed_by_server(s, 30) for s in slow[150:])
    finally:
        for s in slow:
            s.close()


def test_seq_continues_after_a_restart_on_the_same_records(make_server, tmp_path):
    """A proxy restarted on the same --record file numbers each known session's calls on from
    the last recorded seq; a new session starts at 0."""
    srv = make_server()
    for s in ("a", "a", "b"):
        assert _post(srv, "/v1/chat/completions", _chat(), session=s).status_code == 200
    srv.stop()
    srv = make_server()
    for s in ("a", "b", "c"):
        assert _post(srv, "/v1/chat/completions", _chat(), session=s).status_code == 200
    seqs = [(c.session, c.seq) for c in read_calls(tmp_path / "calls.jsonl")]
    assert seqs == [("a", 0), ("a", 1), ("b", 0), ("a", 2), ("b", 1), ("c", 0)]


def _serve(tmp_path, *args):
    from claw_proxy.cli import main
    from click.testing import CliRunner

    secret = tmp_path / "secret.txt"
    secret.write_text("s")
    return CliRunner().invoke(main, ["serve", "--secret-file", str(secret), *args])


def test_serve_refuses_bad_record_paths_in_one_line(tmp_path):
    """--record DIR or a file in a missing directory: one line on stderr, exit status 2."""
    for path, needle in (
        (tmp_path, "is a directory"),
        (tmp_path / "missing" / "calls.jsonl", "does not exist"),
    ):
        r = _serve(tmp_path, "--engine", f"transformers:{TINY}", "--record", str(path))
        assert r.exit_code == 2 and needle in r.output
        assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output


def test_serve_checks_model_and_port_before_announcing(tmp_path):
    """A missing model directory or a port in use is a clear error and nothing is announced."""
    r = _serve(tmp_path, "--engine", "transformers:nope")
    assert r.exit_code == 1 and "nope is not a directory" in r.output
    assert "Repo id" not in r.output and "serving" not in r.output
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        script = write_script(tmp_path / "s.jsonl", ["hi"])
        r = _serve(
            tmp_path,
            "--engine",
            f"scripted:{script}",
            "--tokenizer",
            str(TINY),
            "--port",
            str(port),
        )
    assert r.exit_code == 1 and f"cannot listen on 127.0.0.1:{port}" in r.output
    assert "serving" not in r.output


def test_a_stalled_body_gets_408(tmp_path):
    """A request body that stops arriving is answered 408 after --body-timeout."""
    script = write_script(tmp_path / "s.jsonl", ["hi"])
    proxy = Proxy(
        ProxyConfig(
            engine=f"scripted:{script}", tokenizer=str(TINY), secret=SECRET, body_timeout=0.2
        )
    )
    sent, calls = [], []

    async def receive():
        calls.append(1)
        if len(calls) == 1:
            return {"type": "http.request", "body": b'{"model": "m", ', "more_body": True}
        await asyncio.Event().wait()  # the client never sends the rest

    async def send(message):
        sent.append(message)

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
        "headers": [(b"x-api-key", token("s1").encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }
    asyncio.run(proxy.app(scope, receive, send))
    assert sent[0]["status"] == 408
    assert b"no part of the request body arrived for 0.2 s" in sent[1]["body"]
    proxy.workers.shutdown()


def test_repeated_log_lines_are_rate_limited():
    """A line repeated 50 times passes 5 times; a different line still passes."""
    import logging

    from claw_proxy._hygiene import RateLimitFilter

    f = RateLimitFilter(burst=5, window=3600)

    def rec(msg):
        return logging.LogRecord("uvicorn.error", logging.WARNING, __file__, 1, msg, None, None)

    assert sum(f.filter(rec("Invalid HTTP request received.")) for _ in range(50)) == 5
    assert f.filter(rec("another problem"))
