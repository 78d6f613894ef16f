"""Passthrough over real loopback sockets: the kept-alive HTTP/1.1 client (`_upstream`) against
raw asyncio servers, and the proxy forwarding through it to a uvicorn upstream."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time

import httpx
import pytest
import uvicorn
from claw_proxy import _upstream, read_calls  # httptools parses answers where installed
from claw_proxy.errors import EngineError
from claw_proxy.records import CallWriter
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

# --- the client against raw servers -------------------------------------------------------------


async def _raw_server(answers: list[bytes], *, close_after: bool = False):
    """A server that reads one request head+body per answer and writes the next answer's bytes
    as they are (closing the connection after each when `close_after`)."""
    seen: list[bytes] = []

    async def handle(reader, writer):
        try:
            while answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                seen.append(head + await reader.readexactly(length))
                writer.write(answers.pop(0))
                await writer.drain()
                if close_after:
                    break
        except asyncio.IncompleteReadError:
            pass
        finally:
            writer.close()

    return await _serve(handle), seen


class _Server:
    """A loopback asyncio server whose connections are all closed by `stop()`."""

    def __init__(self, handle) -> None:
        self.handle = handle
        self.tasks: set[asyncio.Task] = set()

    async def start(self) -> _Server:
        self.server = await asyncio.start_server(server_task(self), "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def stop(self) -> None:
        self.server.close()
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await asyncio.sleep(0)


def server_task(server: _Server):
    """The connection handler of `server`: runs its `handle`, tracked so `stop()` ends it."""

    async def run(reader, writer):
        task = asyncio.current_task()
        assert task is not None
        server.tasks.add(task)
        try:
            await server.handle(reader, writer)
        finally:
            writer.close()

    return run


async def _serve(handle) -> _Server:
    return await _Server(handle).start()


def _run(coro):
    return asyncio.run(coro)


def test_lengths_chunks_and_eof_bodies_are_read_whole():
    """A content-length body, a chunked body and a body ended by closing all read whole."""

    async def main():
        answers = [
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello",
            b"HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\nx-a: b\r\n\r\n"
            b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end",
        ]
        server, seen = await _raw_server(answers)
        up = _upstream.Upstream(server.url + "/base")
        got = []
        for body in (b'{"a":1}', b"{}", b"x" * 70000):
            r = await up.request("POST", "/v1/x", {"content-type": "application/json"}, body)
            got.append((r.status, r.headers.get("x-a"), await r.read()))
            await r.aclose()
        await up.aclose()
        await server.stop()
        return got, seen

    got, seen = _run(main())
    assert got == [
        (200, None, b"hello"),
        (201, "b", b"abcde"),
        (200, None, b"until the end"),
    ]
    assert seen[0].startswith(b"POST /base/v1/x HTTP/1.1\r\n") and seen[0].endswith(b'{"a":1}')
    assert len(seen[2]) > 70000


def test_a_connection_the_upstream_closed_is_replaced():
    """Kept-alive connections the upstream closed are not reused: every request is answered."""

    async def main():
        answers = [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"] * 4
        server, _ = await _raw_server(list(answers), close_after=True)
        up = _upstream.Upstream(server.url)
        out = []
        for _ in range(4):
            r = await up.request("POST", "/", {}, b"{}")
            out.append(await r.read())
            await r.aclose()
            await asyncio.sleep(0)  # the close reaches the idle connection or not: both work
        await up.aclose()
        await server.stop()
        return out

    assert _run(main()) == [b"ok"] * 4


def test_connections_idle_too_long_are_not_reused():
    """A connection idle for `idle_expiry` is closed instead of reused (a fresh one is opened)."""

    async def main():
        conns = []

        async def handle(reader, writer):
            conns.append(writer)
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(int(head.split(b"content-length: ")[1].split(b"\r")[0]))
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")

        server = await _serve(handle)
        fresh, stale = _upstream.Upstream(server.url), _upstream.Upstream(server.url, idle_expiry=0)
        for up in (fresh, fresh, fresh, stale, stale, stale):
            r = await up.request("POST", "/", {}, b"{}")
            assert await r.read() == b"ok"
            await r.aclose()
        await fresh.aclose()
        await stale.aclose()
        await server.stop()
        return len(conns)

    assert _run(main()) == 1 + 3


def test_https_upstream(tmp_path, monkeypatch):
    """An https:// upstream is reached over TLS, its certificate checked against the trusted ones."""
    import shutil
    import ssl
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a test certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost"]
        + ["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the client trusts this certificate

    async def main():
        async def handle(reader, writer):
            head = await reader.readuntil(b"\r\n\r\n")
            body = await reader.readexactly(int(head.split(b"content-length: ")[1].split(b"\r")[0]))
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()

        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(cert, key)
        server = _Server(handle)
        server.server = await asyncio.start_server(server_task(server), "127.0.0.1", 0, ssl=tls)
        port = server.server.sockets[0].getsockname()[1]
        up = _upstream.Upstream(f"https://localhost:{port}")
        try:
            r = await up.request("POST", "/v1/x", {}, b'{"tls":true}')
            got = await r.read()
            await r.aclose()
        finally:
            await up.aclose()
            await server.stop()
        return got

    assert _run(main()) == b'{"tls":true}'


@pytest.mark.parametrize(
    "answer",
    [b"NOT HTTP AT ALL\r\n\r\n", b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort"],
    ids=["garbage", "cut-short"],
)
def test_broken_answers_are_engine_errors(answer):
    """An answer that is not HTTP, or one cut short by a close, is an EngineError."""

    async def main():
        server, _ = await _raw_server([answer], close_after=True)
        up = _upstream.Upstream(server.url)
        try:
            r = await up.request("POST", "/", {}, b"{}")
            try:
                await r.read()
            finally:
                await r.aclose()
        finally:
            await up.aclose()
            await server.stop()

    with pytest.raises(EngineError):
        _run(main())


def test_a_silent_upstream_times_out():
    """An upstream that never answers is an EngineError after the timeout."""

    async def main():
        async def handle(reader, writer):
            await reader.read(1 << 16)
            await asyncio.sleep(5)

        server = await _serve(handle)
        up = _upstream.Upstream(server.url, 0.2)
        try:
            await up.request("POST", "/", {}, b"{}")
        finally:
            await up.aclose()
            await server.stop()

    with pytest.raises(EngineError, match="no answer came"):
        _run(main())


def test_header_values_with_line_breaks_are_refused():
    """A header value cannot smuggle a second header line upstream."""
    up = _upstream.Upstream("http://127.0.0.1:9")
    with pytest.raises(ValueError, match="line break"):
        _run(up.request("POST", "/", {"a": "b\r\nc: d"}))


# --- the proxy forwarding over loopback --------------------------------------------------------


def _upstream_app(seen: list) -> Starlette:
    async def chat(request):
        raw = await request.body()
        body = json.loads(raw)
        seen.append((dict(request.headers), raw))
        if body["model"] == "limited":
            return JSONResponse({"error": {"message": "slow down"}}, status_code=429)
        if body["model"] == "teapot":
            return Response("not json", status_code=418, media_type="text/plain")
        if body["model"] == "endless":

            async def endless():
                try:
                    for i in range(2000):
                        yield f"data: {json.dumps({'i': i})}\n\n"
                        await asyncio.sleep(0.01)
                finally:
                    seen.append("upstream stream closed")

            return StreamingResponse(endless(), media_type="text/event-stream")
        if not body.get("stream"):
            answer = {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "real answer"},
                        "finish_reason": "stop",
                    }
                ],
            }
            # indented: the bytes the client gets must be these, not a re-serialisation
            return Response(json.dumps(answer, indent=1), media_type="application/json")

        async def sse():
            for delta, finish in (({"role": "assistant"}, None), ({"content": "real "}, None)):
                chunk = {
                    "id": "x",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": body["model"],
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
                yield f"data: {json.dumps(chunk)}\n\n"
            last = {
                "id": "x",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "delta": {"content": "answer"}, "finish_reason": "stop"}],
            }
            yield f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")

    async def messages(request):
        raw = await request.body()
        body = json.loads(raw)
        seen.append((dict(request.headers), raw))
        msg = {"id": "msg_1", "type": "message", "role": "assistant", "model": body["model"]}
        text = {"type": "text", "text": "real answer"}
        usage = {"input_tokens": 3, "output_tokens": 2}
        if not body.get("stream"):
            return JSONResponse(
                {**msg, "content": [text], "stop_reason": "end_turn", "usage": usage}
            )
        events = [
            ("message_start", {"message": {**msg, "content": [], "usage": usage}}),
            ("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
            (
                "content_block_delta",
                {"index": 0, "delta": {"type": "text_delta", "text": "real answer"}},
            ),
            ("content_block_stop", {"index": 0}),
            ("message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": usage}),
            ("message_stop", {}),
        ]

        async def sse():
            for name, data in events:
                yield f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/messages", messages, methods=["POST"]),
        ]
    )


@contextlib.contextmanager
def _serve_app(app):
    """`app` served by uvicorn on a free loopback port in a thread; yields its base URL."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@pytest.fixture
def upstream():
    """A uvicorn server on a free loopback port: (base URL, the requests it saw)."""
    seen: list = []
    with _serve_app(_upstream_app(seen)) as url:
        yield url, seen


def test_passthrough_sends_and_returns_the_bytes_as_they_came(make_server, upstream, clients):
    """Over loopback the request's bytes reach the upstream unchanged, the answer's bytes come
    back unchanged, streamed answers stream, and every call is recorded once."""
    url, seen = upstream
    srv = make_server(engine=f"passthrough:{url}", upstream_api_key="sk-real")
    assert srv.proxy.policy_engine.fast is not None  # the kept-alive client, not httpx
    raw = b'{ "model": "gpt-4o",\n  "messages": [{"role": "user", "content": "hi"}] }'
    key = clients.openai(srv, "p1").api_key
    with httpx.Client(base_url=srv.url) as http:
        r = http.post(
            "/v1/chat/completions",
            content=raw,
            headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
        )
    assert r.status_code == 200 and r.text.startswith('{\n "id": "x"')
    assert seen[-1][1] == raw and seen[-1][0]["authorization"] == "Bearer sk-real"
    client = clients.openai(srv, "p2")
    msgs = [{"role": "user", "content": "hi"}]
    assert client.chat.completions.create(model="gpt-4o", messages=msgs).choices[0].message.content
    chunks = list(client.chat.completions.create(model="gpt-4o", messages=msgs, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "real answer"
    assert chunks[-1].choices[0].finish_reason == "stop"
    a, b, c = read_calls(srv.config.record)
    assert a.request == json.loads(raw) and a.response["choices"][0]["message"]["content"]
    assert b.request == {"model": "gpt-4o", "messages": msgs}
    assert c.request["stream"] is True and "answer" in c.response["sse"]
    assert [x.seq for x in (a, b, c)] == [0, 0, 1] and not any(x.trainable for x in (a, b, c))


def test_anthropic_passthrough_over_loopback(make_server, upstream, clients):
    """The Anthropic SDK, streamed and not, through the kept-alive client: the upstream gets
    the upstream key and the client's anthropic-version; both calls are recorded."""
    url, seen = upstream
    srv = make_server(engine=f"passthrough:{url}", upstream_api_key="sk-ant-real")
    client = clients.anthropic(srv, "a1")
    msgs = [{"role": "user", "content": "hi"}]
    r = client.messages.create(model="claude-x", max_tokens=16, messages=msgs)
    assert r.content[0].text == "real answer"
    with client.messages.stream(model="claude-x", max_tokens=16, messages=msgs) as stream:
        assert "".join(stream.text_stream) == "real answer"
    headers = seen[-1][0]
    assert headers["x-api-key"] == "sk-ant-real" and headers["anthropic-version"]
    a, b = read_calls(srv.config.record)
    assert a.api == b.api == "anthropic.messages" and a.finish_reason == "stop"
    assert "real answer" in b.response["sse"]


def test_upstream_errors_pass_through_and_a_dead_upstream_is_503(make_server, upstream, clients):
    """The upstream's error answers come back with their status and bytes (not recorded); an
    upstream that cannot be reached is a 503."""
    url, _ = upstream
    srv = make_server(engine=f"passthrough:{url}")
    key = clients.openai(srv, "e1").api_key
    hdr = {"authorization": f"Bearer {key}"}
    msgs = [{"role": "user", "content": "hi"}]
    with httpx.Client(base_url=srv.url) as http:
        for stream in (False, True):
            body = {"model": "limited", "messages": msgs, "stream": stream}
            r = http.post("/v1/chat/completions", json=body, headers=hdr)
            assert r.status_code == 429 and r.json()["error"]["message"] == "slow down"
        r = http.post(
            "/v1/chat/completions", json={"model": "teapot", "messages": msgs}, headers=hdr
        )
        assert (r.status_code, r.text) == (418, "not json")
    assert list(read_calls(srv.config.record)) == []
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    srv2 = make_server(engine=f"passthrough:http://127.0.0.1:{dead}", record=None)
    with httpx.Client(base_url=srv2.url) as http:
        r = http.post("/v1/chat/completions", json={"model": "m", "messages": msgs}, headers=hdr)
    assert r.status_code == 503 and f"127.0.0.1:{dead}" in r.text


def test_a_client_gone_mid_stream_closes_the_upstream_stream(make_server, upstream, clients):
    """When the client leaves in the middle of a streamed answer, the proxy stops reading it:
    the upstream sees its stream closed long before its end, and no call is recorded."""
    url, seen = upstream
    srv = make_server(engine=f"passthrough:{url}")
    key = clients.openai(srv, "g1").api_key
    body = {"model": "endless", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with (
        httpx.Client(base_url=srv.url) as http,
        http.stream(
            "POST", "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}
        ) as r,
    ):
        assert r.status_code == 200
        assert next(r.iter_raw()).startswith(b"data: ")
    deadline = time.monotonic() + 10  # the upstream would stream for 20 s
    while "upstream stream closed" not in seen and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "upstream stream closed" in seen
    assert list(read_calls(srv.config.record)) == []


def test_raw_fields_are_written_as_they_are(tmp_path):
    """CallWriter splices `raw` fields into the line; the record reads back equal."""
    from claw_proxy._passthrough import one_line_json

    body = b'{"model":"m","messages":[{"role":"user","content":"h\\u00e9 \\n"}]}'
    assert one_line_json(body) == {"request": body.decode()}
    assert one_line_json(b' {"a":1}\r\n') == {"request": '{"a":1}'}
    assert one_line_json(b'{"a":\n1}') is None and one_line_json(b"[1]") is None
    w = CallWriter(tmp_path / "c.jsonl")
    w.write({"schema": "claw.call/v1", "x": 1, "request": {"stale": True}}, raw=one_line_json(body))
    w.close()
    line = (tmp_path / "c.jsonl").read_text()
    assert line.count("\n") == 1 and json.loads(line)["request"] == json.loads(body)
    assert json.loads(line)["x"] == 1


# --- the vllm engine over the same client --------------------------------------------------------


def _fake_vllm(seen: list, ids: list[int]) -> Starlette:
    """/v1/completions streamed one token a chunk as vLLM does (ids as logprob tokens, CRLF
    line ends); asked for max_tokens 7777 it streams the answer a thousand times, slowly."""

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    async def server_info(request):
        return JSONResponse({"vllm_config": {"model_config": {"logprobs_mode": "raw_logprobs"}}})

    async def completions(request):
        body = await request.json()
        seen.append(body)
        answer = ids * 1000 if body["max_tokens"] == 7777 else ids

        async def sse():
            try:
                for k, i in enumerate(answer):
                    choice = {
                        "index": 0,
                        "text": "x",
                        "logprobs": {"tokens": [f"token_id:{i}"], "token_logprobs": [-0.25 * k]},
                        "finish_reason": "stop" if k == len(answer) - 1 else None,
                    }
                    yield f"data: {json.dumps({'choices': [choice]})}\r\n\r\n"
                    if len(answer) > len(ids):
                        await asyncio.sleep(0.01)
                yield "data: [DONE]\r\n\r\n"
            finally:
                seen.append("vllm stream closed")

        return StreamingResponse(sse(), media_type="text/event-stream")

    return Starlette(
        routes=[
            Route("/v1/models", models),
            Route("/server_info", server_info),
            Route("/v1/completions", completions, methods=["POST"]),
        ]
    )


@pytest.fixture
def vllm_ids():
    from proxy_testlib import TINY
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TINY))
    return tok.encode("hello there", add_special_tokens=False) + [
        tok.convert_tokens_to_ids("<|im_end|>")
    ]


def test_vllm_engine_over_the_kept_alive_client(make_server, clients, vllm_ids):
    """vllm:URL over loopback goes through the kept-alive client: streamed and non-streamed
    answers carry vLLM's sampled ids and logprobs into the records; a client gone mid-stream
    closes vLLM's stream (vLLM aborts the request)."""
    from proxy_testlib import TINY

    seen: list = []
    with _serve_app(_fake_vllm(seen, vllm_ids)) as url:
        srv = make_server(engine=f"vllm:{url}", tokenizer=str(TINY))
        assert srv.proxy.policy_engine._fast is not None
        client = clients.openai(srv, "v1")
        msgs = [{"role": "user", "content": "hi"}]
        r = client.chat.completions.create(model="tiny", messages=msgs)
        assert r.choices[0].message.content == "hello there"
        chunks = list(client.chat.completions.create(model="tiny", messages=msgs, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == "hello there"
        a, b = read_calls(srv.config.record)
        for call in (a, b):
            assert call.completion_ids == vllm_ids
            assert call.completion_logprobs == [-0.25 * k for k in range(len(vllm_ids))]
        key = client.api_key
        with (
            httpx.Client(base_url=srv.url) as http,
            http.stream(
                "POST",
                "/v1/chat/completions",
                json={"model": "tiny", "messages": msgs, "stream": True, "max_tokens": 7777},
                headers={"authorization": f"Bearer {key}"},
            ) as resp,
        ):
            assert resp.status_code == 200
            assert next(resp.iter_raw()).startswith(b"data: ")
        deadline = time.monotonic() + 10  # vLLM would stream for 30 s
        while seen.count("vllm stream closed") < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert seen.count("vllm stream closed") == 3


def test_sse_lines_split_across_chunks():
    """Event-stream lines are put back together across chunk borders, CRLF or LF."""
    from claw_proxy.engines import sse_lines

    async def chunks():
        for c in (b'data: {"a"', b": 1}\r\n\r\nda", b"ta: [DONE]\n\n", b"tail"):
            yield c

    async def main():
        return [line async for line in sse_lines(chunks())]

    assert _run(main()) == ['data: {"a": 1}', "", "data: [DONE]", "", "tail"]


def test_prompt_json_is_sent_when_its_ends_match_the_ids():
    """The prompt's cached JSON is trusted when its first and last ids are the prompt's."""
    from claw_proxy.engines import _ends_match

    assert _ends_match("1,2,3", [1, 2, 3]) and _ends_match("5", [5])
    assert _ends_match("12,3,45", [12, 3, 45])
    assert not _ends_match("15,2,3", [5, 2, 3]) and not _ends_match("1,2,33", [1, 2, 3])
    assert not _ends_match("1,2,3", [1, 2, 4])


class _Proto:
    """What `_upstream._Reader` calls, noted."""

    def __init__(self) -> None:
        self.headers: list = []
        self.body: list[bytes] = []
        self.heads = 0
        self.complete = 0

    def on_header(self, name, value):
        self.headers.append((name, value))

    def on_headers_complete(self):
        self.heads += 1

    def on_body(self, data):
        self.body.append(data)

    def on_message_complete(self):
        self.complete += 1


_ANSWERS = [  # (bytes, status, body, keep-alive, complete before the connection's end)
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A:  b \r\n\r\nhello", 200, b"hello", True, True),
    (
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\n\r\n"
        b"3;ext=1\r\nabc\r\nA\r\n0123456789\r\n0\r\nx-trailer: t\r\n\r\n",
        201,
        b"abc0123456789",
        True,
        True,
    ),
    (b"HTTP/1.1 204 No Content\r\n\r\n", 204, b"", True, True),
    (b"HTTP/1.0 200 OK\r\n\r\nuntil the end", 200, b"until the end", False, False),
    (
        b"HTTP/1.1 200 OK\r\nConnection: close\r\ncontent-length: 2\r\n\r\nok",
        200,
        b"ok",
        False,
        True,
    ),
]


@pytest.mark.parametrize("answer", _ANSWERS, ids=["length", "chunked", "204", "eof", "close"])
def test_the_python_reader_at_every_split(answer):
    """`_Reader` (the parser without httptools) gives the same head, body and end however the
    answer's bytes are split into reads: whole, and cut in two at every byte."""
    raw, status, body, keep, complete = answer
    for cut in range(len(raw) + 1):
        proto = _Proto()
        reader = _upstream._Reader(proto, b"POST")
        for part in (raw[:cut], raw[cut:]):
            if part:
                reader.feed_data(part)
        assert reader.get_status_code() == status and proto.heads == 1, cut
        assert b"".join(proto.body) == body and proto.complete == int(complete), cut
        assert reader.should_keep_alive() is keep
        assert (b"x-a", b"b") in proto.headers or status != 200 or not keep


@pytest.mark.parametrize(
    "raw",
    [
        b"NOT HTTP AT ALL\r\n\r\n",
        b"HTTP/1.1 2x0 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nabc\r\n",
    ],
)
def test_the_python_reader_refuses_what_is_not_http(raw):
    """A bad status line, header, length, chunk size or chunk is a parse error."""
    with pytest.raises(_upstream._ParseError):
        _upstream._Reader(_Proto(), b"POST").feed_data(raw)


def test_streamed_events_of_one_read_are_parsed_in_one_pass():
    """The events of a streamed /v1/completions answer pass on as one list per read, the same
    pairs and finish as event by event (`_each_event`); a bad event passes on the tokens before
    it, then fails as before."""
    from claw_proxy.engines import Generation, _each_event, _streamed

    def event(i, finish=None):
        choice = {"index": 0, "logprobs": {"tokens": [f"token_id:{i}"], "token_logprobs": [-i]}}
        choice["finish_reason"] = finish
        return b"data: " + json.dumps({"choices": [choice]}).encode() + b"\r\n\r\n"

    body = event(1) + event(2) + b": a comment\n\n" + event(3, "stop") + b"data: [DONE]\n\n"

    class Answer:
        def __init__(self, parts):
            self.parts = parts

        async def iter(self):
            for p in self.parts:
                yield p

    async def read(parts):
        gen = Generation()
        finish = await _streamed(Answer(parts), gen, greedy=False)
        gen.put_nowait("end", finish)
        return [c async for c in gen.chunks()], gen.finish

    async def one_by_one():
        gen = Generation()
        finish = _each_event(body, gen, False, None)
        gen.put_nowait("end", finish)
        return [c async for c in gen.chunks()], gen.finish

    want = _run(one_by_one())
    assert want == ([[(1, -1.0), (2, -2.0), (3, -3.0)]], "stop")
    for cut in range(len(body) + 1):
        assert _run(read([body[:cut], body[cut:]])) == want, cut

    async def bad():
        gen = Generation()
        with pytest.raises(json.JSONDecodeError):
            await _streamed(Answer([event(1) + b"data: {not json\n\n" + event(2)]), gen, False)
        gen.put_nowait("end", None)
        return [c async for c in gen.chunks()]

    assert _run(bad()) == [[(1, -1.0)]]
