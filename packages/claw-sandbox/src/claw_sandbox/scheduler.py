"""Run many jobs at once: asyncio workers, bounded infra retries, resumable JSONL output.

Results stream in completion order. With an output file, every finished run is appended as one
`write()` of one line; a rerun reads the file back, cuts a torn last line (the runner was
killed mid-write), skips every job already recorded and appends the rest, so no job is run
twice into the file and none is lost. With `retry_errors`, the records of jobs that ended in
`error` or `infra_error` are first dropped from the file (an atomic rewrite under the lock), so
those jobs run again and the file still holds one record per job.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import tempfile
import time
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path

import attrs

from claw_sandbox import _leftovers
from claw_sandbox.backends import get_backend
from claw_sandbox.backends.base import Backend
from claw_sandbox.errors import ClawError, InfraError, JobError, JobsFileError
from claw_sandbox.executor import execute_job
from claw_sandbox.records import BadLine, Job, Run, read_runs

JobLike = Job | BadLine | dict
RETRY_STATUSES = ("error", "infra_error")  # what `retry_errors` runs again


def _as_job(item: JobLike, index: int) -> Job | BadLine:
    if isinstance(item, Job | BadLine):
        return item
    try:
        return Job.from_dict(item, f"job #{index}")
    except JobError as exc:
        job_id = item.get("job_id") if isinstance(item, dict) else None
        meta = m if isinstance(item, dict) and isinstance(m := item.get("meta"), dict) else {}
        return BadLine(job_id=job_id if isinstance(job_id, str) and job_id else f"job #{index}",
                       error=str(exc), meta=meta)  # fmt: skip


def check_unique(items: list[Job | BadLine]) -> None:
    """Job ids are the resume key: two jobs with one id would make the runs file ambiguous."""
    seen: dict[str, int] = {}
    for i, item in enumerate(items, start=1):
        if item.job_id in seen:
            raise JobsFileError(
                f"job #{i}: job_id {item.job_id!r} already used by job #{seen[item.job_id]}"
            )
        seen[item.job_id] = i


def _error_run(
    job_id: str, error: str, backend: str, meta: dict, status: str = "error", attempts: int = 1
) -> Run:
    now = time.time()
    return Run(job_id=job_id, status=status, started_at=now, ended_at=now, backend=backend,
               error=error, meta=meta, attempts=attempts)  # fmt: skip


@attrs.define
class Scheduler:
    """Runs jobs on one backend, `parallel` at a time. Counts are kept for the summary line."""

    backend: Backend
    parallel: int = 4
    retries: int = 2
    root: Path | None = None
    log: Callable[[str], None] = lambda msg: None
    total: int = 0
    skipped: int = 0
    counts: Counter = attrs.field(factory=Counter)
    kept: list[str] = attrs.field(factory=list)
    retry_errors: bool = False
    warned_image_run: bool = False  # the one warning about RUN lines a backend did not execute

    async def run_one(self, job: Job | BadLine, root: Path) -> Run:
        if isinstance(job, BadLine):
            return _error_run(job.job_id, job.error, self.backend.name, job.meta)
        last = ""
        for attempt in range(1, self.retries + 2):
            try:
                run, kept = await execute_job(job, self.backend, root)
            except InfraError as exc:
                last = str(exc)
                self.log(f"job {job.job_id!r}: attempt {attempt}: infrastructure error: {last}")
                await asyncio.sleep(0.05 * attempt)
                continue
            except (OSError, RuntimeError, ValueError) as exc:  # a failure of the runner itself
                last = f"{type(exc).__name__}: {exc}"
                self.log(f"job {job.job_id!r}: attempt {attempt}: runner error: {last}")
                await asyncio.sleep(0.05 * attempt)
                continue
            if kept:
                self.kept.append(kept)
                self.log(f"job {job.job_id!r}: sandbox kept at {kept}")
            if run.image_run_skipped and not self.warned_image_run:
                self.warned_image_run = True
                self.log(f"WARNING: backend {self.backend.name} does not build images: jobs ran without "
                         f"their image's RUN lines (e.g. job {job.job_id!r}: {run.image_run_skipped[0]!r}); "
                         "each run record lists them in image_run_skipped")  # fmt: skip
            return attrs.evolve(run, attempts=attempt)
        return _error_run(
            job.job_id, last, self.backend.name, dict(job.meta), "infra_error", self.retries + 1
        )

    async def stream(
        self, jobs: Iterable[JobLike], out: str | Path | None = None
    ) -> AsyncIterator[dict]:
        """Yield `claw.run/v1` dicts in completion order; append them to `out` when given."""
        items = [_as_job(j, i) for i, j in enumerate(jobs, start=1)]
        check_unique(items)
        done: set[str] = set()
        fd = None
        if out is not None:
            retry = {j.job_id for j in items} if self.retry_errors else None
            fd, done = _open_resumable(Path(out), self.log, retry)
        try:
            todo = [j for j in items if j.job_id not in done]
            self.total, self.skipped = len(items), len(items) - len(todo)
            if self.skipped:
                self.log(f"resuming: {self.skipped} of {len(items)} jobs already recorded in {out}")
            # absolute: a relative root would reach bwrap's binds (and a job's cwd) unresolved
            root = (
                self.root.absolute()
                if self.root is not None
                else Path(tempfile.mkdtemp(prefix=_leftovers.ROOT_PREFIX))
            )
            try:
                root.mkdir(parents=True, exist_ok=True)
                os.chmod(root, 0o711)
            except OSError as exc:
                raise ClawError(f"workdir {self.root}: cannot make it: {exc.strerror}") from None
            swept = await asyncio.to_thread(
                _leftovers.sweep_default_roots if self.root is None else _leftovers.sweep, root
            )
            if swept:
                self.log(f"removed {swept} job directories left by a killed run")
            if hasattr(self.backend, "hide"):
                self.backend.hide(str(root))
            if self.backend.warning:
                self.log(f"WARNING: {self.backend.warning}")
            async for run in self._pool(todo, root):
                row = run.to_dict()
                if fd is not None:
                    os.write(fd, (json.dumps(row, ensure_ascii=False) + "\n").encode())
                self.counts[run.status] += 1
                yield row
            if self.root is None:
                with contextlib.suppress(OSError):
                    root.rmdir()  # stays when it still holds kept sandboxes
        finally:
            if fd is not None:
                os.close(fd)

    async def _pool(self, jobs: list[Job | BadLine], root: Path) -> AsyncIterator[Run]:
        queue: asyncio.Queue = asyncio.Queue()
        for j in jobs:
            queue.put_nowait(j)
        results: asyncio.Queue = asyncio.Queue()

        async def worker() -> None:
            while True:
                try:
                    job = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                try:
                    result: Run | Exception = await self.run_one(job, root)
                except Exception as exc:  # a bug: surface it instead of hanging
                    result = exc
                await results.put(result)

        workers = [
            asyncio.ensure_future(worker()) for _ in range(max(1, min(self.parallel, len(jobs))))
        ]
        try:
            for _ in range(len(jobs)):
                result = await results.get()
                if isinstance(result, Exception):
                    raise result
                yield result
        finally:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    def summary(self, elapsed: float) -> str:
        ran = sum(self.counts.values())
        parts = [f"{self.counts.get(s, 0)} {s}" for s in ("ok", "timeout", "error", "infra_error")]
        rate = ran / elapsed if elapsed > 0 else 0.0
        text = f"{self.total} jobs: {', '.join(parts)}"
        if self.skipped:
            text += f", {self.skipped} skipped (already recorded)"
        return f"{text}; backend {self.backend.name}; {elapsed:.2f}s ({rate:.1f} jobs/s)"


def _open_resumable(
    path: Path, log: Callable[[str], None], retry: set[str] | None = None
) -> tuple[int, set[str]]:
    """Open the runs file for appending under an exclusive lock; return the ids it records.

    retry: job ids whose records of runs that ended in error / infra_error are dropped first
    (those jobs then run again); records of other jobs are kept whatever their status.
    """
    fd = _open_locked(path)
    try:
        rows, good = read_runs(path)
        size = os.fstat(fd).st_size
        if good < size:
            log(f"{path}: dropping a torn last line ({size - good} bytes) left by an interrupted "
                "run")  # fmt: skip
            os.ftruncate(fd, good)
        if retry:
            keep = [
                r for r in rows if r.get("status") not in RETRY_STATUSES or r["job_id"] not in retry
            ]
            if len(keep) < len(rows):
                fd = _rewrite_locked(path, fd, keep)
                log(f"{path}: {len(rows) - len(keep)} runs that ended in an error dropped; "
                    "their jobs run again")  # fmt: skip
                rows = keep
    except BaseException:
        os.close(fd)
        raise
    return fd, {r["job_id"] for r in rows}


def _open_locked(path: Path) -> int:
    """The runs file, open for appending and exclusively locked (JobsFileError when another run
    holds it). Opened again if another run replaced the file between our open and lock."""
    for _ in range(5):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            msg = f"{path}: another claw-sandbox run is writing to this file"
            raise JobsFileError(msg) from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)
    raise JobsFileError(f"{path}: the file keeps being replaced while opening it")


def _rewrite_locked(path: Path, fd: int, rows: list[dict]) -> int:
    """Replace the runs file with `rows`, atomically (a kill at any moment leaves the old or the
    new file whole); the new file is locked before it takes the name, so no other run slips in."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.retry")
    new = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC,
                  os.fstat(fd).st_mode & 0o777)  # fmt: skip
    try:
        fcntl.flock(new, fcntl.LOCK_EX | fcntl.LOCK_NB)
        data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()
        view = memoryview(data)
        while view:
            view = view[os.write(new, view) :]
        os.fsync(new)
        os.replace(tmp, path)
    except BaseException:
        os.close(new)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    os.close(fd)
    return new


async def arun_jobs(
    jobs: Iterable[JobLike],
    *,
    backend: str | Backend = "auto",
    parallel: int = 4,
    out: str | Path | None = None,
    retries: int = 2,
    workdir: str | Path | None = None,
    log: Callable[[str], None] | None = None,
    retry_errors: bool = False,
) -> AsyncGenerator[dict, None]:
    """Async variant of :func:`run_jobs`: yields each `claw.run/v1` dict as its job finishes."""
    sched = Scheduler(get_backend(backend), parallel, retries, Path(workdir) if workdir else None,
                      log or (lambda m: None), retry_errors=retry_errors)  # fmt: skip
    async for row in sched.stream(jobs, out):
        yield row


def iter_runs(jobs: Iterable[JobLike], **options) -> Iterator[dict]:
    """Synchronous generator over :func:`arun_jobs` (runs its own event loop)."""
    loop = asyncio.new_event_loop()
    agen = arun_jobs(jobs, **options)
    try:
        while True:
            try:
                yield loop.run_until_complete(agen.__anext__())
            except StopAsyncIteration:
                return
    finally:
        loop.run_until_complete(agen.aclose())
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def run_jobs(jobs: Iterable[JobLike], *, backend: str | Backend = "auto", parallel: int = 4,
             out: str | Path | None = None, retries: int = 2, workdir: str | Path | None = None,
             log: Callable[[str], None] | None = None,
             retry_errors: bool = False) -> list[dict]:  # fmt: skip
    """Run `claw.job/v1` dicts (or Jobs) and return their `claw.run/v1` dicts in completion order.

    `out` appends every run to a JSONL file and resumes from it (jobs already recorded are
    skipped; with `retry_errors`, jobs recorded as error / infra_error run again and their old
    records are dropped). Infrastructure failures are retried `retries` times, then reported as
    `status: infra_error`.
    """
    return list(iter_runs(jobs, backend=backend, parallel=parallel, out=out, retries=retries,
                          workdir=workdir, log=log, retry_errors=retry_errors))  # fmt: skip
