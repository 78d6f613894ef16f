"""A stopped proxy closes its engines' connections: no socket to a vLLM engine (one engine or a
replica set) is left for the garbage collector to find open (ResourceWarning: unclosed)."""

from __future__ import annotations

import asyncio
import gc
import warnings

import httpx
import pytest
from claw_proxy import ProxyConfig, ProxyServer
from claw_proxy.render import Renderer
from proxy_testlib import SECRET, TINY, token
from replica_testlib import FakeVLLM

R = Renderer(str(TINY))
ANSWER = R.encode("hello from an engine") + [R.eos_ids[0]]


@pytest.mark.parametrize("engines", [1, 2], ids=["one engine", "two replicas"])
def test_stopping_the_proxy_closes_every_engine_connection(tmp_path, engines):
    """Calls open kept-alive connections to each engine; after the server stops, collecting the
    proxy finds none of them still open (over httptools' client where it is installed, else
    httpx's)."""
    fakes = [FakeVLLM(ANSWER).start() for _ in range(engines)]
    try:
        cfg = ProxyConfig(
            engine=f"vllm:{fakes[0].url}",
            replicas=tuple(f"vllm:{f.url}" for f in fakes[1:]),
            replica_routing="random",
            tokenizer=str(TINY),
            secret=SECRET,
            record=str(tmp_path / "calls.jsonl"),
        )
        srv = ProxyServer(cfg).start()
        try:
            for i in range(6):
                r = httpx.post(
                    srv.url + "/v1/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": f"hi {i}"}]},
                    headers={"authorization": f"Bearer {token(f's{i}')}"},
                    timeout=60,
                )
                assert r.status_code == 200, r.text
        finally:
            srv.stop()
        assert all(f.completions for f in fakes)  # every engine was called
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            del srv
            gc.collect()
        unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
        assert unclosed == []
    finally:
        for f in fakes:
            f.stop()


def test_vllm_engine_aclose_closes_its_fast_client():
    """VLLMEngine.aclose closes the kept-alive client it streams completions over (claw-proxy[fast]'s
    Upstream, where httptools is installed) as well as its httpx client."""
    from claw_proxy.engines import VLLMEngine

    closed: list[str] = []

    class Fast:
        async def aclose(self) -> None:
            closed.append("fast")

    engine = VLLMEngine("http://127.0.0.1:9")
    engine._fast = Fast()
    asyncio.run(engine.aclose())
    assert closed == ["fast"] and engine._client.is_closed


def test_stopping_with_a_call_in_flight_leaves_no_socket_open(tmp_path):
    """A proxy stopped while a harness still waits on a call the engine has not finished (past
    uvicorn's graceful timeout) closes that connection's socket and its engine connection too,
    leaving none for the garbage collector to find open in whichever test it next runs."""
    import socket
    import time

    fake = FakeVLLM(ANSWER, prefill_s=60.0).start()  # the engine outlasts the graceful shutdown
    try:
        cfg = ProxyConfig(
            engine=f"vllm:{fake.url}",
            tokenizer=str(TINY),
            secret=SECRET,
            record=str(tmp_path / "calls.jsonl"),
        )
        srv = ProxyServer(cfg).start()
        body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"authorization: Bearer {token('s1')}\r\ncontent-length: {len(body)}\r\n\r\n"
        )
        client = socket.create_connection((srv.host, srv.port))
        client.sendall(head.encode() + body)
        deadline = time.monotonic() + 60
        while not fake.completions:  # the call reached the engine
            assert time.monotonic() < deadline, "the call never reached the engine"
            time.sleep(0.05)
        srv.stop()
        client.settimeout(30)
        while client.recv(65536):  # an error answer at most, then the proxy hangs up
            pass
        client.close()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            del srv
            gc.collect()
        unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
        assert unclosed == []
    finally:
        fake.stop()
