"""The `process` backend: a plain subprocess in a temporary directory. It does NOT isolate.

For trusted code and machines with nothing else. Limits come from a per-job cgroup when the
cgroup tree is writable (else rlimits); the whole process tree is still killed at the timeout
(cgroup, process group, and every process carrying the job's marker in its environment).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
import uuid
from pathlib import Path

from claw_sandbox import _cgroup, _forward
from claw_sandbox._proc import StepResult, find_marked, killpg, run_step
from claw_sandbox.backends.base import (
    DEFAULT_LIMITS,
    Backend,
    Sandbox,
    argv_of,
    effective_limits,
    rlimit_wrap,
)
from claw_sandbox.errors import InfraError, JobError
from claw_sandbox.records import Command, Job, Limits, parse_http_url

MARKER = "CLAW_SANDBOX_TOKEN"


class ProcessSandbox(Sandbox):
    backend: ProcessBackend

    def __init__(self, backend: ProcessBackend, job: Job, jobdir: Path) -> None:
        super().__init__(backend, job, jobdir)
        self.inside_workspace = str(self.workspace)
        self.inside_tmp = str(self.tmp)
        self.token = uuid.uuid4().hex
        self.cgroup: _cgroup.JobCgroup | None = None
        self.relay_port: int | None = None
        self.limits = effective_limits(
            job.limits, backend.default_limits, cgroup=backend.cgroups.version is not None,
            disk=False,
        )  # fmt: skip

    async def start(self) -> None:
        net = self.job.network
        if net.policy == "proxy" and net.port is not None:
            host, port = parse_http_url(net.proxy_url or "")
            if not (host in ("127.0.0.1", "localhost") and port == net.port):
                await _forward.acquire_loopback(net.port, host, port)
                self.relay_port = net.port
        support = self.backend.cgroups
        if support.version is not None:
            try:
                self.cgroup = _cgroup.JobCgroup.create(support, self.limits, "process")
            except OSError as exc:
                raise InfraError(f"cannot create the job's cgroup: {exc}") from exc

    def env(self) -> dict[str, str]:
        env = super().env()
        env[MARKER] = self.token
        return env

    def _kill_tree(self, pid: int) -> None:
        killpg(pid)
        if self.cgroup is not None:
            self.cgroup.kill_all()  # the cgroup holds every descendant: nothing else to look for
            return
        marker = f"{MARKER}={self.token}".encode()
        for _ in range(50):
            pids = find_marked(marker)
            if not pids:
                break
            for p in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(p, signal.SIGKILL)
            time.sleep(0.005)

    async def run(
        self, command: Command, *, timeout_s: float, merge_stderr: bool = False
    ) -> StepResult:
        argv = argv_of(command)
        if self.cgroup is not None:  # a runner killed with SIGKILL: the next one sweeps the group
            argv = self.cgroup.wrap(argv)
        else:
            if self.backend.setpriv:  # the step's main process dies with the runner
                argv = [self.backend.setpriv, "--pdeathsig", "KILL", *argv]
            argv = rlimit_wrap(self.job.limits, argv)
        result = await run_step(
            argv, env=self.env(), cwd=str(self.workspace), timeout_s=timeout_s,
            output_bytes=self.job.limits.output_bytes, kill_tree=self._kill_tree,
            merge_stderr=merge_stderr,
        )  # fmt: skip
        if result.exit_code == 125 and _cgroup.ENTER_FAILED in result.stderr:
            raise InfraError(_cgroup.ENTER_FAILED)
        if self.cgroup is not None:
            self.notes += self.cgroup.limit_notes(self.limits)
        return result

    async def stop(self) -> None:
        if self.relay_port is not None:
            await _forward.release_loopback(self.relay_port)
            self.relay_port = None
        if self.cgroup is not None:
            self.cgroup.destroy()
            self.cgroup = None


class ProcessBackend(Backend):
    name = "process"
    isolates = False
    warning = (
        "backend 'process' does NOT isolate: jobs run as this user, can read and write whatever "
        "it can and reach any network address (network policies are not enforced; with policy "
        "proxy the proxy is relayed to 127.0.0.1:PORT on the host, nothing is blocked)"
    )

    def __init__(self, *, default_limits: Limits = DEFAULT_LIMITS) -> None:
        self.cgroups = _cgroup.detect()
        self.default_limits = default_limits
        self.setpriv = shutil.which("setpriv")

    def unavailable(self) -> str | None:
        return None

    def check_job(self, job: Job) -> None:
        super().check_job(job)
        if job.workdir or job.mount_targets() or job.profile != "claw":
            raise JobError(
                f"job {job.job_id!r}: workdir / mounts / profile {job.profile}: the process "
                "backend runs on the host's own filesystem and cannot place absolute paths "
                "(use bwrap or docker)"
            )

    def sandbox(self, job: Job, jobdir: Path) -> Sandbox:
        return ProcessSandbox(self, job, jobdir)
