"""The `bwrap` backend: bubblewrap namespaces around each step.

Each step runs as ``bwrap ... -- [setpriv] [forwarder] COMMAND`` with
- new pid, ipc, uts, cgroup and (unless policy `host`) network namespaces;
- the host's top-level directories bound read-only, except /root, /home, /tmp, /run, /mnt,
  /media (empty), the directory holding all job directories (hidden), and the interpreter
  directories the command needs (bound back read-only, e.g. a venv under /root);
- the job's workspace at /workspace and the job's own /tmp, both writable and kept between the
  steps of the job (setup, command, verify see the same files);
- as root: the step drops to a separate unprivileged host uid (default 65534) without
  capabilities and with no_new_privs; as another user: a user namespace (uid 1000 inside);
- limits from a per-job cgroup when the tree is writable, else rlimits; at the timeout the
  bwrap monitor is killed, which kills the pid namespace and so every process of the step.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from claw_sandbox import _cgroup, _forward
from claw_sandbox._proc import StepResult, killpg, run_step
from claw_sandbox.backends.base import Backend, Sandbox, argv_of, rlimit_wrap, venv_paths
from claw_sandbox.errors import InfraError
from claw_sandbox.records import Command, Job, parse_http_url

HIDDEN = {"proc", "dev", "sys", "tmp", "run", "home", "root", "mnt", "media", "lost+found"}
INNER_WORKSPACE = "/workspace"


def root_binds() -> list[str]:
    """Bind the host's top-level directories read-only, except the hidden ones."""
    args = []
    for name in sorted(os.listdir("/")):
        path = f"/{name}"
        if name in HIDDEN:
            continue
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    args += ["--ro-bind-try", "/sys", "/sys", "--dev", "/dev", "--proc", "/proc"]
    args += [
        "--dir",
        "/root",
        "--dir",
        "/home",
        "--dir",
        "/run",
        "--perms",
        "1777",
        "--dir",
        "/tmp",
    ]
    return args


def _is_ns_init(pid: int) -> bool:
    """Whether a host pid is pid 1 of a child pid namespace (as a bwrap sandbox's init is)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    ids = line.split()[1:]
                    return len(ids) >= 2 and ids[-1] == "1"
    except OSError:
        return False
    return False


class BwrapSandbox(Sandbox):
    inside_workspace = INNER_WORKSPACE
    inside_tmp = "/tmp"

    def __init__(self, backend: BwrapBackend, job: Job, jobdir: Path) -> None:
        super().__init__(backend, job, jobdir)
        self.backend: BwrapBackend = backend
        self.owner = backend.owner
        self.cgroup: _cgroup.JobCgroup | None = None
        self.relay: _forward.Relay | None = None
        self._status, self._status_fd = b"", -1

    async def start(self) -> None:
        if self.job.limits.any() and self.backend.cgroups.version is not None:
            try:
                self.cgroup = _cgroup.JobCgroup.create(
                    self.backend.cgroups, self.job.limits, "bwrap"
                )
            except OSError as exc:
                raise InfraError(f"cannot create the job's cgroup: {exc}") from exc
        if self.job.network.policy == "proxy":
            run_dir = self.jobdir / "run"
            run_dir.mkdir(mode=0o755)
            host, port = parse_http_url(self.job.network.proxy_url or "")
            self.relay = _forward.Relay(host, port)
            await self.relay.start_unix(run_dir / "proxy.sock")

    def _argv(self, command: Command) -> tuple[list[str], list[str]]:
        job = self.job
        args = [self.backend.bwrap, "--die-with-parent", "--new-session", "--unshare-pid",
                "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox"]  # fmt: skip
        if job.network.policy != "host":
            args.append("--unshare-net")
        if self.owner is None:
            args += ["--unshare-user", "--uid", "1000", "--gid", "1000", "--cap-drop", "ALL"]
        args += self.backend.base_args
        args += ["--bind", str(self.tmp), "/tmp", "--bind", str(self.workspace), INNER_WORKSPACE]
        if self.relay is not None:
            args += ["--bind", str(self.jobdir / "run"), "/run/claw"]
        if job.network.policy == "host":
            for f in ("/run/systemd/resolve",):
                args += ["--ro-bind-try", f, f]
        hidden_roots = tuple(f"/{h}" for h in HIDDEN)
        bound: set[str] = set()
        made: set[str] = set()
        # parents before children, so a bound directory never hides a bind inside it
        wanted = sorted(
            {os.path.normpath(p) for p in [*venv_paths(command), *self.backend.ro_paths]},
            key=lambda p: (p.count("/"), p),
        )
        for p in wanted:
            if not p.startswith(hidden_roots) or not os.path.exists(p):
                continue
            if any(p == b or p.startswith(b + "/") for b in bound):
                continue  # already visible through a bound parent
            bound.add(p)
            for parent in reversed(Path(p).parents[:-2]):  # bwrap would make them 0700
                if str(parent) not in made:
                    made.add(str(parent))
                    args += ["--perms", "0755", "--dir", str(parent)]
            args += ["--ro-bind", p, p]
        args += ["--remount-ro", "/", "--chdir", INNER_WORKSPACE]  # bwrap's root tmpfs, too
        inner = argv_of(command)
        if self.relay is not None:
            inner = (
                _forward.inner_command(job.network.port or 0, self.backend.socat, sys.executable)
                + inner
            )
        if self.cgroup is None:
            inner = rlimit_wrap(job.limits, inner)
        if self.owner is not None:
            uid, gid = self.owner
            # leaving uid 0 clears every capability; no_new_privs stops setuid/file-cap binaries
            inner = [self.backend.setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
                     "--no-new-privs", *inner]  # fmt: skip
        return args, inner

    def _kill_tree(self, pid: int) -> None:
        killpg(pid)  # the bwrap monitor; --die-with-parent takes the namespace down with it
        if self.cgroup is not None:
            self.cgroup.kill_all()
        self._await_namespace_end()

    def _read_status(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            while chunk := os.read(self._status_fd, 65536):
                self._status += chunk

    def _await_namespace_end(self) -> None:
        """Wait until the sandbox's pid 1 has exited, i.e. the kernel has killed everything in
        its pid namespace. bwrap's monitor reports the command's exit before that happens."""
        self._read_status()
        match = re.search(rb'"child-pid":\s*(\d+)', self._status)
        if not match or not hasattr(os, "pidfd_open"):
            return
        pid = int(match.group(1))
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return  # already gone
        try:
            if not _is_ns_init(pid):
                return  # the pid was reused: not ours
            if not select.select([pidfd], [], [], 2.0)[0]:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                select.select([pidfd], [], [], 5.0)
        finally:
            os.close(pidfd)

    async def run(
        self, command: Command, *, timeout_s: float, merge_stderr: bool = False
    ) -> StepResult:
        args, inner = self._argv(command)
        status_r, status_w = os.pipe()
        argv = [*args, "--json-status-fd", str(status_w), "--", *inner]
        if self.cgroup is not None:
            argv = self.cgroup.wrap(argv)
        env = self.env()
        if self.relay is not None and not self.backend.socat:
            env["CLAW_FORWARDER"] = _forward.PY_FORWARDER
        self._status, self._status_fd = b"", status_r
        os.set_blocking(status_r, False)
        try:
            result = await run_step(
                argv, env=env, cwd="/", timeout_s=timeout_s, output_bytes=self.job.limits.output_bytes,
                kill_tree=self._kill_tree,
                kill_is_quick=self.cgroup is None, merge_stderr=merge_stderr, pass_fds=(status_w,),
            )  # fmt: skip
        finally:
            os.close(status_w)
            self._read_status()
            os.close(status_r)
        if b"child-pid" not in self._status and not result.timed_out:
            text = (result.stderr or result.stdout).strip().splitlines()
            raise InfraError(
                f"bwrap could not start the sandbox: {text[-1] if text else 'no message'}"
            )
        if result.exit_code == 125 and "claw-sandbox: " in (result.stderr + result.stdout):
            line = [
                x for x in (result.stderr + result.stdout).splitlines() if "claw-sandbox: " in x
            ]
            raise InfraError(line[-1])
        if self.cgroup is not None:
            if self.job.limits.memory_mb and self.cgroup.memory_exceeded():
                self.notes.append(f"memory limit exceeded ({self.job.limits.memory_mb} MB)")
            if self.job.limits.pids and self.cgroup.pids_exceeded():
                self.notes.append(f"pids limit reached ({self.job.limits.pids})")
        return result

    async def stop(self) -> None:
        if self.relay is not None:
            await self.relay.close()
            self.relay = None
        if self.cgroup is not None:
            await asyncio.to_thread(self.cgroup.destroy)
            self.cgroup = None


class BwrapBackend(Backend):
    name = "bwrap"
    isolates = True

    def __init__(self, *, uid: int = 65534, gid: int = 65534, ro_paths: tuple[str, ...] = (),
                 hide: tuple[str, ...] = ()) -> None:  # fmt: skip
        self.bwrap = shutil.which("bwrap") or ""
        self.setpriv = shutil.which("setpriv") or ""
        self.socat = shutil.which("socat")
        self.cgroups = _cgroup.detect()
        self.owner = (uid, gid) if os.geteuid() == 0 and self.setpriv else None
        env_paths = tuple(p for p in os.environ.get("CLAW_SANDBOX_RO_PATHS", "").split(":") if p)
        self.ro_paths = (*ro_paths, *env_paths)
        self.base_args = root_binds()
        self.hidden: set[str] = set()
        for h in hide:
            self.base_args += ["--tmpfs", h]
        self._reason: str | None | bool = False

    def hide(self, path: str) -> None:
        """Hide a host directory (e.g. the one holding every job directory) behind an empty tmpfs."""
        path = os.path.realpath(path)
        if not path.startswith(tuple(f"/{h}/" for h in HIDDEN)) and path not in self.hidden:
            self.hidden.add(path)
            self.base_args += ["--tmpfs", path]

    def unavailable(self) -> str | None:
        if self._reason is not False:
            return self._reason  # type: ignore[return-value]
        self._reason = self._probe()
        return self._reason

    def _probe(self) -> str | None:
        if not self.bwrap:
            return "bwrap is not installed (apt-get install bubblewrap)"
        argv = [self.bwrap, "--die-with-parent", "--unshare-pid", "--unshare-net", "--unshare-ipc"]
        if self.owner is None:
            argv += ["--unshare-user", "--uid", "1000", "--gid", "1000"]
        argv += [*self.base_args, "--", "/bin/true"]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"bwrap does not run: {exc}"
        if proc.returncode != 0:
            msg = proc.stderr.strip().splitlines()
            return f"bwrap cannot create namespaces here: {msg[-1] if msg else proc.returncode}"
        return None

    def sandbox(self, job: Job, jobdir: Path) -> Sandbox:
        return BwrapSandbox(self, job, jobdir)
