"""The records this package reads (`claw.job/v1`) and writes (`claw.run/v1`), and their JSONL I/O.

Readers reject unknown schema versions and malformed lines with the file name, line number and
field; a bad job line never stops the other jobs (see :func:`read_jobs`).

Reader kinds (docs/formats.md, Readers; held to formats/conformance by tests/test_conformance.py):
:func:`read_jobs` / :meth:`Job.from_dict` are *strict* (every field of `claw.job/v1` is
validated); :func:`read_runs` (resume) is a *projection* of `RUN_READS`. Both accept fields they
do not know (at any depth), skip blank lines and reject ``NaN`` / ``Infinity`` (not JSON).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import IO, Any

import attrs

from claw_sandbox.errors import JobError, JobsFileError

JOB_SCHEMA = "claw.job/v1"
RUN_SCHEMA = "claw.run/v1"
STATUSES = ("ok", "timeout", "error", "infra_error")
RUN_READS = ("schema", "job_id", "status")  # what read_runs validates (resume, --retry-errors)
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_VERIFY_TIMEOUT_S = 300.0
DEFAULT_OUTPUT_BYTES = 65536
DEFAULT_COLLECT_FILES = 1000  # files one job's `collect` returns, at most
DEFAULT_COLLECT_BYTES = 8 << 20  # bytes one job's `collect` returns in all, at most

Command = str | tuple[str, ...]


def _fail(where: str, field: str, msg: str) -> JobError:
    return JobError(f"{where}: {field}: {msg}")


def _get(d: dict, key: str, types: type | tuple, where: str, field: str, default: Any = None):
    value = d.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise _fail(where, field, f"expected {_typename(types)}, got a boolean")
    if not isinstance(value, types):
        raise _fail(where, field, f"expected {_typename(types)}, got {type(value).__name__}")
    return value


def _typename(types: type | tuple) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(t.__name__ for t in types)


def check_relpath(path: str, where: str, field: str) -> str:
    """A workspace-relative path: not absolute, no `..` component, not empty."""
    p = PurePosixPath(path)
    if not path or p.is_absolute() or ".." in p.parts or "\x00" in path:
        raise _fail(where, field, f"path {path!r} escapes the workspace (absolute or `..`)")
    return path


#: places a job's own directories (workdir, mounts) may not be: the system the sandbox lends
RESERVED_ROOTS = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/proc",
    "/dev",
    "/sys",
    "/run",
    "/tmp",
)
PROFILES = ("claw", "harbor")


def check_abspath(path: Any, where: str, field: str) -> str:
    """An absolute, normalised path inside the sandbox that is not / nor a system directory."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise _fail(where, field, f"expected an absolute path, got {path!r}")
    p = PurePosixPath(path)
    if str(p) != path or ".." in p.parts or "\x00" in path or path == "/":
        raise _fail(where, field, f"path {path!r} is not a normalised absolute path below /")
    if any(path == r or path.startswith(r + "/") for r in RESERVED_ROOTS):
        raise _fail(where, field, f"path {path!r} is a system directory of the sandbox")
    return path


def is_under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


@attrs.frozen(kw_only=True)
class Mount:
    """A writable directory of the job's own at an absolute place (`target`), holding `files`."""

    target: str
    files: dict[str, str | bytes] = attrs.field(factory=dict)

    @classmethod
    def list_from(cls, value: Any, where: str, field: str) -> tuple[Mount, ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            raise _fail(where, field, "expected a list of {target, files}")
        out = []
        for i, m in enumerate(value):
            if not isinstance(m, dict):
                raise _fail(where, f"{field}/{i}", "expected an object {target, files}")
            target = check_abspath(m.get("target"), where, f"{field}/{i}/target")
            out.append(
                cls(target=target, files=_files(m.get("files"), where, f"{field}/{i}/files"))
            )
        return tuple(out)

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"target": self.target}
        if self.files:
            d["files"] = _files_out(self.files)
        return d


def _command(value: Any, where: str, field: str) -> Command:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, list) and value and all(isinstance(x, str) for x in value):
        return tuple(value)
    raise _fail(where, field, "expected a non-empty string (run by bash -c) or a list of strings")


def _files(value: Any, where: str, field: str) -> dict[str, str | bytes]:
    """{path: UTF-8 text, or {"content_b64": base64} for bytes kept exact (binary files)}."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(where, field, "expected an object {relative path: text}")
    out: dict[str, str | bytes] = {}
    for k, v in value.items():
        check_relpath(k, where, f"{field}/{k}")
        if isinstance(v, dict):
            b64 = v.get("content_b64")
            if not isinstance(b64, str):  # other keys of the entry are ignored (additive fields)
                msg = 'expected a string or {"content_b64": "<base64>"}'
                raise _fail(where, f"{field}/{k}", msg)
            try:
                out[k] = base64.b64decode(b64, validate=True)
            except binascii.Error as exc:
                raise _fail(where, f"{field}/{k}/content_b64", f"not base64: {exc}") from None
        elif isinstance(v, str):
            out[k] = v
        else:
            raise _fail(where, f"{field}/{k}", "file content must be a string")
    return out


def _files_out(files: dict[str, str | bytes]) -> dict[str, Any]:
    return {
        k: v if isinstance(v, str) else {"content_b64": base64.b64encode(v).decode("ascii")}
        for k, v in files.items()
    }


@attrs.frozen(kw_only=True)
class Limits:
    """Resource limits; None means the backend's default (see the package README)."""

    memory_mb: int | None = None
    pids: int | None = None
    cpus: float | None = None
    disk_mb: int | None = None
    output_bytes: int = DEFAULT_OUTPUT_BYTES
    collect_files: int = DEFAULT_COLLECT_FILES
    collect_bytes: int = DEFAULT_COLLECT_BYTES

    @classmethod
    def from_dict(cls, d: dict, where: str = "job") -> Limits:
        out: dict[str, Any] = {}
        for key, typ in (
            ("memory_mb", int),
            ("pids", int),
            ("cpus", (int, float)),
            ("disk_mb", int),
            ("output_bytes", int),
            ("collect_files", int),
            ("collect_bytes", int),
        ):
            v = _get(d, key, typ, where, f"limits/{key}")
            if v is not None:
                if v < (0 if key in ("output_bytes", "collect_files", "collect_bytes") else 1e-9):
                    raise _fail(where, f"limits/{key}", f"must be positive, got {v}")
                out[key] = float(v) if key == "cpus" else v
        return cls(**out)

    def any(self) -> bool:
        return any(v is not None for v in (self.memory_mb, self.pids, self.cpus, self.disk_mb))

    def bounds(self) -> dict[str, int | float]:
        """The resource bounds that are set (memory_mb, pids, cpus, disk_mb), for a run record."""
        keys = ("memory_mb", "pids", "cpus", "disk_mb")
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}


@attrs.frozen(kw_only=True)
class Network:
    """Network policy: `none`, `proxy` (only proxy_url, seen inside at 127.0.0.1:port) or `host`."""

    policy: str = "none"
    proxy_url: str | None = None
    port: int | None = None

    @classmethod
    def from_dict(cls, d: dict, where: str = "job") -> Network:
        policy = d.get("policy")
        if policy not in ("none", "proxy", "host"):
            raise _fail(where, "network/policy", f"expected none, proxy or host, got {policy!r}")
        proxy_url = _get(d, "proxy_url", str, where, "network/proxy_url")
        port = _get(d, "port", int, where, "network/port")
        if port is not None and not 1 <= port <= 65535:
            raise _fail(where, "network/port", f"not a port number: {port}")
        if policy == "proxy":
            if not proxy_url:
                raise _fail(where, "network/proxy_url", "policy proxy needs proxy_url")
            host, pport = parse_http_url(proxy_url, where)
            port = port or pport
        return cls(policy=policy, proxy_url=proxy_url, port=port)


def parse_http_url(url: str, where: str = "job") -> tuple[str, int]:
    """(host, port) of an http:// URL."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _fail(where, "network/proxy_url", f"expected http://HOST:PORT, got {url!r}")
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


@attrs.frozen(kw_only=True)
class Verify:
    """The verify step: run after the command, with hidden files placed first."""

    command: Command
    timeout_s: float = DEFAULT_VERIFY_TIMEOUT_S
    files: dict[str, str | bytes] = attrs.field(factory=dict)
    copy_from: str | None = None
    reward_file: str | None = None
    mounts: tuple[Mount, ...] = ()  # emptied and filled only at verify time
    #: directories the verifier owns: emptied by the runner before the verify step
    reset: tuple[str, ...] = ()
    #: the verify step's own network policy (``none`` or ``host``); None: the job's
    network: str | None = None

    @classmethod
    def from_dict(cls, d: dict, where: str = "job") -> Verify:
        if "command" not in d:
            raise _fail(where, "verify/command", "missing required field")
        timeout = _get(
            d, "timeout_s", (int, float), where, "verify/timeout_s", DEFAULT_VERIFY_TIMEOUT_S
        )
        if timeout <= 0:
            raise _fail(where, "verify/timeout_s", "must be > 0")
        reward_file = _get(d, "reward_file", str, where, "verify/reward_file")
        if reward_file is not None and not reward_file.startswith("/"):
            check_relpath(reward_file, where, "verify/reward_file")
        reset = _get(d, "reset", list, where, "verify/reset", [])
        for i, p in enumerate(reset):
            if not isinstance(p, str):
                raise _fail(where, f"verify/reset/{i}", f"expected a path, got {p!r}")
            if not p.startswith("/"):
                check_relpath(p, where, f"verify/reset/{i}")
                if not [c for c in PurePosixPath(p).parts if c != "."]:
                    raise _fail(where, f"verify/reset/{i}", "the workspace itself cannot be reset")
        return cls(
            command=_command(d["command"], where, "verify/command"),
            timeout_s=float(timeout),
            files=_files(d.get("files"), where, "verify/files"),
            copy_from=_get(d, "copy_from", str, where, "verify/copy_from"),
            reward_file=reward_file,
            mounts=Mount.list_from(d.get("mounts"), where, "verify/mounts"),
            reset=tuple(reset),
            network=_verify_network(d, where),
        )


def _verify_network(d: dict, where: str) -> str | None:
    """verify.network: ``{"policy": "none" | "host"}`` or absent (the job's network)."""
    net = _get(d, "network", dict, where, "verify/network")
    if net is None:
        return None
    if net.get("policy") not in ("none", "host") or set(net) != {"policy"}:
        raise _fail(
            where,
            "verify/network",
            f'expected {{"policy": "none"}} or {{"policy": "host"}}, got {net!r}',
        )
    return str(net["policy"])


def _min_reward(value: Any, where: str, field: str) -> float | dict[str, float] | None:
    """A step's gate: a number (on the step's ``reward``) or {key: number} (each key)."""
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if (
        isinstance(value, dict)
        and value
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value.values())
    ):
        return {str(k): float(v) for k, v in value.items()}
    raise _fail(where, field, f"expected a number or an object of numbers, got {value!r}")


@attrs.frozen(kw_only=True)
class Step:
    """One of a job's `steps`: run in order in the job's one sandbox, each with its own files,
    setup, command and (optional) verify; `min_reward` stops the steps after a low reward."""

    name: str
    command: Command
    timeout_s: float = DEFAULT_TIMEOUT_S
    files: dict[str, str | bytes] = attrs.field(factory=dict)  # into the workspace, at its start
    setup: tuple[Command, ...] = ()  # before the command; a failure ends the job as an error
    mounts: tuple[Mount, ...] = ()  # refills targets of the job's `mounts` at the step's start
    verify: Verify | None = None
    min_reward: float | dict[str, float] | None = None

    @classmethod
    def from_dict(cls, d: Any, where: str, field: str, default_timeout: float) -> Step:
        if not isinstance(d, dict):
            raise _fail(where, field, "expected an object {name, command, ...}")
        name = d.get("name")
        if not isinstance(name, str) or not name:
            raise _fail(where, f"{field}/name", "missing required field (a non-empty string)")
        if "command" not in d:
            raise _fail(where, f"{field}/command", "missing required field")
        timeout = _get(d, "timeout_s", (int, float), where, f"{field}/timeout_s", default_timeout)
        if timeout <= 0:
            raise _fail(where, f"{field}/timeout_s", "must be > 0")
        setup = _get(d, "setup", list, where, f"{field}/setup", [])
        verify = d.get("verify")
        if verify is not None and not isinstance(verify, dict):
            raise _fail(where, f"{field}/verify", "expected an object or null")
        try:
            verify_rec = Verify.from_dict(verify, where) if verify is not None else None
        except JobError as exc:  # name the step in the field path
            raise JobError(str(exc).replace(": verify/", f": {field}/verify/", 1)) from None
        return cls(
            name=name,
            command=_command(d["command"], where, f"{field}/command"),
            timeout_s=float(timeout),
            files=_files(d.get("files"), where, f"{field}/files"),
            setup=tuple(_command(c, where, f"{field}/setup/{i}") for i, c in enumerate(setup)),
            mounts=Mount.list_from(d.get("mounts"), where, f"{field}/mounts"),
            verify=verify_rec,
            min_reward=_min_reward(d.get("min_reward"), where, f"{field}/min_reward"),
        )

    def to_dict(self) -> dict:
        d: dict[str, Any] = {
            "name": self.name,
            "command": list(self.command) if isinstance(self.command, tuple) else self.command,
            "timeout_s": self.timeout_s,
        }
        if self.files:
            d["files"] = _files_out(self.files)
        if self.setup:
            d["setup"] = [list(c) if isinstance(c, tuple) else c for c in self.setup]
        if self.mounts:
            d["mounts"] = [m.to_dict() for m in self.mounts]
        if self.verify is not None:
            d["verify"] = _verify_out(self.verify)
        if self.min_reward is not None:
            d["min_reward"] = self.min_reward
        return d


def _verify_out(verify: Verify) -> dict:
    v = {
        k: val
        for k, val in attrs.asdict(verify).items()
        if val not in (None, {}, (), []) and k not in ("mounts", "reset", "network")
    }
    if isinstance(verify.command, tuple):
        v["command"] = list(verify.command)
    if verify.files:
        v["files"] = _files_out(verify.files)
    if verify.mounts:
        v["mounts"] = [m.to_dict() for m in verify.mounts]
    if verify.reset:
        v["reset"] = list(verify.reset)
    if verify.network is not None:
        v["network"] = {"policy": verify.network}
    return v


_SERVICE_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")


@attrs.frozen(kw_only=True)
class Healthcheck:
    """A service's readiness probe: ``command`` run inside the service until it exits 0, every
    ``interval_s``, at most ``retries`` times (Compose's healthcheck)."""

    command: Command
    interval_s: float = 1.0
    timeout_s: float = 30.0
    retries: int = 30
    start_period_s: float = 0.0

    @classmethod
    def from_dict(cls, d: Any, where: str, field: str) -> Healthcheck:
        if not isinstance(d, dict):
            raise _fail(where, field, "expected an object")
        if "command" not in d:
            raise _fail(where, f"{field}/command", "missing required field")
        out: dict[str, Any] = {"command": _command(d["command"], where, f"{field}/command")}
        for key in ("interval_s", "timeout_s", "start_period_s"):
            v = _get(d, key, (int, float), where, f"{field}/{key}")
            if v is not None:
                if v < 0 or (v == 0 and key != "start_period_s"):
                    raise _fail(where, f"{field}/{key}", f"must be positive, got {v}")
                out[key] = float(v)
        retries = _get(d, "retries", int, where, f"{field}/retries")
        if retries is not None:
            if retries < 1:
                raise _fail(where, f"{field}/retries", f"must be at least 1, got {retries}")
            out["retries"] = retries
        return cls(**out)

    def to_dict(self) -> dict:
        d = attrs.asdict(self)
        d["command"] = list(self.command) if isinstance(self.command, tuple) else self.command
        return d


@attrs.frozen(kw_only=True)
class Service:
    """A sidecar container started next to the job (Compose's services): reachable from the job
    by ``name``; started in order, each healthy (when it has a healthcheck) before the next."""

    name: str
    image: str
    env: dict[str, str] = attrs.field(factory=dict)
    command: Command | None = None  # None: the image's own CMD
    healthcheck: Healthcheck | None = None

    @classmethod
    def list_from(cls, value: Any, where: str) -> tuple[Service, ...]:
        if value is None:
            return ()
        if not isinstance(value, list):
            raise _fail(where, "services", "expected a list of service objects")
        out = tuple(cls.from_dict(s, where, f"services/{i}") for i, s in enumerate(value))
        names = [s.name for s in out]
        if len(set(names)) != len(names):
            raise _fail(where, "services", f"service names repeat: {names}")
        return out

    @classmethod
    def from_dict(cls, d: Any, where: str, field: str) -> Service:
        if not isinstance(d, dict):
            raise _fail(where, field, "expected an object")
        name = d.get("name")
        if not isinstance(name, str) or not _SERVICE_NAME.match(name):
            raise _fail(where, f"{field}/name", f"expected a host name ([a-z0-9_.-]), got {name!r}")
        image = d.get("image")
        if not isinstance(image, str) or not image:
            raise _fail(where, f"{field}/image", "missing required field (a non-empty string)")
        env = _get(d, "env", dict, where, f"{field}/env", {})
        for k, v in env.items():
            if not isinstance(v, str):
                raise _fail(where, f"{field}/env/{k}", "environment values must be strings")
        command, hc = d.get("command"), d.get("healthcheck")
        health = None if hc is None else Healthcheck.from_dict(hc, where, f"{field}/healthcheck")
        return cls(
            name=name,
            image=image,
            env=dict(env),
            command=None if command is None else _command(command, where, f"{field}/command"),
            healthcheck=health,
        )

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"name": self.name, "image": self.image}
        if self.env:
            d["env"] = dict(self.env)
        if self.command is not None:
            d["command"] = list(self.command) if isinstance(self.command, tuple) else self.command
        if self.healthcheck is not None:
            d["healthcheck"] = self.healthcheck.to_dict()
        return d


_JOB_FIELDS = {
    "schema", "job_id", "workspace", "image", "setup", "command", "env", "timeout_s",
    "limits", "network", "verify", "collect", "keep", "meta", "workdir", "profile", "mounts",
    "image_run", "image_env", "steps", "services",
}  # fmt: skip


@attrs.frozen(kw_only=True)
class Job:
    """One `claw.job/v1` record."""

    job_id: str
    command: Command
    files: dict[str, str | bytes] = attrs.field(factory=dict)
    copy_from: str | None = None
    image: str | None = None
    setup: tuple[Command, ...] = ()
    env: dict[str, str] = attrs.field(factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S
    limits: Limits = attrs.field(factory=Limits)
    network: Network = attrs.field(factory=Network)
    verify: Verify | None = None
    collect: tuple[str, ...] = ()
    keep: str = "never"
    meta: dict = attrs.field(factory=dict)
    #: where the workspace is inside the sandbox, and the steps' cwd (None: the backend's /workspace)
    workdir: str | None = None
    #: "claw" (claw's strict sandbox) or "harbor" (Harbor's execution model: uid 0 inside, one
    #: environment for every step, a writable container filesystem on docker)
    profile: str = "claw"
    mounts: tuple[Mount, ...] = ()  # filled before setup, kept through verify
    image_run: tuple[
        str, ...
    ] = ()  # the image's RUN lines: a backend that does not build it skips them
    #: the image's ENV (expanded): a backend that runs no image sets it under `env`
    image_env: dict[str, str] = attrs.field(factory=dict)

    #: run in order in place of `command` (after `setup`); `verify` then runs after the last
    steps: tuple[Step, ...] = ()
    #: sidecar containers reachable by name while the job runs (docker backend only)
    services: tuple[Service, ...] = ()

    def verifies(self) -> tuple[Verify, ...]:
        """Every verify of the job: each step's, then the job's own."""
        own = (self.verify,) if self.verify else ()
        return (*(s.verify for s in self.steps if s.verify), *own)

    def mount_targets(self) -> tuple[str, ...]:
        """Every distinct mount target: the job's and its steps' mounts first, then the verify
        mounts' (a target named twice is one directory)."""
        ms = [*self.mounts, *(m for s in self.steps for m in s.mounts)]
        ms += [m for v in self.verifies() for m in v.mounts]
        return tuple(dict.fromkeys(m.target for m in ms))

    def verify_only_targets(self) -> frozenset[str]:
        """Mount targets that only verify steps see (absent while the command runs)."""
        agent = {m.target for m in (*self.mounts, *(m for s in self.steps for m in s.mounts))}
        return frozenset(t for t in self.mount_targets() if t not in agent)

    def place_of(self, path: str) -> tuple[int | None, str] | None:
        """Where an absolute path lives: (None, rel) in the workdir, (i, rel) in the i-th of
        mounts + verify mounts; None when in neither. A relative path is in the workspace."""
        if not path.startswith("/"):
            return None, path
        if self.workdir and is_under(path, self.workdir):
            return None, path[len(self.workdir) :].lstrip("/")
        for i, t in enumerate(self.mount_targets()):
            if is_under(path, t):
                return i, path[len(t) :].lstrip("/")
        return None

    @classmethod
    def from_dict(cls, d: Any, where: str = "job", base_dir: Path | None = None) -> Job:
        """Validate one job object; raise JobError naming `where` (file:line) and the field.

        Relative `copy_from` paths are resolved against `base_dir` (default: the current dir).
        """
        job_id = _job_id(d, where)
        where = f"{where}: job {job_id!r}"
        if "command" not in d:
            raise _fail(where, "command", "missing required field")
        ws = _get(d, "workspace", dict, where, "workspace", {})
        env, image_env = _job_envs(d, where)
        timeout = _get(d, "timeout_s", (int, float), where, "timeout_s", DEFAULT_TIMEOUT_S)
        if timeout <= 0:
            raise _fail(where, "timeout_s", "must be > 0")
        setup = _get(d, "setup", list, where, "setup", [])
        collect = _job_collect(d, where)
        workdir = d.get("workdir")
        if workdir is not None:
            check_abspath(workdir, where, "workdir")
        profile = d.get("profile") or "claw"
        if profile not in PROFILES:
            raise _fail(where, "profile", f"expected one of {PROFILES}, got {profile!r}")
        image_run = _get(d, "image_run", list, where, "image_run", [])
        if not all(isinstance(x, str) for x in image_run):
            raise _fail(where, "image_run", "expected a list of strings")
        mounts = Mount.list_from(d.get("mounts"), where, "mounts")
        keep = d.get("keep") or "never"
        if keep not in ("never", "failed", "always"):
            raise _fail(where, "keep", f"expected never, failed or always, got {keep!r}")
        base = base_dir or Path.cwd()
        copy_from = _get(ws, "copy_from", str, where, "workspace/copy_from")
        verify_rec = _job_verify(d.get("verify"), where, base)
        steps = _job_steps(d, where, float(timeout), mounts)
        _check_overlaps(where, mounts, verify_rec, steps, workdir)
        return cls(
            job_id=job_id,
            command=_command(d["command"], where, "command"),
            files=_files(ws.get("files"), where, "workspace/files"),
            copy_from=str(base / copy_from) if copy_from else None,
            image=_get(d, "image", str, where, "image"),
            setup=tuple(_command(c, where, f"setup/{i}") for i, c in enumerate(setup)),
            env=dict(env),
            timeout_s=float(timeout),
            limits=Limits.from_dict(_get(d, "limits", dict, where, "limits", {}), where),
            network=Network.from_dict(
                _get(d, "network", dict, where, "network", {"policy": "none"}), where
            ),
            verify=verify_rec,
            collect=tuple(collect),
            keep=keep,
            meta=dict(_get(d, "meta", dict, where, "meta", {})),
            workdir=workdir,
            profile=profile,
            mounts=mounts,
            image_run=tuple(image_run),
            image_env=dict(image_env),
            steps=steps,
            services=Service.list_from(d.get("services"), where),
        )._check_places(where)

    def _check_places(self, where: str) -> Job:
        """Absolute collect globs, reward files and reset paths must lie in the workdir or a
        mount; a reset path is not the workdir itself."""
        paths = [(f"collect/{i}", g) for i, g in enumerate(self.collect)]
        verifies = [("verify", self.verify)]
        verifies += [(f"steps/{i}/verify", s.verify) for i, s in enumerate(self.steps)]
        for field, v in verifies:
            if v is not None and v.reward_file:
                paths.append((f"{field}/reward_file", v.reward_file))
            if v is not None:
                paths += [(f"{field}/reset/{k}", p) for k, p in enumerate(v.reset)]
        for field, p in paths:
            place = self.place_of(p) if p.startswith("/") else (None, p)
            if place is None:
                raise _fail(
                    where, field, f"{p!r} is neither under workdir nor under a mount target"
                )
            if "/reset/" in field and place == (None, ""):
                raise _fail(where, field, f"{p!r}: the workdir itself cannot be reset")
        return self

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"schema": JOB_SCHEMA, "job_id": self.job_id}
        ws: dict[str, Any] = {}
        if self.files:
            ws["files"] = _files_out(self.files)
        if self.copy_from:
            ws["copy_from"] = self.copy_from
        if ws:
            d["workspace"] = ws
        if self.image:
            d["image"] = self.image
        d["setup"] = [list(c) if isinstance(c, tuple) else c for c in self.setup]
        d["command"] = list(self.command) if isinstance(self.command, tuple) else self.command
        d["env"] = dict(self.env)
        d["timeout_s"] = self.timeout_s
        d["limits"] = {k: v for k, v in attrs.asdict(self.limits).items() if v is not None}
        d["network"] = {k: v for k, v in attrs.asdict(self.network).items() if v is not None}
        if self.verify is not None:
            d["verify"] = _verify_out(self.verify)
        d["collect"] = list(self.collect)
        d["keep"] = self.keep
        d["meta"] = dict(self.meta)
        if self.workdir:
            d["workdir"] = self.workdir
        if self.profile != "claw":
            d["profile"] = self.profile
        if self.mounts:
            d["mounts"] = [m.to_dict() for m in self.mounts]
        if self.image_run:
            d["image_run"] = list(self.image_run)
        if self.image_env:
            d["image_env"] = dict(self.image_env)
        if self.steps:
            d["steps"] = [s.to_dict() for s in self.steps]
        if self.services:
            d["services"] = [s.to_dict() for s in self.services]
        return d


@attrs.frozen(kw_only=True)
class VerifyResult:
    exit_code: int | None
    passed: bool
    reward: float | None
    details: dict = attrs.field(factory=dict)
    output: str = ""
    timed_out: bool = False

    def to_dict(self) -> dict:
        return attrs.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> VerifyResult:
        return cls(
            exit_code=d.get("exit_code"), passed=bool(d.get("passed")), reward=d.get("reward"),
            details=dict(d.get("details") or {}), output=d.get("output", ""),
            timed_out=bool(d.get("timed_out", False)),
        )  # fmt: skip


@attrs.frozen(kw_only=True)
class Run:
    """One `claw.run/v1` record: a finished job."""

    job_id: str
    status: str
    started_at: float
    ended_at: float
    exit_code: int | None = None
    verify: VerifyResult | None = None
    stdout_tail: str = ""
    stderr_tail: str = ""
    collected: dict[str, str] = attrs.field(factory=dict)
    backend: str = ""
    attempts: int = 1
    error: str | None = None
    meta: dict = attrs.field(factory=dict)
    limits: dict = attrs.field(factory=dict)  # the bounds enforced (job's + backend defaults)
    image_run_skipped: tuple[str, ...] = ()  # the job's image_run lines this backend did not run
    steps: tuple[dict, ...] = ()  # one {name, status, exit_code, verify, ...} per step that ran

    def to_dict(self) -> dict:
        d: dict[str, Any] = {
            "schema": RUN_SCHEMA,
            "job_id": self.job_id,
            "status": self.status,
            "exit_code": self.exit_code,
            "verify": self.verify.to_dict() if self.verify else None,
            "stdout_tail": self.stdout_tail,
            "stderr_tail": self.stderr_tail,
            "collected": dict(self.collected),
            "backend": self.backend,
            "attempts": self.attempts,
            "error": self.error,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "duration_s": round(max(0.0, self.ended_at - self.started_at), 6),
            "meta": dict(self.meta),
        }
        if self.limits:
            d["limits"] = dict(self.limits)
        if self.image_run_skipped:
            d["image_run_skipped"] = list(self.image_run_skipped)
        if self.steps:
            d["steps"] = [dict(s) for s in self.steps]
        return d

    @classmethod
    def from_dict(cls, d: dict, where: str = "run") -> Run:
        if d.get("schema") != RUN_SCHEMA:
            raise JobsFileError(
                f"{where}: schema: expected {RUN_SCHEMA!r}, got {d.get('schema')!r}"
            )
        if d.get("status") not in STATUSES:
            raise JobsFileError(f"{where}: status: {d.get('status')!r} is not one of {STATUSES}")
        return cls(
            job_id=d["job_id"], status=d["status"], started_at=d["started_at"], ended_at=d["ended_at"],
            exit_code=d.get("exit_code"),
            verify=VerifyResult.from_dict(d["verify"]) if d.get("verify") else None,
            stdout_tail=d.get("stdout_tail", ""), stderr_tail=d.get("stderr_tail", ""),
            collected=dict(d.get("collected") or {}), backend=d.get("backend", ""),
            attempts=d.get("attempts", 1), error=d.get("error"), meta=dict(d.get("meta") or {}),
            limits=dict(d.get("limits") or {}),
        )  # fmt: skip


@attrs.frozen(kw_only=True)
class BadLine:
    """A jobs-file line that is not a valid job; it becomes a `status: error` run."""

    job_id: str
    error: str
    meta: dict = attrs.field(factory=dict)


def read_jobs(
    stream: IO[str], name: str = "<stdin>", base_dir: Path | None = None
) -> Iterator[Job | BadLine]:
    """Parse a JSONL jobs stream. Each line yields a Job or a BadLine naming file:line and field.

    A line without a usable job_id gets the id ``NAME:LINE`` so that it is still reported (and
    recorded for resume). Duplicate job ids raise JobsFileError: they would break resume.
    """
    seen: dict[str, int] = {}
    short = os.path.basename(name)
    for lineno, line in enumerate(stream, start=1):
        if not line.strip():
            continue
        where = f"{short}:{lineno}"
        try:
            row = json.loads(line, parse_constant=_not_json)
        except json.JSONDecodeError as exc:
            yield BadLine(job_id=where, error=f"{where}: not JSON: {exc.msg} (column {exc.colno})")
            continue
        except ValueError as exc:
            yield BadLine(job_id=where, error=f"{where}: not JSON: {exc}")
            continue
        job_id = row.get("job_id") if isinstance(row, dict) else None
        if isinstance(job_id, str) and job_id:
            if job_id in seen:
                raise JobsFileError(
                    f"{where}: job_id {job_id!r} already used on line {seen[job_id]}"
                )
            seen[job_id] = lineno
        try:
            yield Job.from_dict(row, where, base_dir)
        except JobError as exc:
            meta = m if isinstance(row, dict) and isinstance(m := row.get("meta"), dict) else {}
            ok_id = job_id if isinstance(job_id, str) and job_id else where
            yield BadLine(job_id=ok_id, error=str(exc), meta=meta)


def _not_json(word: str) -> Any:
    raise ValueError(f"{word} is not a JSON number")


def _run_row(raw: bytes, where: str) -> dict:
    """One runs-file line, checked in the fields resume reads (`RUN_READS`)."""
    row = json.loads(raw, parse_constant=_not_json)
    if not isinstance(row, dict):
        raise JobsFileError(f"{where}: expected a JSON object, got {type(row).__name__}")
    got = row.get("schema")
    if got != RUN_SCHEMA:
        if isinstance(got, str) and got.partition("/")[0] == "claw.run":
            raise JobsFileError(
                f"{where}: schema: unsupported version {got!r} (this reader knows {RUN_SCHEMA!r})"
            )
        raise JobsFileError(f"{where}: schema: expected {RUN_SCHEMA!r}, got {got!r}")
    if not isinstance(row.get("job_id"), str) or not row["job_id"]:
        raise JobsFileError(f"{where}: job_id: missing or not a non-empty string")
    if row.get("status") not in STATUSES:
        raise JobsFileError(f"{where}: status: {row.get('status')!r} is not one of {STATUSES}")
    return row


def read_runs(path: Path) -> tuple[list[dict], int]:
    """Read an existing runs file for resume: (records, byte length of the valid prefix).

    A projection reader: it checks `RUN_READS` (schema, job_id, status) and keeps every line
    whole. A last line cut short by a killed writer (no newline, or not JSON) is not counted:
    the caller truncates the file to the valid prefix. A bad line in the middle is an error.
    """
    data = path.read_bytes()
    rows, good = [], 0
    lines = data.split(b"\n")
    for i, raw in enumerate(lines):
        last = i == len(lines) - 1
        if not raw.strip():
            if not last:
                good += len(raw) + 1
            continue
        try:
            row = _run_row(raw, f"{path.name}:{i + 1}")
        except ValueError as exc:
            if last:
                break  # torn final line from a killed writer
            raise JobsFileError(f"{path.name}:{i + 1}: not JSON: {exc}") from None
        except JobsFileError:
            if last:
                break  # torn final line from a killed writer
            raise
        if last:
            break  # complete JSON but no trailing newline: rewrite it
        rows.append(row)
        good += len(raw) + 1
    return rows, good


def _job_id(d: Any, where: str) -> str:
    """A job object's schema and job_id, checked."""
    if not isinstance(d, dict):
        raise JobError(f"{where}: expected a JSON object, got {type(d).__name__}")
    if d.get("schema") != JOB_SCHEMA:
        got = d.get("schema")
        if isinstance(got, str) and got.partition("/")[0] == "claw.job":
            raise _fail(
                where, "schema", f"unsupported version {got!r} (this reader knows {JOB_SCHEMA!r})"
            )
        raise _fail(where, "schema", f"expected {JOB_SCHEMA!r}, got {got!r}")
    job_id = d.get("job_id")
    if not isinstance(job_id, str) or not job_id:
        raise _fail(where, "job_id", "missing required field (a non-empty string)")
    return job_id


def _job_envs(d: dict, where: str) -> tuple[dict, dict]:
    """``env`` and ``image_env``: objects of strings."""
    env = _get(d, "env", dict, where, "env", {})
    image_env = _get(d, "image_env", dict, where, "image_env", {})
    for field, values in (("env", env), ("image_env", image_env)):
        for k, v in values.items():
            if not isinstance(v, str):
                raise _fail(where, f"{field}/{k}", "environment values must be strings")
    return env, image_env


def _job_collect(d: dict, where: str) -> list:
    """``collect``: glob strings, absolute or safe relative paths."""
    collect = _get(d, "collect", list, where, "collect", [])
    for i, g in enumerate(collect):
        if not isinstance(g, str):
            raise _fail(where, f"collect/{i}", "expected a glob string")
        if not g.startswith("/"):
            check_relpath(g, where, f"collect/{i}")
    return collect


def _job_verify(verify: Any, where: str, base: Path) -> Verify | None:
    """The job's own verify (its copy_from resolved against ``base``), or None."""
    if verify is None:
        return None
    if not isinstance(verify, dict):
        raise _fail(where, "verify", "expected an object or null")
    rec = Verify.from_dict(verify, where)
    if rec.copy_from:
        rec = attrs.evolve(rec, copy_from=str(base / rec.copy_from))
    return rec


def _job_steps(d: dict, where: str, timeout: float, mounts: tuple[Mount, ...]) -> tuple[Step, ...]:
    """``steps``: distinct names, each step's mounts among the job's mount targets."""
    steps_raw = _get(d, "steps", list, where, "steps", [])
    steps = tuple(Step.from_dict(s, where, f"steps/{i}", timeout) for i, s in enumerate(steps_raw))
    names = [s.name for s in steps]
    if len(set(names)) != len(names):
        raise _fail(where, "steps", f"step names repeat: {names}")
    job_targets = {m.target for m in mounts}
    for i, s in enumerate(steps):
        for j, m in enumerate(s.mounts):
            if m.target not in job_targets:
                raise _fail(
                    where,
                    f"steps/{i}/mounts/{j}/target",
                    f"{m.target} is not a target of the job's mounts",
                )
    return steps


def _check_overlaps(
    where: str,
    mounts: tuple[Mount, ...],
    verify: Verify | None,
    steps: tuple[Step, ...],
    workdir: str | None,
) -> None:
    """No mount target (job, verify, step verify) lies under another or the workdir."""
    targets = list(
        dict.fromkeys(
            m.target
            for m in (
                *mounts,
                *(verify.mounts if verify else ()),
                *(m for s in steps for m in (*(s.verify.mounts if s.verify else ()),)),
            )
        )
    )
    for i, t in enumerate(targets):
        for other in [*targets[:i], *([workdir] if workdir else [])]:
            if is_under(t, other) or is_under(other, t):
                raise _fail(where, "mounts", f"target {t} overlaps {other}")
