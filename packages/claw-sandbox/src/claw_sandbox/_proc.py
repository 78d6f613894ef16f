"""Run one step as a child process: output tails, wall-clock timeout, kill of the whole tree."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Sequence

import attrs

from claw_sandbox.errors import InfraError


@attrs.frozen(kw_only=True)
class StepResult:
    exit_code: int | None  # None: killed at the timeout
    timed_out: bool
    stdout: str
    stderr: str
    pid: int = 0


class _Tail:
    """The last `limit` bytes of a stream."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buf = bytearray()

    def add(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) > self.limit:
            del self.buf[: len(self.buf) - self.limit]

    def text(self) -> str:
        return self.buf.decode("utf-8", errors="replace")


async def _pump(stream: asyncio.StreamReader | None, tail: _Tail) -> None:
    if stream is None:
        return
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return
        tail.add(chunk)


def exit_status(returncode: int) -> int:
    """Shell convention: a process killed by signal N exits 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def killpg(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def run_step(
    argv: Sequence[str],
    *,
    env: dict[str, str],
    cwd: str | None,
    timeout_s: float,
    output_bytes: int,
    kill_tree: Callable[[int], None],
    kill_is_quick: bool = False,
    merge_stderr: bool = False,
    pass_fds: Sequence[int] = (),
    stdin: bytes | None = None,
) -> StepResult:
    """Start `argv` in a new session, wait at most `timeout_s`, then kill everything it left.

    `kill_tree(pid)` must kill the step's whole process tree (namespace, cgroup, or process group
    plus stragglers); it runs both after a timeout and after a normal exit (in a worker thread,
    unless `kill_is_quick` and the step ended by itself), so no orphan or daemon survives it.
    """
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT if merge_stderr else asyncio.subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,
            pass_fds=tuple(pass_fds),
        )
    except OSError as exc:
        raise InfraError(f"cannot start {argv[0]!r}: {exc}") from exc
    out, err = _Tail(output_bytes), _Tail(output_bytes)
    pumps = [
        asyncio.ensure_future(_pump(proc.stdout, out)),
        asyncio.ensure_future(_pump(proc.stderr, err)),
    ]
    if stdin is not None and proc.stdin is not None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(stdin)
            await proc.stdin.drain()
        proc.stdin.close()
    timed_out = False
    try:
        await asyncio.wait_for(proc.wait(), timeout_s)
    except TimeoutError:
        timed_out = True
    except asyncio.CancelledError:
        await asyncio.shield(asyncio.to_thread(kill_tree, proc.pid))
        raise
    if kill_is_quick and not timed_out:
        kill_tree(proc.pid)
    else:
        await asyncio.to_thread(kill_tree, proc.pid)
    if timed_out:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 10)
    # leftovers holding the pipes open are dead now; give the readers a moment, then stop them
    _done, pending = await asyncio.wait(pumps, timeout=2)
    for p in pending:
        p.cancel()
    code = proc.returncode
    return StepResult(
        exit_code=None if timed_out or code is None else exit_status(code),
        timed_out=timed_out,
        stdout=out.text(),
        stderr=err.text(),
        pid=proc.pid,
    )


def find_marked(marker: bytes) -> list[int]:
    """Pids whose environment holds `marker` (``NAME=value``); the fallback tree tracker."""
    found = []
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    found.append(int(entry.name))
        except OSError:
            continue
    return found
