"""claw-sandbox overhead against the raw tools, and throughput at 1/8/32/64 parallel jobs.

Run: .venvs/claw-sandbox/bin/python -m pytest bench/test_sandbox_overhead.py --benchmark-only -s

Each comparison interleaves the raw tool and the backend in one loop (same machine state) and
reports p50 start-to-exit times; the backend's time covers the whole job: job directory and
workspace, the sandboxed `true`, cleanup, and the run record.

The bwrap comparison also runs the backend's own bwrap argv raw, twice, and splits the overhead:
- extra hardening: that argv against the raw one (the setpriv drop, the job's binds, ...);
- namespace end: that argv with its output captured, which returns only once every holder of
  the pipes, the sandbox's pid 1 included, has exited; raw bwrap returns when its monitor
  exits, before that, but a job must not count as ended while its namespace still runs;
- orchestration: the rest (job directory, Python, the run record).
"""

import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from claw_sandbox import Job, run_jobs
from claw_sandbox.backends import make_backend
from claw_sandbox.executor import execute_job

N = 40
RESULTS: dict[str, float] = {}


def _p50_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1000


def _job(i: int = 0) -> Job:
    return Job.from_dict({"schema": "claw.job/v1", "job_id": f"t{i}", "command": ["true"]})


def _compare(
    benchmark,
    backend,
    raw_argv: list[str],
    label: str,
    same_argv: list[str] | None = None,
    where: str | None = None,
):
    root = Path(tempfile.mkdtemp(prefix="claw-bench-", dir=where))
    if hasattr(backend, "hide"):
        backend.hide(str(root))
    loop = asyncio.new_event_loop()

    def ours() -> None:
        run, _ = loop.run_until_complete(execute_job(_job(), backend, root))
        assert run.status == "ok" and run.exit_code == 0, run

    raw, mine, same, same_end = [], [], [], []
    for _ in range(3):  # warm-up
        subprocess.run(raw_argv, check=True)
        ours()
    for _ in range(N):
        t = time.perf_counter()
        subprocess.run(raw_argv, check=True)
        raw.append(time.perf_counter() - t)
        t = time.perf_counter()
        ours()
        mine.append(time.perf_counter() - t)
        if same_argv:
            t = time.perf_counter()
            subprocess.run(same_argv, check=True)
            same.append(time.perf_counter() - t)
            t = time.perf_counter()
            subprocess.run(same_argv, check=True, capture_output=True)
            same_end.append(time.perf_counter() - t)
    benchmark.pedantic(ours, rounds=10, iterations=1)
    loop.close()
    shutil.rmtree(root, ignore_errors=True)
    r, m = _p50_ms(raw), _p50_ms(mine)
    benchmark.extra_info.update({"raw_p50_ms": round(r, 2), "backend_p50_ms": round(m, 2),
                                 "overhead_ms": round(m - r, 2), "ratio": round(m / r, 2)})  # fmt: skip
    print(f"\n{label}: raw p50 {r:.2f} ms, backend p50 {m:.2f} ms, overhead {m - r:+.2f} ms, ratio {m / r:.2f}x",
          file=sys.stderr)  # fmt: skip
    if same:
        sm, se = _p50_ms(same), _p50_ms(same_end)
        benchmark.extra_info.update({"same_argv_p50_ms": round(sm, 2), "same_argv_to_ns_end_p50_ms": round(se, 2)})  # fmt: skip
        print(f"{label}: the backend's own bwrap argv, run raw: p50 {sm:.2f} ms, until its pid 1 is gone "
              f"{se:.2f} ms (extra hardening {sm - r:+.2f} ms, namespace end {se - sm:+.2f} ms, "
              f"orchestration {m - se:+.2f} ms)", file=sys.stderr)  # fmt: skip
    return r, m


WORKDIRS = {"tmpdir": None, "tmpfs": "/dev/shm"}


@pytest.mark.parametrize("workdir", list(WORKDIRS))
def test_bwrap_overhead_vs_raw_bwrap(benchmark, workdir):
    """The bwrap backend's trivial job versus `bwrap` with the same namespaces (pid, ipc, uts,
    net, cgroup, mount) and root binds running `true`, with job directories in the temp dir
    (disk) and on tmpfs (what the sandbox itself costs)."""
    where = WORKDIRS[workdir]
    if where and not os.access(where, os.W_OK):
        pytest.skip(f"{where} is not writable")
    backend = make_backend("bwrap")
    if backend.unavailable():
        pytest.skip(backend.unavailable())
    raw = ["bwrap", "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net",
           "--unshare-cgroup-try", *backend.base_args, "--", "/bin/true"]  # fmt: skip
    argv_dir = Path(tempfile.mkdtemp(prefix="claw-bench-argv-"))
    sandbox = backend.sandbox(_job(), argv_dir / "j")
    sandbox.prepare()
    args, inner = sandbox._argv(["/bin/true"])
    r, m = _compare(
        benchmark, backend, raw, f"bwrap ({workdir})", same_argv=[*args, "--", *inner], where=where
    )
    sandbox.remove()  # unmounts the job directory's tmpfs (disk_mb) when there is one
    shutil.rmtree(argv_dir)
    RESULTS["bwrap_overhead_ms"] = m - r


@pytest.mark.parametrize("workdir", list(WORKDIRS))
def test_process_overhead_vs_raw_subprocess(benchmark, workdir):
    """The process backend's trivial job versus a plain subprocess `true`."""
    where = WORKDIRS[workdir]
    if where and not os.access(where, os.W_OK):
        pytest.skip(f"{where} is not writable")
    _compare(benchmark, make_backend("process"), ["/bin/true"], f"process ({workdir})", where=where)


def test_docker_overhead_vs_docker_run(benchmark):
    """The docker backend's trivial job versus `docker run --rm IMAGE true`."""
    backend = make_backend("docker", default_image="claw-sandbox-test:busybox")
    reason = backend.unavailable()
    if reason:
        pytest.skip(reason)
    if subprocess.run(
        ["docker", "image", "inspect", "claw-sandbox-test:busybox"], capture_output=True
    ).returncode:
        pytest.skip("image claw-sandbox-test:busybox missing (the docker tests build it)")
    global N
    saved, N = N, 10
    try:
        _compare(
            benchmark,
            backend,
            ["docker", "run", "--rm", "--network", "none", "claw-sandbox-test:busybox", "true"],
            "docker",
        )
    finally:
        N = saved


@pytest.mark.parametrize("parallel", [1, 8, 32, 64])
def test_jobs_per_second(benchmark, parallel):
    """Throughput of trivial jobs on the default backend; no infra error at any parallelism."""
    n = max(64, parallel * 2)
    jobs = [{"schema": "claw.job/v1", "job_id": f"j{i}", "command": ["true"]} for i in range(n)]
    backend = make_backend("bwrap")
    if backend.unavailable():
        backend = make_backend("process")
    stats = {}

    def go() -> None:
        t = time.perf_counter()
        runs = run_jobs(jobs, backend=backend, parallel=parallel)
        stats["rate"] = n / (time.perf_counter() - t)
        bad = [r for r in runs if r["status"] != "ok"]
        assert bad == [], bad[:3]

    benchmark.pedantic(go, rounds=3, iterations=1)
    benchmark.extra_info.update(
        {"jobs": n, "jobs_per_s": round(stats["rate"], 1), "backend": backend.name}
    )
    print(
        f"\n{backend.name} parallel={parallel}: {stats['rate']:.1f} jobs/s ({n} jobs, 0 infra errors)",
        file=sys.stderr,
    )
