"""`--executor ray`: the same jobs as Ray tasks across a cluster (`pip install claw-sandbox[ray]`).

Each task builds the named backend on the node it lands on (so `auto` means the strongest that
works there), runs one job with the same retries as the local scheduler, and returns its
`claw.run/v1` dict, with `node`: the Ray node id it ran on. The driver writes runs in completion
order and resumes from the output file exactly like the local scheduler. A task lost with its node
or worker process (the node died, the worker was killed) is an `infra_error` run; with
`record_lost=False` it is returned but not written, so a rerun over the same file runs the job
again (examples/mix_harness_rl.py plans such a rollout again under a new session). Job files (`copy_from`) must be reachable at the same path on
every node (a shared filesystem), or jobs should carry their files inline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from claw_sandbox import _leftovers
from claw_sandbox.errors import ClawError
from claw_sandbox.records import BadLine, Job
from claw_sandbox.scheduler import (
    JobLike,
    Scheduler,
    _as_job,
    _error_run,
    _open_resumable,
    check_unique,
)


def run_one_on_node(job_row: dict, backend: str, retries: int, options: dict) -> dict:
    """Body of the Ray task: run one job with this node's backend; return its run dict."""
    import ray

    from claw_sandbox.backends import get_backend

    job = Job.from_dict(job_row, f"job {job_row.get('job_id')!r}")
    sched = Scheduler(get_backend(backend, **options), 1, retries, None)
    root = Path(tempfile.mkdtemp(prefix=_leftovers.ROOT_PREFIX + "ray-"))
    _leftovers.sweep_default_roots(own=root)  # job directories of killed tasks on this node
    if hasattr(sched.backend, "hide"):
        sched.backend.hide(str(root))
    try:
        run = asyncio.run(sched.run_one(job, root))
    finally:
        with contextlib.suppress(OSError):
            root.rmdir()  # stays when it holds kept sandboxes
    return {**run.to_dict(), "node": ray.get_runtime_context().get_node_id()}


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ClawError("--executor ray needs Ray: pip install 'claw-sandbox[ray]'") from None
    return ray


@contextlib.contextmanager
def connected(address: str | None = None) -> Iterator[None]:
    """This process connected to Ray while the block runs: to `address`, else RAY_ADDRESS, else
    a new local Ray; disconnected at the end. Already connected: left as it is. The run_on_ray
    calls in the block (from any thread) share the one connection instead of each making one."""
    ray = _import_ray()
    if ray.is_initialized():
        yield
        return
    ray.init(address=address or os.environ.get("RAY_ADDRESS"), include_dashboard=False,
             log_to_driver=False, configure_logging=False)  # fmt: skip
    try:
        yield
    finally:
        ray.shutdown()


def run_on_ray(
    jobs: Iterable[JobLike],
    *,
    backend: str = "auto",
    out: str | Path | None = None,
    retries: int = 2,
    parallel: int | None = None,
    address: str | None = None,
    num_cpus_per_job: float = 1.0,
    log: Callable[[str], None] | None = None,
    ro_paths: tuple[str, ...] = (),
    on_run: Callable[[dict], None] | None = None,
    retry_errors: bool = False,
    record_lost: bool = True,
) -> list[dict]:
    """Run jobs as Ray tasks; return their run dicts in completion order (also appended to `out`).

    `address`: a Ray cluster (default: RAY_ADDRESS, else a local Ray started here).
    `parallel`: most tasks in flight at once (default: no cap; Ray queues by CPUs).
    `retry_errors`: jobs recorded in `out` as error / infra_error run again (old records dropped).
    `record_lost`: False leaves the infra_error run of a task lost with its node or worker out
    of `out` (it is still returned), so the job is not recorded as finished.
    """
    ray = _import_ray()
    log = log or (lambda m: None)
    items = [_as_job(j, i) for i, j in enumerate(jobs, start=1)]
    check_unique(items)
    fd = None
    done: set = set()
    if out is not None:
        fd, done = _open_resumable(
            Path(out), log, {j.job_id for j in items} if retry_errors else None
        )
    try:
        with connected(address):  # disconnects at the end when this call connected
            task = ray.remote(num_cpus=num_cpus_per_job, max_retries=0)(run_one_on_node)
            options = (
                {"ro_paths": tuple(ro_paths)} if ro_paths and backend in ("auto", "bwrap") else {}
            )
            todo = [j for j in items if j.job_id not in done]
            if len(todo) < len(items):
                log(
                    f"resuming: {len(items) - len(todo)} of {len(items)} jobs already recorded in {out}"
                )
            rows: list[dict] = []

            def emit(row: dict, lost: bool = False) -> None:
                rows.append(row)
                if lost and not record_lost:
                    log(f"job {row['job_id']!r}: {row['error']}; not recorded")
                    return
                if on_run is not None:
                    on_run(row)
                if fd is not None:
                    os.write(fd, (json.dumps(row, ensure_ascii=False) + "\n").encode())

            _run_tasks(ray, task, todo, parallel or len(todo) or 1, emit, backend, retries, options)
            return rows
    finally:
        if fd is not None:
            os.close(fd)


def _run_tasks(
    ray: Any,
    task: Any,
    todo: list,
    cap: int,
    emit: Callable[..., None],
    backend: str,
    retries: int,
    options: dict,
) -> None:
    """Keep at most ``cap`` tasks in flight, emitting each run as it finishes (a bad line as
    an error run without a task; a task that failed or was lost with its node or worker as an
    infra_error run, emitted with ``lost=True`` when lost)."""
    lost_errors = (
        ray.exceptions.NodeDiedError,
        ray.exceptions.WorkerCrashedError,
        ray.exceptions.ObjectLostError,
    )
    pending: dict = {}
    queue = list(reversed(todo))
    while queue or pending:
        while queue and len(pending) < cap:
            job = queue.pop()
            if isinstance(job, BadLine):
                emit(_error_run(job.job_id, job.error, f"ray:{backend}", job.meta).to_dict())
                continue
            pending[task.remote(job.to_dict(), backend, retries, options)] = job
        if not pending:
            continue
        ready, _ = ray.wait(list(pending), num_returns=1)
        for ref in ready:
            job = pending.pop(ref)
            try:
                row = ray.get(ref)
            except Exception as exc:  # the task raised, or it was lost with its node or worker
                lost = isinstance(exc, lost_errors)
                what = "ray task lost with its node or worker" if lost else "ray task failed"
                row = _error_run(job.job_id, f"{what}: {type(exc).__name__}: {exc}",
                                 f"ray:{backend}", dict(job.meta), "infra_error").to_dict()  # fmt: skip
                emit(row, lost)
                continue
            emit(row)
