"""Connection hygiene for the uvicorn server: header timeouts, a connection cap, quiet logs.

uvicorn's HTTP protocols wait forever for a request's headers, so a client that opens
connections and sends a header line now and then ("slowloris") holds a file descriptor each
until the process runs out. `guarded_protocol` returns a protocol class (httptools when
installed, else h11) that

- closes a connection that has not finished a request's headers within `header_timeout`
  seconds (from the connection's start, or from the end of its previous response);
- keeps at most `max_connections` open: a new connection past the cap closes the connection
  that has waited longest for its headers (a client sending nothing useful), or, when every
  connection is busy with a request, is itself closed at once.

`install_log_limits` rate-limits repeated log lines (a flood of "Invalid HTTP request" or
accept errors costs a line, not a disk).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections import OrderedDict
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("claw_proxy")
ACCEPT_BATCH = 128  # listen backlog; asyncio also accepts up to this many sockets in one go
MAX_HEAD_BYTES = 16 * 1024  # request line + headers (h11's own limit, kept on httptools)


def guarded_protocol(header_timeout: float, max_connections: int, parser: str = "auto") -> type:
    """A uvicorn HTTP protocol class with these limits (pass it as uvicorn's `http=`): on
    httptools (uvicorn's fast C parser) when it is installed and `parser` is ``auto`` or
    ``httptools``, else on h11."""
    base = _base_protocol(parser)
    guard = _H11Guard if base is H11Protocol else _HttpToolsGuard
    name = f"Guarded{base.__name__}"
    limits = {"_claw_header_timeout": header_timeout, "_claw_max_connections": max_connections}
    return type(name, (guard, base), {**limits, "__qualname__": name})


def _base_protocol(parser: str) -> type:
    """uvicorn's httptools protocol when `parser` allows it and httptools is installed, else
    its h11 one; `httptools` asked for and missing is an ImportError."""
    if parser in ("auto", "httptools"):
        try:
            from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

            return HttpToolsProtocol
        except ImportError:
            if parser == "httptools":
                raise
    return H11Protocol


# the guards are mixins over a uvicorn protocol class (chosen at run time: see guarded_protocol)
_Protocol: Any = object


class _Guard(_Protocol):
    """The header timeout and the connection cap, over either protocol."""

    _claw_header_timeout: float
    _claw_max_connections: int

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._claw_timer: asyncio.TimerHandle | None = None
        self._claw_cycle: object = None
        if len(self.connections) > self._claw_max_connections and not self._claw_make_room():
            return
        self._claw_wait()

    def _claw_make_room(self) -> bool:
        """Past the cap: close the connection waiting longest for its headers, or this one
        when every other is serving a request (then False)."""
        victim = next(iter(_waiting(self.server_state)), None)
        if victim is None:  # every open connection is serving a request
            log.warning(
                "connection refused: %d connections open (--max-connections)",
                len(self.connections) - 1,
            )
            self.transport.close()
            self.connections.discard(self)
            return False
        log.warning(
            "closed a connection idle before its headers: %d connections open "
            "(--max-connections %d)",
            len(self.connections),
            self._claw_max_connections,
        )
        victim._claw_close()
        return True

    def _claw_wait(self) -> None:
        """Start waiting for the next request's headers."""
        self._claw_stop()
        _waiting(self.server_state)[self] = None
        self._claw_timer = self.loop.call_later(self._claw_header_timeout, self._claw_timed_out)

    def _claw_stop(self) -> None:
        _waiting(self.server_state).pop(self, None)
        if self._claw_timer is not None:
            self._claw_timer.cancel()
            self._claw_timer = None

    def _claw_timed_out(self) -> None:
        self._claw_timer = None
        log.warning(
            "closed a connection that sent no complete headers in %gs", self._claw_header_timeout
        )
        self._claw_close()

    def _claw_close(self) -> None:
        self._claw_stop()
        if not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc) -> None:
        self._claw_stop()
        super().connection_lost(exc)


class _HttpToolsGuard(_Guard):
    """On httptools: the headers are in at `on_headers_complete`; h11's 16 KiB head limit."""

    # h11 refuses a request line + headers past 16 KiB; httptools keeps whatever comes
    _claw_head_bytes = 0

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._claw_head_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._claw_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._claw_head(len(name) + len(value))
        super().on_header(name, value)

    def _claw_head(self, n: int) -> None:
        self._claw_head_bytes += n
        if self._claw_head_bytes > MAX_HEAD_BYTES:
            # raised inside a parser callback: uvicorn answers 400 and closes
            raise ValueError(f"request line and headers over {MAX_HEAD_BYTES} bytes")

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._claw_stop()  # a request's headers are in

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)
        super().on_response_complete()  # may start a pipelined request at once
        if not self.transport.is_closing() and not pipelined:
            self._claw_wait()  # a kept-alive connection waits for its next headers


class _H11Guard(_Guard):
    """On h11: the headers are in when a new request cycle starts."""

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and self.cycle is not self._claw_cycle:
            self._claw_cycle = self.cycle  # a request's headers are in
            self._claw_stop()

    def on_response_complete(self) -> None:
        done = self.cycle
        super().on_response_complete()  # may start a pipelined request at once
        if not self.transport.is_closing() and self.cycle is done:
            self._claw_wait()  # a kept-alive connection waits for its next headers


def _waiting(server_state) -> OrderedDict:
    """Connections waiting for headers, oldest first (kept on uvicorn's shared server state)."""
    w = getattr(server_state, "claw_waiting", None)
    if w is None:
        w = server_state.claw_waiting = OrderedDict()
    return w


def raise_fd_limit(max_connections: int) -> int:
    """Raise the soft open-file limit as far as the hard limit allows; return how many
    connections fit under it, leaving room for one accept batch (accepted before the cap can
    close any) and for the model's files, the records and the engine."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, max_connections + 256)
    if soft != resource.RLIM_INFINITY and want > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return max_connections
    return max(16, min(max_connections, soft - 128 - ACCEPT_BATCH))


class RateLimitFilter(logging.Filter):
    """Let each distinct message through `burst` times per `window` seconds; count the rest
    and report the count with the next line that passes."""

    def __init__(self, burst: int = 5, window: float = 60.0) -> None:
        super().__init__()
        self.burst, self.window = burst, window
        self._seen: dict[tuple, list] = {}  # key -> [window start, passed, suppressed]

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, str(record.msg)[:200])
        now = time.monotonic()
        entry = self._seen.get(key)
        if entry is None or now - entry[0] > self.window:
            suppressed = entry[2] if entry else 0
            if len(self._seen) > 1000:
                self._seen.clear()
            self._seen[key] = [now, 1, 0]
            if suppressed:
                record.msg = f"{record.msg} [{suppressed} more like this suppressed]"
            return True
        if entry[1] < self.burst:
            entry[1] += 1
            return True
        entry[2] += 1
        return False


def _libc_trim():
    """glibc's `malloc_trim`, or None (another C library, or no ctypes)."""
    try:
        import ctypes
        import ctypes.util

        name = ctypes.util.find_library("c")
        fn = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except (ImportError, OSError):
        return None
    if fn is not None:
        fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


_TRIM = _libc_trim()


def release_memory() -> bool:
    """Give the heap pages freed since the last call back to the OS (glibc `malloc_trim(0)`:
    every arena, the free pages inside it too). A big request's body, parsed JSON, rendered
    text and token ids are freed when it ends, but glibc keeps the pages, so RSS stays at the
    peak of the biggest request ever served; this returns them. False where there is no
    malloc_trim (then nothing is done)."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


class TrimAfterBig:
    """ASGI middleware: when a request the app marked big (`scope["state"]["claw_big"]`) has
    finished and no other big one is running, run `release_memory` on `pool` (a worker thread:
    trimming a large heap takes milliseconds, the event loop does not wait for it)."""

    def __init__(self, app, pool) -> None:
        self.app, self.pool = app, pool
        self.big_in_flight = 0
        self.trims = 0

    def __getattr__(self, name: str):
        return getattr(self.app, name)  # the Starlette app's routes, state, ...

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        state = scope.setdefault("state", {})
        try:
            await self.app(scope, receive, send)
        finally:
            if state.get("claw_big"):
                self.big_in_flight -= 1
                if self.big_in_flight == 0 and _TRIM is not None:
                    self.trims += 1
                    asyncio.get_running_loop().run_in_executor(self.pool, release_memory)

    def mark_big(self, request) -> None:
        """Called by the app when a request's body turns out to be big (once per request)."""
        if not getattr(request.state, "claw_big", False):
            request.state.claw_big = True
            self.big_in_flight += 1


_LIMITED = ("uvicorn.error", "asyncio", "claw_proxy")


def install_log_limits(burst: int = 5, window: float = 60.0) -> None:
    """Rate-limit repeated lines of uvicorn's, asyncio's and the proxy's loggers (idempotent)."""
    for name in _LIMITED:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RateLimitFilter) for f in logger.filters):
            logger.addFilter(RateLimitFilter(burst, window))
