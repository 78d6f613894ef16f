"""Helpers the proxy benches share: a free local port, waiting for a server to answer, and a
process tree's CPU time."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of `pid` and of its child processes so far, in ns
    (from /proc/PID/task/*/schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):  # a thread that just ended
            total += int((task / "schedstat").read_text().split()[0])
            for child in (task / "children").read_text().split():
                total += cpu_ns(int(child))
    return total


def wait_ready(url: str, proc: subprocess.Popen, seconds: float = 120) -> None:
    """Return once GET `url` answers 200; raise if `proc` exits first or `seconds` pass."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not start in {seconds:g} s")
