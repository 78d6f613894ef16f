"""Parallel runs, bounded infra retries, and resumable output that survives a killed runner."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from claw_sandbox import InfraError, JobsFileError, arun_jobs, run_jobs
from claw_sandbox.backends.process import ProcessBackend, ProcessSandbox
from sandbox_testlib import alive_with, job, running_argv


class FlakyBackend(ProcessBackend):
    """The process backend, but sandbox start fails the first `fail` times (per job id)."""

    name = "flaky"
    warning = ""

    def __init__(self, fail: int) -> None:
        super().__init__()
        self.fail, self.tries = fail, {}

    def sandbox(self, job, jobdir):
        backend = self

        class Flaky(ProcessSandbox):
            async def start(self):
                backend.tries[job.job_id] = backend.tries.get(job.job_id, 0) + 1
                if backend.tries[job.job_id] <= backend.fail:
                    raise InfraError("simulated: could not create namespace")
                await super().start()

        return Flaky(self, job, jobdir)


def test_infra_failures_are_retried_then_reported(tmp_path):
    """Two failures then success -> ok with attempts 3; always failing -> infra_error."""
    (run,) = run_jobs(
        [job("a", command="echo hi")], backend=FlakyBackend(2), retries=2, workdir=tmp_path
    )
    assert run["status"] == "ok" and run["attempts"] == 3 and run["stdout_tail"] == "hi\n"
    (run,) = run_jobs([job("b")], backend=FlakyBackend(99), retries=1, workdir=tmp_path)
    assert run["status"] == "infra_error" and run["attempts"] == 2
    assert run["error"] == "simulated: could not create namespace" and run["exit_code"] is None
    assert os.listdir(tmp_path) == []


def test_results_stream_in_completion_order(process, tmp_path):
    """A short job started after a long one is reported first; parallel jobs overlap."""
    jobs = [job("slow", command="sleep 1"), job("fast", command="true")]
    started = time.monotonic()
    runs = run_jobs(jobs, backend=process, parallel=2, workdir=tmp_path)
    assert [r["job_id"] for r in runs] == ["fast", "slow"]
    assert time.monotonic() - started < 1.9


def test_async_api_and_bad_jobs_next_to_good_ones(process, tmp_path):
    """arun_jobs yields run dicts; an invalid dict is a per-job error, the rest run."""

    async def go():
        jobs = [job("ok"), {"schema": "claw.job/v1", "job_id": "broken"}, "not an object"]
        return [r async for r in arun_jobs(jobs, backend=process, parallel=2, workdir=tmp_path)]

    runs = {r["job_id"]: r for r in asyncio.run(go())}
    assert runs["ok"]["status"] == "ok"
    assert (
        runs["broken"]["status"] == "error"
        and "command: missing required field" in runs["broken"]["error"]
    )
    assert runs["job #3"]["error"] == "job #3: expected a JSON object, got str"


def test_missing_copy_from_is_a_job_error_not_infra(process, tmp_path):
    """A copy_from that does not exist is the job's fault: status error, no retries."""
    (run,) = run_jobs(
        [job("c", workspace={"copy_from": str(tmp_path / "nope")})],
        backend=process,
        workdir=tmp_path,
    )
    assert run["status"] == "error" and run["attempts"] == 1 and "does not exist" in run["error"]


def test_output_file_resumes_without_duplicates(process, tmp_path):
    """Rerunning with the same output file skips recorded jobs and appends the new ones."""
    out = tmp_path / "runs.jsonl"
    run_jobs([job("a"), job("b")], backend=process, out=out, workdir=tmp_path / "w")
    runs = run_jobs(
        [job("a"), job("b"), job("c")], backend=process, out=out, workdir=tmp_path / "w"
    )
    assert [r["job_id"] for r in runs] == ["c"]
    ids = [json.loads(line)["job_id"] for line in out.read_text().splitlines()]
    assert sorted(ids) == ["a", "b", "c"]


def test_killed_runner_resumes_without_losing_or_duplicating(tmp_path):
    """SIGKILL the CLI mid-run (plus a torn last line); the rerun completes every job exactly once."""
    jobs = tmp_path / "jobs.jsonl"
    n = 12
    jobs.write_text(
        "".join(json.dumps(job(f"j{i}", command=f"sleep 0.{i % 4 + 1}")) + "\n" for i in range(n))
    )
    out = tmp_path / "runs.jsonl"
    cmd = [sys.executable, "-m", "claw_sandbox", "run", str(jobs), "-o", str(out),
           "--backend", "process", "--parallel", "3", "--workdir", str(tmp_path / "w")]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (
        not out.exists() or len(out.read_text().splitlines()) < 4
    ):
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    first = out.read_text().splitlines()
    assert 4 <= len(first) < n
    with out.open("a") as f:
        f.write('{"schema": "claw.run/v1", "job_id": "j1')  # a write torn by the kill
    subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
    ids = [json.loads(line)["job_id"] for line in out.read_text().splitlines()]
    assert sorted(ids) == sorted(f"j{i}" for i in range(n))
    assert ids[: len(first)] == [json.loads(x)["job_id"] for x in first]


def test_second_writer_on_the_same_file_is_refused(process, tmp_path):
    """Two runners appending to one runs file would duplicate jobs: the second is refused."""
    import fcntl

    out = tmp_path / "runs.jsonl"
    with out.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            run_jobs([job("a")], backend=process, out=out, workdir=tmp_path)
        except Exception as exc:  # noqa: BLE001
            assert "another claw-sandbox run is writing to this file" in str(exc)
        else:
            raise AssertionError("the locked file was written")
    assert Path(out).read_text() == ""


def test_duplicate_job_ids_are_refused_before_anything_runs(process, tmp_path):
    """The API refuses two jobs with one id, like the CLI does for a jobs file."""
    with pytest.raises(JobsFileError, match=r"job #2: job_id 'a' already used by job #1"):
        run_jobs([job("a"), job("a")], backend=process, workdir=tmp_path)


def test_sigterm_kills_and_removes_running_sandboxes(tmp_path):
    """SIGTERM to the runner kills every running job's tree and removes its directory."""
    token = f"{uuid.uuid4().int % 10**6}.25"
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(
        "".join(json.dumps(job(f"j{i}", command=f"sleep {token}")) + "\n" for i in range(2))
    )
    workdir = tmp_path / "w"
    cmd = [sys.executable, "-m", "claw_sandbox", "run", str(jobs), "-o", str(tmp_path / "runs.jsonl"),
           "--backend", "process", "--parallel", "2", "--workdir", str(workdir)]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    # count the `sleep` processes themselves: a shell on its way to exec them matches the
    # token too, and a count that includes it can drop between two looks
    deadline = time.monotonic() + 60
    while len(sleeping := running_argv(["sleep", token])) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    if len(sleeping) < 2:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"the jobs did not start: {sleeping}; runner stderr: {err}")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "rerun with the same -o to resume" in err
    assert alive_with(f"sleep {token}") == []
    assert os.listdir(workdir) == []
