"""The `docker` backend (docker SDK, `pip install claw-sandbox[docker]`): a container per step.

Every step of a job runs in a fresh container of the job's image with the job's workspace at
/workspace and the job's /tmp bind-mounted (so setup, command and verify share files), a
read-only root filesystem, all capabilities dropped, no-new-privileges, an unprivileged user,
bwrap's seccomp filter as a Docker profile (`_seccomp.docker_profile`: no keyrings, mounts, new
namespaces or ptrace), memory/pids/cpu limits (the job's, else the backend's defaults), a disk
bound like bwrap's (a tmpfs job directory under a root runner), and network `none`. Policy `proxy` adds exactly one thing to that
empty network namespace: a forwarder listening on 127.0.0.1:PORT, started from the host inside
the container's namespace (nsenter), which relays to a per-job unix socket and from there to
the proxy. Nothing else is reachable. Policy `host` uses the host network (explicit opt-in).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from claw_sandbox import _forward, _seccomp, _tmpfs
from claw_sandbox._proc import StepResult
from claw_sandbox.backends._docker_services import JobServices, not_running, sweep_services
from claw_sandbox.backends.base import DEFAULT_LIMITS, Backend, Sandbox, argv_of, effective_limits
from claw_sandbox.errors import InfraError, JobError
from claw_sandbox.records import Command, Job, Limits, Step, Verify, is_under, parse_http_url
from claw_sandbox.workspace import copy_into

WAIT_READY = 'while [ ! -e /run/claw/ready ]; do sleep 0.01; done; exec "$@"'
#: how long a restarted trial container's keep-alive has to come up before the verify step
KEEPALIVE_WAIT_S = 30.0
HARBOR_NOTE = """
A job with `profile: "harbor"` runs as Harbor runs a trial: one container for every step (setup,
command, verify), started from the image with a `sleep infinity` under docker's init (and started
again, every process of it killed, before each verify step); each step
is a `docker exec` at the job's `workdir`, as the image's USER (root unless the Dockerfile says
otherwise), with the image's PATH and HOME (the job's env over them), docker's default
capabilities and a writable container filesystem. The job's files are copied into the workdir
(not bind-mounted: the image's own files there stay); its mounts (/logs/..., /solution) are
bind-mounted. Verify mounts (/tests) are not there while the
command runs: they are copied into the container when its verify step starts and copied back
out for reading (reward file, collect), as Harbor copies its tests in at verify time only.
"""


class DockerSandbox(Sandbox):
    inside_workspace = "/workspace"
    inside_tmp = "/tmp"

    def __init__(self, backend: DockerBackend, job: Job, jobdir: Path) -> None:
        super().__init__(backend, job, jobdir)
        self.backend: DockerBackend = backend
        self.owner = backend.owner
        self.relay: _forward.Relay | None = None
        self.image = job.image or backend.default_image
        self.container: Any = None  # the trial container of a `profile: "harbor"` job
        self.placed: set[str] = set()  # verify-only mount targets now copied into the container
        self.forwarder: subprocess.Popen | None = None
        self.broken = ""  # why a restarted trial container did not come up again (the job's doing)
        self.services: JobServices | None = None  # the job's sidecars and their network
        if job.profile == "harbor":
            self.owner = None  # root (or the image's USER) inside owns what it writes
        self.limits = effective_limits(
            job.limits, backend.default_limits, cgroup=True,
            disk=self.owner is not None and job.keep == "never" and _tmpfs.can_mount(),
        )  # fmt: skip

    async def start(self) -> None:
        (self.jobdir / "run").mkdir(mode=0o755)
        if self.job.network.policy == "proxy":
            host, port = parse_http_url(self.job.network.proxy_url or "")
            self.relay = _forward.Relay(host, port)
            await self.relay.start_unix(self.jobdir / "run" / "proxy.sock")
        if self.job.services:
            await asyncio.to_thread(self._start_services)
        if self.job.profile == "harbor":
            await asyncio.to_thread(self._start_trial)

    def _start_services(self) -> None:
        """The job's network and sidecars, ready within the job's timeout (their start counts)."""
        self.backend.sweep_services()
        self.services = JobServices(self.backend.client(), self.job, self._service_confinement())
        self.services.start(time.monotonic() + self.job.timeout_s)

    def _service_confinement(self) -> dict[str, Any]:
        """What every sidecar gets from its job: the job's memory, pids and cpu limits, and in the
        claw profile its confinement too (all capabilities dropped, no-new-privileges, a read-only
        root with a fresh /tmp and /run); a harbor job's sidecars keep docker's defaults there,
        as its trial container does."""
        config = {k: v for k, v in self._config(("true",)).items()
                  if k in ("mem_limit", "memswap_limit", "pids_limit", "nano_cpus")}  # fmt: skip
        if self.job.profile != "harbor":
            config.update(cap_drop=["ALL"], security_opt=["no-new-privileges"], read_only=True,
                          tmpfs={"/tmp": "", "/run": ""})  # fmt: skip
        return config

    def _harbor_config(self) -> dict:
        """The trial container: docker's defaults (capabilities, writable filesystem, the image's
        USER, the engine's seccomp profile, which allows ptrace: as in Harbor, see
        docs/security.md), the job's limits and network, its mounts bound, cwd = workdir."""
        config = self._config(("sleep", "infinity"))
        for key in ("read_only", "cap_drop", "security_opt", "user"):
            config.pop(key, None)
        config["working_dir"] = self.inside_workspace
        config["command"] = ["sleep", "infinity"]
        config["environment"] = self.env()
        volumes = {str(self.jobdir / "run"): {"bind": "/run/claw", "mode": "ro"}}
        verify_only = self.job.verify_only_targets()
        for i, target in enumerate(self.job.mount_targets()):
            if target not in verify_only:  # those are copied in at verify time only
                volumes[str(self.mount_dir(i))] = {"bind": target, "mode": "rw"}
        config["volumes"] = volumes
        return config

    def _start_trial(self) -> None:
        import docker.errors

        client = self.backend.client()
        try:
            self.container = client.containers.create(**self._harbor_config())
            self.container.start()
        except docker.errors.ImageNotFound:
            raise JobError(
                f"job {self.job.job_id!r}: image: {self.image!r} not found (build or pull it first)"
            ) from None
        except docker.errors.APIError as exc:
            raise InfraError(
                f"docker could not start the container: {exc.explanation or exc}"
            ) from exc
        self.container.reload()
        if self.container.status != "running":
            raise InfraError(not_running(self.container, self.env(), "the trial container"))
        if self.relay is not None:
            self.forwarder = self._start_forwarder(self.container)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for entry in sorted(os.listdir(self.workspace)):
                tar.add(self.workspace / entry, entry)  # the host tree the job never touched
        try:
            self.container.put_archive(self.inside_workspace, buf.getvalue())
        except docker.errors.APIError as exc:
            raise InfraError(
                f"docker could not copy the workspace in: {exc.explanation or exc}"
            ) from exc

    def clear_for_verify(self, verify: Verify) -> None:
        """A trial container outlives each step, and so would anything the agent left running in
        it: a process that keeps writing the reward file, or the container's own `sleep infinity`
        and docker's init, which the agent (root inside, as in Harbor) can ptrace or rewrite
        through /proc/<pid>/mem. So the whole container is killed (its pid namespace with it) and
        started again: the verify step finds only a fresh init and keep-alive, and the container's
        files as the agent left them. Then the host directories are cleared (check_job keeps a
        harbor job's reward file and reset paths in mounts, which are bound from the host)."""
        if self.job.profile == "harbor" and self.container is not None:
            self._restart_trial()
        super().clear_for_verify(verify)

    def _restart_trial(self) -> None:
        """Kill every process of the trial container and start it again. It started from this
        config before, so when it does not start now, or its keep-alive does not come up, it is
        what the job left in it that fails (`sleep` removed, the workdir made a file): `broken`
        says so and the steps that follow fail. That is the job's failure, never an infra error
        (which an agent could choose to hide its failures)."""
        import docker.errors

        assert self.container is not None
        if self.forwarder is not None:
            self.forwarder.kill()
            self.forwarder.wait()
            self.forwarder = None
        try:
            with contextlib.suppress(docker.errors.APIError):  # not running: already stopped
                self.container.kill()
            self.container.wait(timeout=60)
        except docker.errors.APIError as exc:
            raise InfraError(
                f"docker could not stop the trial container: {exc.explanation or exc}"
            ) from exc
        try:
            self.container.start()
        except docker.errors.APIError as exc:
            self.broken = "the trial container did not start again for the verify step: " + str(
                exc.explanation or exc
            )
            return
        if not self._keepalive_up(time.monotonic() + KEEPALIVE_WAIT_S):
            self.container.reload()
            self.broken = "the trial container did not come up again for the verify step: " + (
                not_running(self.container, {}, "it")
            )
            return
        if self.relay is not None:
            self.forwarder = self._start_forwarder(self.container)

    def _keepalive_up(self, deadline: float) -> bool:
        """Whether the trial container runs its init and keep-alive (two processes or more, still
        running a moment later) before `deadline` (time.monotonic)."""
        import docker.errors

        assert self.container is not None
        while time.monotonic() < deadline:
            with contextlib.suppress(docker.errors.APIError):  # not running (yet, or any more)
                if len(self.container.top()["Processes"]) >= 2:
                    time.sleep(0.1)
                    self.container.reload()
                    return self.container.status == "running"
            self.container.reload()
            if self.container.status not in ("created", "running", "restarting"):
                return False
            time.sleep(0.02)
        return False

    def place_verify_files(self, verify: Verify | None = None) -> None:
        super().place_verify_files(verify)
        if self.job.profile != "harbor" or self.container is None:
            return
        verify = verify or self.job.verify
        if verify is None:
            return
        if verify.files or verify.copy_from:  # the hidden files the host workspace now holds
            self._put_tree(self.workspace, self.inside_workspace)
        verify_only = self.job.verify_only_targets()
        for m in verify.mounts:
            if m.target in verify_only:
                self._sh(f"rm -rf {shlex.quote(m.target)} && mkdir -p {shlex.quote(m.target)}")
                self._put_tree(self.mount_of(m.target), m.target)
                self.placed.add(m.target)

    def end_verify(self) -> None:
        """The verify-only mounts leave the container again (copied out first, for reading)."""
        if self.job.profile != "harbor" or self.container is None or not self.placed:
            return
        self._copy_placed_out()
        self._sh("rm -rf " + " ".join(shlex.quote(t) for t in sorted(self.placed)))
        self.placed.clear()

    def begin_step(self, step: Step, index: int) -> None:
        super().begin_step(step, index)
        if self.job.profile == "harbor" and self.container is not None and step.files:
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                for rel in sorted(step.files):
                    tar.add(self.workspace / rel, rel)
            self._put(self.inside_workspace, buf.getvalue())

    def _sh(self, script: str) -> None:
        r = self._exec(("/bin/sh", "-c", script), 60.0, True)
        if r.exit_code != 0:
            raise InfraError(
                f"docker: {script[:80]!r} exited with {r.exit_code}: {r.stdout[-200:]}"
            )

    def _put(self, dest: str, data: bytes) -> None:
        import docker.errors

        assert self.container is not None
        try:
            self.container.put_archive(dest, data)
        except docker.errors.APIError as exc:
            raise InfraError(
                f"docker could not copy files to {dest}: {exc.explanation or exc}"
            ) from exc

    def _put_tree(self, src: Path, dest: str) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for entry in sorted(os.listdir(src)):
                tar.add(src / entry, entry)
        self._put(dest, buf.getvalue())

    def _copy_placed_out(self) -> None:
        """The verify-only mounts' contents, from the container back to their host directories,
        for those the job reads from (a reward file or collect path in them): the others, like
        /tests, are the verifier's own to move or remove (as in Harbor)."""
        read = [*self.job.collect, *(v.reward_file for v in self.job.verifies() if v.reward_file)]
        for target in sorted(self.placed):
            if any(p.startswith("/") and is_under(p, target) for p in read):
                self._copy_dir_out(target, self.mount_of(target), f"mount {target}")

    async def sync_out(self) -> None:
        """Copy the trial container's workdir out when the job reads from it (collect, reward),
        and the verify-only mounts while they are in the container."""
        if self.job.profile != "harbor" or self.container is None:
            return
        if self.placed:
            await asyncio.to_thread(self._copy_placed_out)
        wanted = [
            *self.job.collect,
            *(v.reward_file for v in self.job.verifies() if v.reward_file),
        ]
        places = [self.job.place_of(p) for p in wanted]
        if not any(place is not None and place[0] is None for place in places):
            return  # nothing is read from the workdir
        await asyncio.to_thread(self._copy_out)

    def _copy_out(self) -> None:
        self._copy_dir_out(self.inside_workspace, self.workspace, "workdir")

    def _copy_dir_out(self, inside: str, host: Path, what: str) -> None:
        import docker.errors

        assert self.container is not None
        tar_path = self.jobdir / "copy-out.tar"
        try:
            stream, _ = self.container.get_archive(inside.rstrip("/") + "/.")
            with open(tar_path, "wb") as f:
                for chunk in stream:
                    f.write(chunk)
        except docker.errors.APIError as exc:
            self.notes.append(f"could not copy the {what} out: {exc.explanation or exc}")
            return
        shutil.rmtree(host)
        try:
            copy_into(str(tar_path), host, f"job {self.job.job_id!r}: {what}")
        except JobError as exc:
            self.notes.append(str(exc))
        finally:
            tar_path.unlink()

    def _exec(
        self, command: Command, timeout_s: float, merge_stderr: bool, user: str = ""
    ) -> StepResult:
        """One step of a trial: `docker exec` at the workdir (as `user`, default the image's);
        at the timeout its process tree is killed from the host (the container lives on)."""
        import docker.errors

        assert self.container is not None
        api = self.backend.client().api
        argv = argv_of(command) if not isinstance(command, str) else ["/bin/sh", "-c", command]
        try:
            ex = api.exec_create(
                self.container.id,
                argv,
                workdir=self.inside_workspace,
                environment=self.env(),
                stdout=True,
                stderr=True,
                user=user,
            )
        except docker.errors.APIError as exc:
            with contextlib.suppress(docker.errors.APIError):
                self.container.reload()
                if self.container.status != "running":  # it died since the last step
                    raise InfraError(
                        not_running(self.container, self.env(), "the trial container")
                    ) from exc
            raise InfraError(f"docker exec failed: {exc.explanation or exc}") from exc
        out, err = bytearray(), bytearray()

        from docker.utils.socket import STDERR, frames_iter

        sock = api.exec_start(ex["Id"], socket=True)

        def pump() -> None:
            with contextlib.suppress(OSError, ValueError):
                for stream, data in frames_iter(sock, tty=False):
                    (err if stream == STDERR and not merge_stderr else out).extend(data)

        t = threading.Thread(target=pump, daemon=True)
        t.start()
        t.join(timeout_s)
        timed_out = t.is_alive()
        if timed_out:
            pid = api.exec_inspect(ex["Id"]).get("Pid") or 0
            _kill_tree(pid)
            t.join(30)
        raw = getattr(sock, "_sock", None)
        sock.close()
        if raw is not None:
            raw.close()
        info = api.exec_inspect(ex["Id"])
        code = None if timed_out else info.get("ExitCode")
        limit = self.job.limits.output_bytes
        return StepResult(
            exit_code=code, timed_out=timed_out,
            stdout=bytes(out[-limit:] if limit else b"").decode("utf-8", errors="replace"),
            stderr=bytes(err[-limit:] if limit else b"").decode("utf-8", errors="replace"),
        )  # fmt: skip

    def _config(self, command: Command) -> dict[str, Any]:
        limits = self.limits
        argv = argv_of(command) if not isinstance(command, str) else ["/bin/sh", "-c", command]
        if self.relay is not None:
            argv = ["/bin/sh", "-c", WAIT_READY, "claw-wait", *argv]
        config: dict[str, Any] = {
            "image": self.image, "command": argv, "detach": True, "working_dir": "/workspace",
            "environment": self.env(), "read_only": True, "cap_drop": ["ALL"], "init": True,
            "security_opt": ["no-new-privileges", "seccomp=" + _seccomp.docker_profile()],
            "hostname": "sandbox",
            "volumes": {str(self.workspace): {"bind": "/workspace", "mode": "rw"},
                        str(self.tmp): {"bind": "/tmp", "mode": "rw"},
                        str(self.jobdir / "run"): {"bind": "/run/claw", "mode": "ro"}},
            "network_mode": "host" if self.job.network.policy == "host" else "none",
            "labels": {"claw-sandbox.job": self.job.job_id[:200]},
        }  # fmt: skip
        if self.services is not None:  # the job's own network, where its services are
            config["network_mode"] = self.services.network_name
            config["labels"] = self.services.labels
        if self.owner:
            config["user"] = f"{self.owner[0]}:{self.owner[1]}"
        if limits.memory_mb:
            config["mem_limit"] = f"{limits.memory_mb}m"
            config["memswap_limit"] = f"{limits.memory_mb}m"
        if limits.pids:
            config["pids_limit"] = limits.pids
        if limits.cpus:
            config["nano_cpus"] = int(limits.cpus * 1e9)
        return config

    def env(self) -> dict[str, str]:
        env = super().env()
        env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        if self.job.profile == "harbor":  # the image's PATH and user's HOME, the container's /tmp
            del env["PATH"], env["HOME"], env["TMPDIR"]
        env.update(self.job.env)
        return env

    async def run(
        self, command: Command, *, timeout_s: float, merge_stderr: bool = False
    ) -> StepResult:
        if self.broken:  # nothing runs in a trial container the job broke: the step fails
            return StepResult(exit_code=1, timed_out=False, stdout=self.broken + "\n", stderr="")
        if self.job.profile == "harbor":
            return await asyncio.to_thread(self._exec, command, timeout_s, merge_stderr)
        return await asyncio.to_thread(self._run, command, timeout_s, merge_stderr)

    def _run(self, command: Command, timeout_s: float, merge_stderr: bool) -> StepResult:
        import docker.errors

        client = self.backend.client()
        started = time.monotonic()
        try:
            config = self._config(command)
            config.pop("detach")
            container = client.containers.create(**config)  # create never pulls
        except docker.errors.ImageNotFound:
            raise JobError(
                f"job {self.job.job_id!r}: image: {self.image!r} not found (build or pull it first)"
            ) from None
        except docker.errors.APIError as exc:
            raise InfraError(
                f"docker could not start the container: {exc.explanation or exc}"
            ) from exc
        forwarder = None
        try:
            try:
                container.start()
            except docker.errors.APIError as exc:
                raise InfraError(
                    f"docker could not start the container: {exc.explanation or exc}"
                ) from exc
            if self.relay is not None:
                forwarder = self._start_forwarder(container)
            timed_out = False
            try:
                left = max(0.5, timeout_s - (time.monotonic() - started))
                status = container.wait(timeout=left)
                code = int(status.get("StatusCode", -1))
            except Exception:  # requests' ReadTimeout / ConnectionError: the timeout passed
                timed_out, code = True, None
                with contextlib.suppress(docker.errors.APIError):
                    container.kill()
                with contextlib.suppress(Exception):
                    container.wait(timeout=30)
            limit = self.job.limits.output_bytes
            out = container.logs(stdout=True, stderr=merge_stderr)[-limit:] if limit else b""
            err = (
                b""
                if merge_stderr or not limit
                else container.logs(stdout=False, stderr=True)[-limit:]
            )
            container.reload()
            if container.attrs.get("State", {}).get("OOMKilled"):
                self.notes.append(f"memory limit exceeded ({self.limits.memory_mb} MB)")
        finally:
            if forwarder is not None:
                forwarder.kill()
                forwarder.wait()
            with contextlib.suppress(Exception):
                (self.jobdir / "run" / "ready").unlink()
            with contextlib.suppress(docker.errors.APIError):
                container.remove(force=True)
        return StepResult(
            exit_code=code, timed_out=timed_out,
            stdout=out.decode("utf-8", errors="replace"), stderr=err.decode("utf-8", errors="replace"),
        )  # fmt: skip

    def _start_forwarder(self, container) -> subprocess.Popen:
        container.reload()
        pid = container.attrs["State"]["Pid"]
        port = self.job.network.port or 0
        sock = "proxy.sock"  # relative to the forwarder's cwd: AF_UNIX paths end at 107 bytes
        nsenter = shutil.which("nsenter")
        if not pid:  # the container is not running: say why, not what the forwarder needs
            raise InfraError(not_running(container, self.env(), "the container"))
        if not nsenter:
            raise InfraError("network proxy on docker needs nsenter (util-linux) on the host")
        if os.geteuid() != 0:
            raise InfraError(
                "network proxy on docker needs root (to enter the container's network namespace)"
            )
        if self.backend.socat:
            fwd = [
                self.backend.socat,
                f"TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr",
                f"UNIX-CONNECT:{sock}",
            ]
        else:
            fwd = [sys.executable, "-c", _forward.PY_FORWARDER, str(port), sock]
        proc = subprocess.Popen([nsenter, "-t", str(pid), "-n", *fwd], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True,
                                cwd=self.jobdir / "run")  # fmt: skip
        needle = f":{port:04X} 00000000:0000 0A"
        for _ in range(500):
            with contextlib.suppress(OSError):
                if needle in Path(f"/proc/{pid}/net/tcp").read_text():
                    break
            if proc.poll() is not None:
                raise InfraError("the proxy forwarder exited at start")
            time.sleep(0.005)
        else:
            proc.kill()
            raise InfraError("the proxy forwarder did not start listening")
        (self.jobdir / "run" / "ready").write_text("")
        return proc

    async def stop(self) -> None:
        if self.forwarder is not None:
            self.forwarder.kill()
            self.forwarder.wait()
            self.forwarder = None
        if self.container is not None:
            await asyncio.to_thread(self._remove_container)
        if self.services is not None:  # after the trial container, which is on their network
            await asyncio.to_thread(self.services.remove)
            self.services = None
        if self.relay is not None:
            await self.relay.close()
            self.relay = None

    def _remove_container(self) -> None:
        import docker.errors

        with contextlib.suppress(docker.errors.APIError):
            assert self.container is not None
            self.container.remove(force=True)
        self.container = None


def _kill_tree(pid: int) -> None:
    """SIGKILL a host process and its descendants (an exec'd step of a trial container)."""
    if pid <= 0:
        return
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(f"/proc/{d}/stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(d))
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        seen.append(p)
        todo += children.get(p, [])
    for p in seen:
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)


def _unix_engine_unreachable() -> str | None:
    """Why the engine's unix socket (DOCKER_HOST, else the SDK's default) takes no connection,
    probed with a socket closed here; None when it does, or when the host is not a unix socket."""
    import docker.constants

    host = os.environ.get("DOCKER_HOST") or docker.constants.DEFAULT_UNIX_SOCKET
    scheme, sep, path = host.partition("://")
    if not sep or not scheme.endswith("unix"):
        return None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(path)
    except OSError as exc:
        return f"no docker engine answers at {host} ({exc.strerror or exc})"
    return None


class DockerBackend(Backend):
    name = "docker"
    isolates = True
    builds_images = True
    runs_services = True

    def __init__(
        self, *, default_image: str | None = None, uid: int = 65534, gid: int = 65534,
        default_limits: Limits = DEFAULT_LIMITS,
    ) -> None:  # fmt: skip
        self.default_image = default_image or os.environ.get("CLAW_SANDBOX_IMAGE")
        self.default_limits = default_limits
        self.owner = (uid, gid) if os.geteuid() == 0 else None
        self.socat = shutil.which("socat")
        self._client = None
        self._swept = False
        self._sweep_lock = threading.Lock()

    def sweep_services(self) -> None:
        """Once per backend: remove the services and networks killed runners left behind."""
        with self._sweep_lock:
            if not self._swept:
                self._swept = True
                sweep_services(self.client())

    def client(self):
        if self._client is None:
            import docker

            self._client = docker.from_env(timeout=60)
        return self._client

    def unavailable(self) -> str | None:
        try:
            import docker  # noqa: F401
        except ImportError:
            return "the docker SDK is not installed (pip install 'claw-sandbox[docker]')"
        reason = _unix_engine_unreachable()
        if reason:
            return reason
        # when the SDK's connect fails it leaves its socket to the garbage collector (docker-py's
        # unix and TCP connections alike); it is closed here, quietly, not as a ResourceWarning
        # at some later, unrelated point
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            try:
                self.client().ping()
            except Exception as exc:
                reason = f"no docker engine answers ({type(exc).__name__}: {str(exc)[:120]})"
                self._client = None
            gc.collect()
        return reason

    def check_job(self, job: Job) -> None:
        super().check_job(job)
        if not (job.image or self.default_image):
            raise JobError(
                f"job {job.job_id!r}: image: the docker backend needs an image (or CLAW_SANDBOX_IMAGE)"
            )
        for v in job.verifies():  # one container, one network namespace for the whole job
            if v.network is not None and v.network != job.network.policy:
                raise JobError(
                    f"job {job.job_id!r}: verify/network: {v.network} differs from the job's "
                    f"network ({job.network.policy}); the docker backend gives a job's steps one "
                    "network (use bwrap, or give the job that network)"
                )
        if job.services and job.network.policy == "host":
            raise JobError(
                f"job {job.job_id!r}: services: a job with services runs on their network; "
                "network policy host cannot reach them (use none or proxy)"
            )
        if job.profile == "harbor":
            for v in job.verifies():
                for p in (*v.reset, *([v.reward_file] if v.reward_file else [])):
                    if (job.place_of(p) or (None, ""))[0] is None:
                        raise JobError(
                            f"job {job.job_id!r}: verify: {p!r}: on docker a harbor job's reward "
                            "file and reset paths must lie under a mount target (the workdir is "
                            "inside the trial container, where the runner cannot clear them)"
                        )

    def sandbox(self, job: Job, jobdir: Path) -> Sandbox:
        return DockerSandbox(self, job, jobdir)
