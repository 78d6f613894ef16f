"""A job's sidecar containers on docker (claw.job/v1 ``services``, Compose's services).

The job gets a network of its own (``internal``: it reaches nothing outside, like policy
``none``); each service runs on it with its name as host name and network alias, so the job's
containers, which join the same network, reach ``db:5432`` as they would under Compose. Services
start in order; one with a healthcheck (Docker's own, run by the engine) must be healthy before
the next starts, one without must be running. Everything is labelled with the runner that made
it (``claw-sandbox.runner``: host name and pid), so a later runner removes what a killed one left.

An ``internal`` network still routes to the host: its gateway is the host's address on the bridge,
and through it docker0's and every other host address answer (anything listening on 0.0.0.0).
So the job's bridge gets a name of ours (``claw`` + 11 hex digits) and, before any container
joins it, an INPUT rule that rejects every packet arriving from it (IPv4, and IPv6 where
``ip6tables`` is present): the containers on it reach each other (bridged, never INPUT) and
nothing of the host's. That takes root and iptables on the engine's own host (a local engine).
Services run confined like their job (:func:`JobServices` ``confine``: capabilities, read-only
root, limits).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import time
import uuid
from typing import Any

from claw_sandbox._proc import pid_alive
from claw_sandbox.errors import InfraError, JobError
from claw_sandbox.records import Healthcheck, Job, Service

#: label on every service container and job network: ``<host name>:<runner pid>``
RUNNER_LABEL = "claw-sandbox.runner"
JOB_LABEL = "claw-sandbox.job"
POLL_S = 0.2
#: the job networks' bridge interfaces: ``claw`` and 11 hex digits (IFNAMSIZ allows 15)
BRIDGE_PREFIX = "claw"
_BRIDGE = re.compile(r"-i (claw[0-9a-f]{11})(?: |$)", re.MULTILINE)


def firewall_tools() -> list[str]:
    """The iptables programs that fence a job's bridge off from the host (ip6tables where
    present); raises InfraError naming what is missing (root, iptables)."""
    if os.geteuid() != 0:
        raise InfraError(
            "sidecars on docker need root: the job's network is firewalled from the host "
            "(iptables), or its containers would reach every host service on 0.0.0.0"
        )
    v4 = shutil.which("iptables")
    if not v4:
        raise InfraError(
            "sidecars on docker need iptables on the host: the job's network is firewalled from "
            "the host, or its containers would reach every host service on 0.0.0.0"
        )
    v6 = shutil.which("ip6tables")
    return [v4, v6] if v6 and os.path.exists("/proc/net/if_inet6") else [v4]


def _iptables(tool: str, op: str, bridge: str) -> subprocess.CompletedProcess:
    """Insert (-I), check (-C) or delete (-D) the rule that rejects what `bridge` sends the host."""
    rule = ["INPUT", "-i", bridge, "-j", "REJECT"]
    return subprocess.run([tool, "-w", op, *rule], capture_output=True, text=True)


def fence(bridge: str) -> None:
    """Reject every packet from `bridge` to any address of the host (INPUT, first rule)."""
    for tool in firewall_tools():
        r = _iptables(tool, "-I", bridge)
        if r.returncode != 0 or _iptables(tool, "-C", bridge).returncode != 0:
            unfence(bridge)
            raise InfraError(
                f"could not firewall the job's network {bridge} from the host: "
                f"{os.path.basename(tool)} -I INPUT: {r.stderr.strip()[-300:]}"
            )


def unfence(bridge: str) -> None:
    """Remove the rules :func:`fence` inserted for `bridge` (every copy; none is fine)."""
    for tool in (shutil.which("iptables"), shutil.which("ip6tables")):
        for _ in range(100):
            if not tool or _iptables(tool, "-D", bridge).returncode != 0:
                break


def runner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _health(hc: Healthcheck) -> dict[str, Any]:
    """The engine's healthcheck config (durations in nanoseconds)."""
    test = ["CMD-SHELL", hc.command] if isinstance(hc.command, str) else ["CMD", *hc.command]
    return {
        "test": test,
        "interval": int(hc.interval_s * 1e9),
        "timeout": int(hc.timeout_s * 1e9),
        "retries": hc.retries,
        "start_period": int(hc.start_period_s * 1e9),
    }


def _argv(command: Any) -> list[str] | None:
    if command is None:
        return None
    return ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)


class JobServices:
    """The network and service containers of one job; :meth:`remove` takes them all down."""

    def __init__(self, client: Any, job: Job, confine: dict[str, Any] | None = None) -> None:
        self.client = client
        self.job = job
        self.confine = dict(confine or {})  # container settings every service gets
        self.bridge = ""  # the network's bridge interface, fenced off from the host
        self.labels = {RUNNER_LABEL: runner_id(), JOB_LABEL: job.job_id[:200]}
        self.network: Any = None
        self.containers: list[Any] = []

    @property
    def network_name(self) -> str:
        assert self.network is not None
        return self.network.name

    def start(self, deadline: float) -> None:
        """Create the network, then start each service and wait until it is ready (healthy, or
        running when it has no healthcheck), all before ``deadline`` (time.monotonic)."""
        import docker.errors

        firewall_tools()  # root and iptables, before anything is made
        key = uuid.uuid4().hex
        bridge = BRIDGE_PREFIX + key[:11]
        try:
            self.network = self.client.networks.create(
                f"claw-{key[:16]}", driver="bridge", internal=True, labels=self.labels,
                options={"com.docker.network.bridge.name": bridge},
            )  # fmt: skip
        except docker.errors.APIError as exc:
            raise InfraError(f"docker could not create the job's network: {exc}") from exc
        self.bridge = bridge
        fence(bridge)  # before any container joins it
        for svc in self.job.services:
            self._ready(self._start_one(svc), svc, deadline)

    def _start_one(self, svc: Service) -> Any:
        import docker.errors

        api = self.client.api
        config: dict[str, Any] = {
            "image": svc.image, "command": _argv(svc.command), "environment": dict(svc.env),
            "hostname": svc.name, "labels": self.labels,
            "network": self.network_name,
            "networking_config": {
                self.network_name: api.create_endpoint_config(aliases=[svc.name])
            },
        }  # fmt: skip
        if svc.healthcheck is not None:
            config["healthcheck"] = _health(svc.healthcheck)
        config.update(self.confine)
        try:
            container = self.client.containers.create(**config)  # create never pulls
        except docker.errors.ImageNotFound:
            raise JobError(
                f"job {self.job.job_id!r}: services: {svc.name}: image {svc.image!r} not found "
                "(build or pull it first)"
            ) from None
        except docker.errors.APIError as exc:
            raise InfraError(f"docker could not create service {svc.name}: {exc}") from exc
        self.containers.append(container)
        try:
            container.start()
        except docker.errors.APIError as exc:
            raise InfraError(f"docker could not start service {svc.name}: {exc}") from exc
        return container

    def _ready(self, container: Any, svc: Service, deadline: float) -> None:
        while True:
            container.reload()
            state = container.attrs.get("State", {})
            if state.get("Status") != "running":
                raise InfraError(not_running(container, dict(svc.env), f"service {svc.name}"))
            health = (state.get("Health") or {}).get("Status")
            if svc.healthcheck is None or health == "healthy":
                return
            if health == "unhealthy":
                log = (state.get("Health") or {}).get("Log") or [{}]
                out = str(log[-1].get("Output", "")).strip()[-300:]
                raise InfraError(
                    f"service {svc.name} is unhealthy: its healthcheck failed "
                    f"{svc.healthcheck.retries} times (last output: {out!r})"
                )
            if time.monotonic() > deadline:
                raise InfraError(
                    f"service {svc.name} was not healthy within the job's timeout "
                    f"({self.job.timeout_s:g}s)"
                )
            time.sleep(POLL_S)

    def remove(self) -> None:
        """Remove every service container (killed) and the network; errors are ignored (what is
        left carries the runner's label for the next sweep)."""
        import docker.errors

        for c in reversed(self.containers):
            with contextlib.suppress(docker.errors.APIError):
                c.remove(force=True)
        self.containers.clear()
        if self.network is not None:
            with contextlib.suppress(docker.errors.APIError):
                self.network.remove()
            self.network = None
        if self.bridge:  # after the network: no container is left on the bridge
            unfence(self.bridge)
            self.bridge = ""


def _dead_runner(labels: dict[str, str] | None) -> bool:
    """True when the label names a runner on this host that no longer runs."""
    host, _, pid = (labels or {}).get(RUNNER_LABEL, "").rpartition(":")
    return host == socket.gethostname() and pid.isdigit() and not pid_alive(int(pid))


def sweep_services(client: Any) -> int:
    """Remove the service containers and job networks that runners on this host left when they
    were killed, then the firewall rules of bridges that no longer exist; returns how many
    containers and networks were removed."""
    import docker.errors

    removed = 0
    found = client.containers.list(all=True, filters={"label": RUNNER_LABEL})
    for c in found:
        if _dead_runner(c.labels):
            with contextlib.suppress(docker.errors.APIError):
                c.remove(force=True)
                removed += 1
    for n in client.networks.list(filters={"label": RUNNER_LABEL}):
        if _dead_runner(n.attrs.get("Labels")):
            with contextlib.suppress(docker.errors.APIError):
                n.remove()
                removed += 1
    for bridge in _fenced_bridges():
        if not os.path.exists(f"/sys/class/net/{bridge}"):
            unfence(bridge)
    return removed


def _fenced_bridges() -> set[str]:
    """The job bridges that INPUT rules name (iptables -S, as far as this runner may read it)."""
    found: set[str] = set()
    for tool in (shutil.which("iptables"), shutil.which("ip6tables")):
        if tool and os.geteuid() == 0:
            out = subprocess.run([tool, "-w", "-S", "INPUT"], capture_output=True, text=True)
            found.update(m.group(1) for m in _BRIDGE.finditer(out.stdout))
    return found


#: how many of a container's last log lines an error about it quotes
LOG_TAIL_LINES = 5


def not_running(container: Any, env: dict[str, str], what: str) -> str:
    """Why a container that should run is not: its state, exit code, error and last log lines
    (an exit code of 126/127 also names the PATH its command was looked up in)."""
    state = container.attrs.get("State", {})
    code, error = state.get("ExitCode"), state.get("Error") or ""
    msg = f"{what} ({container.attrs.get('Config', {}).get('Image', '?')}) is not running "
    msg += f"(state {state.get('Status', '?')}, exit code {code}"
    msg += (f", {error}" if error else "") + (", out of memory" if state.get("OOMKilled") else "")
    msg += ")"
    if code in (126, 127):
        msg += f"; its command was not found or not executable with PATH={env.get('PATH', '')!r}"
    try:
        raw = container.logs(stdout=True, stderr=True, tail=LOG_TAIL_LINES)
    except Exception as exc:  # the SDK's and requests' errors alike: the message still stands
        return msg + f"; its log could not be read: {exc}"
    lines = raw.decode("utf-8", errors="replace").strip().splitlines()
    return msg + ("; its last log lines: " + " | ".join(lines) if lines else "; its log is empty")
