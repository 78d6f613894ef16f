"""Network policy `proxy`: the proxy is the only address a sandbox can reach.

Host side, a per-job unix socket forwards every connection to the proxy's TCP address. The
socket is bind-mounted into the sandbox (which has its own, empty network namespace), where a
forwarder listens on 127.0.0.1:PORT and connects to the socket: `socat` when installed, else
the small Python program below run with the sandbox's (the host's, read-only) interpreter.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from pathlib import Path

from claw_sandbox.errors import InfraError

INNER_SOCKET = "/run/claw/proxy.sock"

PY_FORWARDER = r"""
import socket, sys, threading
port, path = int(sys.argv[1]), sys.argv[2]
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", port))
srv.listen(128)
def pipe(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
def serve(c):
    u = socket.socket(socket.AF_UNIX)
    try:
        u.connect(path)
    except OSError:
        c.close()
        return
    threading.Thread(target=pipe, args=(u, c), daemon=True).start()
    pipe(c, u)
while True:
    conn, _ = srv.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


class Relay:
    """Accept on a unix socket (or loopback TCP port) and relay each connection to host:port."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.server: asyncio.AbstractServer | None = None
        self.tasks: set[asyncio.Task] = set()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.close()
            return
        for t in (_pipe(reader, up_writer), _pipe(up_reader, writer)):
            task = asyncio.ensure_future(t)
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def start_unix(self, path: Path) -> None:
        """Listen on the unix socket `path`, however long the path is.

        AF_UNIX paths end at 107 bytes and job directories below a deep work directory pass
        that; binding through ``/proc/self/fd/N/`` of the directory keeps the name short.
        """
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            dirfd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
            try:
                sock.bind(f"/proc/self/fd/{dirfd}/{path.name}")
            finally:
                os.close(dirfd)
            os.chmod(path, 0o666)
            sock.listen(128)
            sock.setblocking(False)
            self.server = await asyncio.start_unix_server(self._handle, sock=sock)
        except OSError as exc:
            sock.close()
            raise InfraError(f"cannot create the proxy socket {path}: {exc}") from exc

    async def start_tcp(self, port: int) -> None:
        self.server = await asyncio.start_server(
            self._handle, "127.0.0.1", port, reuse_address=True
        )

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await self.server.wait_closed()
        for t in list(self.tasks):
            t.cancel()


def inner_command(port: int, socat: str | None, python: str) -> list[str]:
    """A prefix that starts the in-sandbox forwarder, waits until it listens, then execs argv."""
    hexport = f"{port:04X}"
    if socat:
        fwd = f"{socat} TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr UNIX-CONNECT:{INNER_SOCKET}"
    else:
        fwd = f'{python} -c "$CLAW_FORWARDER" {port} {INNER_SOCKET}'
    script = (
        f"{fwd} >/dev/null 2>&1 & "
        f"i=0; until grep -q ':{hexport} 00000000:0000 0A' /proc/net/tcp; do "
        f"i=$((i+1)); [ $i -gt 1000 ] && {{ echo 'claw-sandbox: proxy forwarder did not start' >&2; exit 125; }}; "
        f"sleep 0.005; done; "
        'exec "$@"'
    )
    return ["/bin/sh", "-c", script, "claw-net"]


_SHARED: dict[int, list] = {}  # loopback port -> [Relay, users, (host, port)]


async def acquire_loopback(port: int, host: str, target_port: int) -> None:
    """Share one host relay 127.0.0.1:port -> host:target_port among the jobs that want it.

    For the `process` backend, which has no namespace of its own: the harness still finds the
    proxy at the job's `port`. A port already taken by something else is an InfraError.
    """
    entry = _SHARED.get(port)
    if entry is not None:
        if entry[2] != (host, target_port):
            raise InfraError(f"127.0.0.1:{port} already relays to {entry[2][0]}:{entry[2][1]}")
        entry[1] += 1
        return
    relay = Relay(host, target_port)
    try:
        await relay.start_tcp(port)
    except OSError as exc:
        raise InfraError(f"cannot listen on 127.0.0.1:{port} to relay to the proxy: {exc}") from exc
    _SHARED[port] = [relay, 1, (host, target_port)]


async def release_loopback(port: int) -> None:
    entry = _SHARED.get(port)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] <= 0:
        del _SHARED[port]
        await entry[0].close()
