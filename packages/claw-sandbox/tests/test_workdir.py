"""--workdir: a relative path works (taken from the current directory), one that cannot be made is
a one-line error, and a bwrap step whose sandbox could not be set up is never `status: ok`."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest
from claw_sandbox import _leftovers
from claw_sandbox.cli import main
from claw_sandbox.errors import InfraError
from claw_sandbox.records import Job
from claw_sandbox.scheduler import Scheduler
from click.testing import CliRunner
from sandbox_testlib import job

WRITE_AND_READ = "echo hi > out.txt && cat out.txt"


def _jobs(path, n: int = 2) -> str:
    path.write_text("".join(json.dumps(job(f"j{i}", WRITE_AND_READ)) + "\n" for i in range(n)))
    return str(path)


def test_relative_workdir_runs_bwrap_jobs(bwrap, tmp_path, monkeypatch):
    """`run --workdir rel` on bwrap: every job runs its command (exit 0, its output), not a bwrap
    bind error under a run that says ok."""
    monkeypatch.chdir(tmp_path)
    jobs = _jobs(tmp_path / "jobs.jsonl")
    r = CliRunner().invoke(main, ["run", jobs, "--backend", "bwrap", "--workdir", "work/here"])
    assert r.exit_code == 0, r.output
    runs = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(runs) == 2
    for run in runs:
        assert (run["status"], run["exit_code"], run["stdout_tail"]) == ("ok", 0, "hi\n"), run
    assert (tmp_path / "work" / "here").is_dir()


def test_relative_scheduler_root_runs_bwrap_jobs(bwrap, tmp_path, monkeypatch):
    """The library too: a Scheduler given a relative root makes it absolute before bwrap binds it."""
    from pathlib import Path

    monkeypatch.chdir(tmp_path)
    sched = Scheduler(bwrap, 1, 0, Path("rel-root"), lambda msg: None)

    async def run() -> list[dict]:
        return [r async for r in sched.stream([Job.from_dict(job("a", WRITE_AND_READ), "t")])]

    (row,) = asyncio.run(run())
    assert (row["status"], row["exit_code"], row["stdout_tail"]) == ("ok", 0, "hi\n"), row


@pytest.mark.parametrize("where", ["under a file", "a file"])
def test_workdir_that_cannot_be_made_is_one_line(tmp_path, where):
    """--workdir under (or at) a regular file exits 2 with one line naming it, before any job runs."""
    jobs = _jobs(tmp_path / "jobs.jsonl")
    (tmp_path / "f").write_text("x")
    workdir = tmp_path / "f" / "w" if where == "under a file" else tmp_path / "f"
    r = CliRunner().invoke(main, ["run", jobs, "--backend", "process", "--workdir", str(workdir)])
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and r.stdout == ""
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and str(tmp_path / "f") in errors[0], r.stderr


async def _one_step(sandbox, command, spoil=lambda sandbox: None):
    """Prepare the sandbox, `spoil` it, run one step; always tear it down (tmpfs, lock, files)."""
    sandbox.prepare()
    try:
        spoil(sandbox)
        await sandbox.start()
        try:
            return await sandbox.run(command, timeout_s=30)
        finally:
            await sandbox.stop()
    finally:
        _leftovers.release(sandbox.lock, sandbox.jobdir, kept=False)
        sandbox.remove()


def test_bwrap_setup_failure_is_an_infra_error(bwrap, tmp_path):
    """A step whose sandbox bwrap cannot set up (the job directory's /tmp vanished, as under a
    broken workdir) raises InfraError naming bwrap's reason; it is not a command that exited 1."""
    sandbox = bwrap.sandbox(Job.from_dict(job("gone", "true"), "t"), tmp_path / "jobdir")
    with pytest.raises(InfraError, match="bwrap could not start the sandbox: .*tmp"):
        asyncio.run(_one_step(sandbox, "true", lambda sb: shutil.rmtree(sb.tmp)))
    assert not (tmp_path / "jobdir").exists()


def test_bwrap_reports_a_failing_command_as_its_exit_code(bwrap, tmp_path):
    """The other side: a command that runs and exits 1 (even one that prints 'bwrap: ...') is the
    command's exit code, not an infrastructure error."""
    command = "echo 'bwrap: not really' >&2; exit 1"
    sandbox = bwrap.sandbox(Job.from_dict(job("fails", command), "t"), tmp_path / "jd")
    result = asyncio.run(_one_step(sandbox, command))
    assert result.exit_code == 1 and "bwrap: not really" in result.stderr
