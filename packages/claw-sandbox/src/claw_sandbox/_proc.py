"""Run one step as a child process: output tails, wall-clock timeout, kill of the whole tree."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
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
) -> StepResult:
    """Start `argv` in a new session, wait at most `timeout_s`, then kill everything it left.

    `kill_tree(pid)` must kill the step's whole process tree (namespace, cgroup, or process group
    plus stragglers); it runs both after a timeout and after a normal exit (in a worker thread,
    unless `kill_is_quick` and the step ended by itself), so no orphan or daemon survives it.

    The exit is watched through a pidfd in the event loop (no thread per process; a waitpid
    thread where pidfds do not exist) and the pipes are read by the loop itself.
    """
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,
            pass_fds=tuple(pass_fds),
        )
    except OSError as exc:
        raise InfraError(f"cannot start {argv[0]!r}: {exc}") from exc
    loop = asyncio.get_running_loop()
    out, err = _Tail(output_bytes), _Tail(output_bytes)
    watched: list[int] = []
    eofs = [_watch_pipe(loop, proc.stdout, out, watched)]
    if proc.stderr is not None:
        eofs.append(_watch_pipe(loop, proc.stderr, err, watched))
    exited = _watch_exit(loop, proc, watched)
    timed_out = False
    try:
        try:
            await asyncio.wait_for(asyncio.shield(exited), timeout_s)
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
                await asyncio.wait_for(asyncio.shield(exited), 10)
        # leftovers holding the pipes open are dead now: read what the pipes still hold without
        # a trip through the loop, and give a pipe that is still held a moment, then stop
        for eof in eofs:
            eof.drain()  # type: ignore[attr-defined]
        if pending := [eof for eof in eofs if not eof.done()]:
            await asyncio.wait(pending, timeout=2)
    finally:
        for fd in watched:
            loop.remove_reader(fd)
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                f.close()
        if proc.returncode is None and exited.done():
            proc.wait()
        _close_pidfd(exited)
    code = proc.returncode
    return StepResult(
        exit_code=None if timed_out or code is None else exit_status(code),
        timed_out=timed_out,
        stdout=out.text(),
        stderr=err.text(),
        pid=proc.pid,
    )


def _watch_pipe(
    loop: asyncio.AbstractEventLoop, pipe, tail: _Tail, watched: list[int]
) -> asyncio.Future:
    """Read a child's pipe into `tail` from the event loop; the future is done at EOF. Its
    `drain()` reads what the pipe holds now, up to EOF or until it would block."""
    fd = pipe.fileno()
    os.set_blocking(fd, False)
    eof = loop.create_future()

    def readable() -> bool:
        """Read one chunk; False once the pipe is empty for now or at EOF."""
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""
        if chunk:
            tail.add(chunk)
            return True
        loop.remove_reader(fd)
        if not eof.done():
            eof.set_result(None)
        return False

    def drain() -> None:
        while not eof.done() and readable():
            pass

    loop.add_reader(fd, readable)
    watched.append(fd)
    eof.drain = drain  # type: ignore[attr-defined]
    return eof


def _watch_exit(
    loop: asyncio.AbstractEventLoop, proc: subprocess.Popen, watched: list[int]
) -> asyncio.Future:
    """A future done when the child exits: a pidfd in the loop, else a thread doing waitpid."""
    exited = loop.create_future()
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        fut = asyncio.ensure_future(asyncio.to_thread(proc.wait))
        fut.add_done_callback(lambda _f: None if exited.done() else exited.set_result(None))
        return exited

    def gone() -> None:
        loop.remove_reader(pidfd)
        proc.wait()  # reap: returns at once
        if not exited.done():
            exited.set_result(None)

    exited.pidfd = pidfd  # type: ignore[attr-defined]
    loop.add_reader(pidfd, gone)
    watched.append(pidfd)
    return exited


def _close_pidfd(exited: asyncio.Future) -> None:
    pidfd = getattr(exited, "pidfd", None)
    if pidfd is not None:
        with contextlib.suppress(OSError):
            os.close(pidfd)


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


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
