"""A small HTTP/1.1 client for passthrough upstreams: kept-alive connections over asyncio, the
response parsed by httptools (claw-proxy[fast]).

httpx's pool walks every pooled connection on each request (expiry and readability checks
through anyio), which at 64 concurrent calls was most of a passthrough proxy's CPU. Here a
request takes the most recently used idle connection from a stack, writes its head and body in
one call, and gives the connection back when the answer has been read to its end. A connection
the upstream closed is known as closed (the protocol is told) and dropped; a request that finds
its reused connection closed before any byte of the answer came is sent once more on a new one.

Used by `PassthroughEngine` and `VLLMEngine` when no test transport is given and no HTTP proxy is
configured for the upstream; otherwise the engine uses httpx. Answers are parsed by httptools
where it is installed (claw-proxy[fast]), else by a small reader in Python (`_Reader`): still
about a millisecond of CPU a vLLM call cheaper than httpx's layers.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import urllib.parse
import urllib.request
from typing import Any

from claw_proxy.errors import TransportError

try:
    import httptools
except ImportError:  # claw-proxy[fast] not installed: answers are parsed in Python (`_Reader`)
    httptools = None

_HIGH_WATER = 1 << 20  # answer bytes buffered before reading from the upstream pauses


class UpstreamError(TransportError):
    """The upstream could not be reached or broke the connection mid-answer."""


class _Upgrade(Exception):
    """The upstream switched protocols (`_Reader`'s HttpParserUpgrade)."""


class _Reader:
    """The calls `_Conn` makes of httptools' `HttpResponseParser`, in Python, for one answer
    (made when its request is sent): fed the answer's bytes, it calls the protocol's
    `on_header`, `on_headers_complete`, `on_body` and `on_message_complete`. The head is split
    on its line ends; the body is framed by its content-length, its chunks (a whole chunk is
    one `bytes.find` and one slice, so an answer streamed one small event per chunk costs a
    few microseconds an event) or the connection's end. No body after HEAD, 1xx, 204, 304."""

    __slots__ = (
        "_body",
        "_buf",
        "_head_only",
        "_keep_alive",
        "_left",
        "_proto",
        "_state",
        "_status",
    )

    def __init__(self, proto: _Conn, method: bytes) -> None:
        self._proto = proto
        self._head_only = method == b"HEAD"
        self._buf = b""
        self._status = 0
        self._keep_alive = False
        self._state = "head"  # head, length, size, data, crlf, trailer, eof, done
        self._left = 0  # bytes of the body (length) or of the chunk (data) still to come
        self._body: list[bytes] = []  # the body bytes of this read, passed on in one piece

    def get_status_code(self) -> int:
        return self._status

    def should_keep_alive(self) -> bool:
        return self._keep_alive

    def feed_data(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        self._buf = b""
        at: int | None = 0
        while at is not None and at < len(buf) and self._state != "done":
            at = self._step(buf, at)
        self._flush()

    def _flush(self) -> None:
        if self._body:
            body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
            self._body.clear()
            self._proto.on_body(body)

    def _step(self, buf: bytes, at: int) -> int | None:
        """Consume what `buf` holds from `at` on for the current state; where the rest starts,
        or None once more bytes are needed (the part from `at` kept in `_buf`)."""
        st = self._state
        if st in ("length", "data", "eof"):
            n = len(buf) - at if st == "eof" else min(self._left, len(buf) - at)
            if n:
                self._body.append(buf[at : at + n])
            self._left -= n
            if st == "length" and not self._left:
                self._end()
            elif st == "data" and not self._left:
                self._state = "crlf"
            return at + n
        sep = b"\r\n\r\n" if st == "head" else b"\r\n"
        i = buf.find(sep, at)
        if i < 0:
            if len(buf) - at > _MAX_LINE:
                raise _ParseError(f"a line of the answer's head is over {_MAX_LINE} bytes")
            self._buf = buf[at:]
            return None
        line = buf[at:i]
        if st == "head":
            self._head(line)
        elif st == "size":
            size = line.split(b";", 1)[0].strip()
            if not size or size.strip(b"0123456789abcdefABCDEF"):
                raise _ParseError(f"bad chunk size {line[:40]!r}")
            self._left = int(size, 16)
            self._state = "data" if self._left else "trailer"
        elif st == "crlf":
            if line:
                raise _ParseError("a chunk is longer than its size")
            self._state = "size"
        elif not line:  # trailer: an empty line ends the answer
            self._end()
        return i + len(sep)

    def _head(self, head: bytes) -> None:
        status_line, *lines = head.split(b"\r\n")
        parts = status_line.split(b" ", 2)
        if len(parts) < 2 or parts[0] not in (b"HTTP/1.1", b"HTTP/1.0") or not parts[1].isdigit():
            raise _ParseError(f"not an HTTP/1.x status line: {status_line[:40]!r}")
        status = int(parts[1])
        fields = []
        for line in lines:
            name, sep, value = line.partition(b":")
            if not sep or not name or name != name.strip():
                raise _ParseError(f"bad header line {line[:40]!r}")
            fields.append((name.lower(), value.strip(b" \t")))
        if status == 101:
            raise _Upgrade
        if 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
            return
        self._status = status
        keep = parts[0] == b"HTTP/1.1"
        length, chunked = None, False
        for name, value in fields:
            self._proto.on_header(name, value)
            if name == b"connection" and b"close" in value.lower():
                keep = False
            elif name == b"transfer-encoding" and value.lower().endswith(b"chunked"):
                chunked = True
            elif name == b"content-length":
                if not value.isdigit() or (length is not None and int(value) != length):
                    raise _ParseError(f"bad content-length {value[:40]!r}")
                length = int(value)
        self._keep_alive = keep
        self._proto.on_headers_complete()
        if self._head_only or status in (204, 304) or length == 0 and not chunked:
            self._end()
        elif chunked:
            self._state = "size"
        elif length is not None:
            self._state, self._left = "length", length
        else:
            self._state, self._keep_alive = "eof", False  # until the connection closes

    def _end(self) -> None:
        self._state = "done"
        self._flush()
        self._proto.on_message_complete()


_MAX_LINE = 1 << 16  # the answer's head, or a chunk-size line, is refused past this


if httptools is not None:
    _ParseError: type[Exception] = httptools.HttpParserError
    _UPGRADE: tuple[type[Exception], ...] = (httptools.HttpParserUpgrade, _Upgrade)
else:

    class _ParseError(Exception):  # type: ignore[no-redef]
        """The answer is not valid HTTP/1.1 (`_Reader`)."""

    _UPGRADE = (_Upgrade,)


class _Conn(asyncio.Protocol):
    """One connection; carries one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        # httptools' parser for the connection, or a `_Reader` per answer (set as it is sent)
        self.parser: Any = httptools.HttpResponseParser(self) if httptools is not None else None
        self.closed = False
        self.response: Response | None = None

    # --- asyncio.Protocol ---
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        r = self.response
        if r is None:  # bytes nobody asked for: the connection cannot be trusted
            self.abort()
            return
        r.got_bytes = True
        try:
            self.parser.feed_data(data)
        except _UPGRADE:
            r.fail(UpstreamError("the upstream switched protocols"))
            self.abort()
        except _ParseError as e:
            r.fail(UpstreamError(f"the upstream's answer is not valid HTTP/1.1: {e}"))
            self.abort()

    def eof_received(self):
        return False  # close the transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        r, self.response = self.response, None
        if r is not None and r.until_eof and exc is None and not r.complete:
            r.complete = True  # the end of a body without a length
            r.wake()
        elif r is not None and not r.complete:
            r.fail(
                UpstreamError("the upstream closed the connection" + (f": {exc}" if exc else ""))
            )

    def pause_writing(self) -> None:  # a large request body: the transport buffers it
        pass

    def resume_writing(self) -> None:
        pass

    # --- httptools callbacks ---
    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.response is not None
        self.response.raw_headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        r = self.response
        assert r is not None
        r.status = self.parser.get_status_code()
        if 100 <= r.status < 200:  # an interim answer (100 Continue): the real one follows
            r.raw_headers.clear()
            return
        r.keep_alive = self.parser.should_keep_alive()
        names = {k for k, _ in r.raw_headers}
        # neither a length nor chunks: the body runs until the upstream closes the connection
        r.until_eof = b"content-length" not in names and b"transfer-encoding" not in names
        if not r.head.done():
            r.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        r = self.response
        assert r is not None
        r.push(body)

    def on_message_complete(self) -> None:
        r = self.response
        assert r is not None
        if 100 <= r.status < 200:
            return
        r.complete = True
        r.wake()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class Response:
    """An answer being read: `status`, `headers` (lower-case names), then `read()` or `iter()`.
    `close()` (always, e.g. in `finally`) gives the connection back or drops it."""

    def __init__(self, pool: Upstream, conn: _Conn) -> None:
        self._pool = pool
        self._conn = conn
        self.head: asyncio.Future = conn.loop.create_future()
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.status = 0
        self.keep_alive = False
        self.complete = False
        self.until_eof = False
        self.got_bytes = False
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future | None = None
        self._done = False

    @property
    def headers(self) -> dict[str, str]:
        return {k.decode("latin-1"): v.decode("latin-1") for k, v in self.raw_headers}

    # --- fed by the protocol ---
    def push(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > _HIGH_WATER and not self._paused and self._conn.transport:
            self._paused = True
            self._conn.transport.pause_reading()
        self.wake()

    def fail(self, exc: BaseException) -> None:
        self._error = exc
        if not self.head.done():
            self.head.set_exception(exc)
        self.wake()

    def wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    # --- read by the caller ---
    async def iter(self):
        """The body as it arrives (transfer encoding removed; what came in one read is one
        piece), until the answer ends."""
        while True:
            while self._chunks:
                # the pieces that came together go on together (one write to the client)
                if len(self._chunks) == 1:
                    data = self._chunks.popleft()
                else:
                    data = b"".join(self._chunks)
                    self._chunks.clear()
                self._buffered -= len(data)
                if self._paused and self._buffered <= _HIGH_WATER // 4:
                    self._paused = False
                    if self._conn.transport is not None:
                        self._conn.transport.resume_reading()
                yield data
            if self.complete:
                return
            if self._error is not None:
                raise self._error
            self._waiter = self._conn.loop.create_future()
            try:
                async with asyncio.timeout(self._pool.timeout):
                    await self._waiter
            except TimeoutError:
                raise UpstreamError(
                    f"no byte of the answer came for {self._pool.timeout:g} s"
                ) from None
            finally:
                self._waiter = None

    async def read(self) -> bytes:
        parts = [chunk async for chunk in self.iter()]
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        if self._done:
            return
        self._done = True
        conn = self._conn
        conn.response = None
        if self.complete and self.keep_alive and not conn.closed and not self._paused:
            self._pool._release(conn)
        else:
            conn.abort()

    async def aclose(self) -> None:
        self.close()


class Upstream:
    """Kept-alive HTTP/1.1 connections to one base URL (``http://`` or ``https://``, with an
    optional path prefix), at most `max_idle` of them idle at a time, none reused after
    `idle_expiry` seconds idle (a connection a middlebox dropped without a word would otherwise
    swallow the next request until `timeout`)."""

    def __init__(
        self, url: str, timeout: float = 600.0, max_idle: int = 256, idle_expiry: float = 30.0
    ) -> None:
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.prefix = u.path.rstrip("/")
        self.ssl = ssl.create_default_context() if u.scheme == "https" else None
        self.timeout = timeout
        self.max_idle = max_idle
        self.idle_expiry = idle_expiry
        default = (u.scheme == "https" and self.port == 443) or (
            u.scheme == "http" and self.port == 80
        )
        host = f"[{self.host}]" if ":" in self.host else self.host
        self._host_header = (host if default else f"{host}:{self.port}").encode("ascii")
        self._idle: list[tuple[_Conn, float]] = []  # (connection, when it became idle)
        self._closed = False

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(min(self.timeout, 30.0)):
                _, conn = await loop.create_connection(
                    lambda: _Conn(loop),
                    self.host,
                    self.port,
                    ssl=self.ssl,
                    server_hostname=self.host if self.ssl else None,
                )
        except TimeoutError:
            raise UpstreamError(f"connecting to {self.host}:{self.port} timed out") from None
        except OSError as e:
            raise UpstreamError(f"cannot connect to {self.host}:{self.port}: {e}") from None
        return conn

    def _release(self, conn: _Conn) -> None:
        if self._closed or len(self._idle) >= self.max_idle:
            conn.abort()
        else:
            self._idle.append((conn, conn.loop.time()))

    def _take(self) -> _Conn | None:
        """The most recently used idle connection that is still open; the ones idle for
        `idle_expiry` or longer are closed."""
        if not self._idle:
            return None
        now = self._idle[-1][0].loop.time()
        if now - self._idle[0][1] >= self.idle_expiry:  # the stack's bottom idled longest
            for c, t in self._idle:
                if now - t >= self.idle_expiry:
                    c.abort()
            self._idle = [(c, t) for c, t in self._idle if now - t < self.idle_expiry]
        while self._idle:
            c, _ = self._idle.pop()
            if not c.closed:
                return c
        return None

    async def request(
        self, method: str, path: str, headers: dict[str, str], body: bytes = b""
    ) -> Response:
        """Send one request; returns once the answer's status and headers are in."""
        if self._closed:
            raise UpstreamError("the upstream client is closed")
        lines = [
            f"{method} {self.prefix}{path} HTTP/1.1".encode("ascii"),
            b"host: " + self._host_header,
            b"content-length: " + str(len(body)).encode("ascii"),
        ]
        for k, v in headers.items():
            if "\r" in v or "\n" in v or "\r" in k or "\n" in k or ":" in k:
                raise ValueError(f"header {k!r} holds a line break (or its name a colon)")
            lines.append(f"{k}: {v}".encode("latin-1"))
        head = b"\r\n".join(lines) + b"\r\n\r\n"
        for attempt in (0, 1):
            conn = self._take()
            reused = conn is not None
            if conn is None:
                conn = await self._connect()
            r = Response(self, conn)
            conn.response = r
            if httptools is None:
                conn.parser = _Reader(conn, method.encode("ascii"))
            assert conn.transport is not None
            if len(body) < 65536:
                conn.transport.write(head + body)
            else:
                conn.transport.writelines((head, body))
            try:
                async with asyncio.timeout(self.timeout):
                    await r.head
            except UpstreamError:
                r.close()
                if reused and attempt == 0 and not r.got_bytes:
                    continue  # the upstream had closed this idle connection: one more try
                raise
            except TimeoutError:
                r.close()
                raise UpstreamError(f"no answer came for {self.timeout:g} s") from None
            except BaseException:
                r.close()
                raise
            return r
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for c, _ in idle:
            c.abort()


def usable(url: str) -> bool:
    """Whether `Upstream` can serve `url`: the scheme is http(s) and no HTTP proxy from the
    environment applies to it (httpx honours those)."""
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        return False
    proxies = urllib.request.getproxies()
    if not (proxies.get(u.scheme) or proxies.get("all")):
        return True
    return bool(urllib.request.proxy_bypass(u.hostname))
