"""The connection guards on both of uvicorn's HTTP parsers (httptools when installed, h11):
oversized heads, unfinished heads, pipelining, and TCP_NODELAY on accepted connections."""

from __future__ import annotations

import functools
import importlib
import socket
import time

import pytest
from claw_proxy._hygiene import MAX_HEAD_BYTES, guarded_protocol

PARSERS = ["h11", "httptools"]
serve = importlib.import_module("claw_proxy.serve")  # the module (the package exports a function)


@pytest.fixture(params=PARSERS)
def server(request, make_server, monkeypatch):
    if request.param == "httptools":
        pytest.importorskip("httptools", reason="httptools (claw-proxy[fast]) is not installed")
    monkeypatch.setattr(
        serve, "guarded_protocol", functools.partial(guarded_protocol, parser=request.param)
    )
    return make_server(header_timeout=1.0)


def _recv_all(s: socket.socket, wait: float = 5.0) -> bytes:
    s.settimeout(wait)
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except TimeoutError:
        pass
    return out


def test_oversized_head_gets_400(server):
    """A request head still unfinished past the 16 KiB limit is refused with 400 and closed
    (no header flood is buffered until the header timeout)."""
    with socket.create_connection((server.host, server.port)) as s:
        big = b"x-big: " + b"a" * (MAX_HEAD_BYTES + 100) + b"\r\n"
        s.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n" + big + big)
        assert _recv_all(s).startswith(b"HTTP/1.1 400")


def test_unfinished_head_is_closed_after_the_header_timeout(server):
    """A connection that never finishes its headers is closed by the server."""
    with socket.create_connection((server.host, server.port)) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
        t = time.monotonic()
        assert _recv_all(s, 10) == b""
        assert time.monotonic() - t < 9


def test_pipelined_requests_are_answered_and_the_connection_kept(server):
    """Two pipelined requests get two answers; the connection then waits for the next one
    and is closed by the header timeout."""
    with socket.create_connection((server.host, server.port)) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n" * 2)
        assert _recv_all(s, 10).count(b"HTTP/1.1 200") == 2


def test_accepted_connections_have_nodelay():
    """The listening socket is TCP by protocol number, so the event loop sets TCP_NODELAY on
    accepted connections (without it, header and body writes wait on delayed ACKs)."""
    sock = serve.bind("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()
