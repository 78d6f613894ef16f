"""The `bwrap` backend: bubblewrap namespaces around each step.

Each step runs as ``bwrap ... -- [setpriv] [forwarder] COMMAND`` with
- new pid, ipc, uts, cgroup and (unless policy `host`, the job's or a verify step's own
  `verify.network`) network namespaces;
- an allow-list view of the host: /usr, /bin, /sbin, /lib*, /etc and /sys read-only, fresh
  /dev and /proc, empty /root, /home, /run, /var (/var/tmp -> /tmp); nothing else of the host
  exists inside (no stray secret or unix socket under /srv, /opt, /var, /mnt ...), except the
  interpreter directories the command needs and `--ro-path`s, bound back read-only, with the
  directory of all job directories hidden under a tmpfs wherever it would show;
- the job's workspace at /workspace and the job's own /tmp, both writable and kept between the
  steps of the job (setup, command, verify see the same files);
- a `profile: "harbor"` job's verify-only mounts that nothing is read back from (/tests) are,
  as on docker, writable copies in a writable root of the verify step's own (a fresh host
  directory bound at /), not mount points: a test.sh may `mv /tests ...` or `rm -rf /tests`;
- a seccomp filter (`_seccomp`): no keyrings, no new namespaces, no mounts, no kernel-global
  calls;
- as root: the step drops to a separate unprivileged host uid (default 65534) without
  capabilities and with no_new_privs; as another user: a user namespace (uid 1000 inside);
- with an OCI image (`image=`, `run --oci`; `_oci`): the image's unpacked root instead of the
  host's, its ENV under the job's env, its WORKDIR as the workspace, its USER as the uid of a
  user namespace;
- limits (the job's, else the backend's defaults) from a per-job cgroup below the runner's own
  when the tree is writable, else the job's own limits as rlimits; at the timeout the bwrap
  monitor is killed, which kills the pid namespace and so every process of the step.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import re
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from claw_sandbox import _cgroup, _forward, _oci, _seccomp, _tmpfs
from claw_sandbox._hostpaths import command_paths
from claw_sandbox._proc import StepResult, killpg, run_step
from claw_sandbox.backends.base import (
    DEFAULT_LIMITS,
    DEFAULT_PATH,
    Backend,
    Sandbox,
    argv_of,
    effective_limits,
    rlimit_wrap,
    venv_paths,
)
from claw_sandbox.errors import BackendUnavailable, InfraError, JobError
from claw_sandbox.records import Command, Job, Limits, Verify, parse_http_url
from claw_sandbox.workspace import chown_tree

# what a job sees of the host: system directories read-only, nothing else (item: an allow-list,
# so a stray secret or unix socket elsewhere on the host is out of reach)
VISIBLE = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc")
VISIBLE_ROOTS = tuple(f"/{v}" for v in VISIBLE) + ("/sys", "/dev", "/proc")
INNER_WORKSPACE = "/workspace"


def root_binds() -> list[str]:
    """The sandbox's root: /usr, /bin, /sbin, /lib*, /etc read-only, /sys read-only, fresh /dev
    and /proc, empty /root, /home, /run, /var; everything else of the host is absent."""
    args = []
    for name in VISIBLE:
        path = f"/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    args += ["--ro-bind-try", "/sys", "/sys", "--dev", "/dev", "--proc", "/proc"]
    for d in ("/root", "/home", "/run", "/var"):
        args += ["--dir", d]
    args += ["--symlink", "../run", "/var/run", "--symlink", "../tmp", "/var/tmp"]
    args += ["--perms", "1777", "--dir", "/tmp"]
    return args


def rootfs_binds(rootfs: str) -> list[str]:
    """The sandbox's root from a directory (e.g. an exported image): each of its top-level
    entries read-only (symlinks as they are), fresh /dev and /proc, /sys read-only, own /tmp."""
    root = os.path.realpath(rootfs)
    args = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if name in ("dev", "proc", "sys", "tmp"):
            continue
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), f"/{name}"]
        elif os.path.isdir(path) or os.path.isfile(path):
            args += ["--ro-bind", path, f"/{name}"]
    args += ["--ro-bind-try", "/sys", "/sys", "--dev", "/dev", "--proc", "/proc"]
    args += ["--perms", "1777", "--dir", "/tmp"]
    return args


def _without_binds_at(args: list[str], targets: set[str]) -> list[str]:
    """bwrap arguments without the binds or links whose destination is one of `targets` (a
    rootfs's own top-level entry that a verify step's copy replaces)."""
    if not targets:
        return args
    out, i = [], 0
    while i < len(args):
        if args[i] in ("--ro-bind", "--bind", "--symlink") and args[i + 2] in targets:
            i += 3
            continue
        out.append(args[i])
        i += 1
    return out


def _under(path: str, roots: tuple[str, ...] | set[str]) -> bool:
    return any(path == r or path.startswith(r + "/") for r in roots)


def _others_reach(path: str, read: bool = True) -> bool:
    """Whether any user may walk to `path` (and read it) by the mode bits of it and its parents."""
    try:
        for d in [*reversed(Path(path).parents), Path(path)]:
            mode = os.stat(d).st_mode
            if not mode & 0o001 or (read and d == Path(path) and not mode & 0o004):
                return False
    except OSError:
        return False
    return True


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
        self.verifying = False
        #: while the runner looks up a command's program: that command (its binds, not the probe's)
        self._shown_for: Command | None = None
        #: the running verify step's own network policy (verify.network), else None
        self.verify_network: str | None = None
        #: the root of a harbor verify step that holds copies of `copied_targets` (see place)
        self.verify_root = jobdir / "verify-root-0"
        self._verify_roots = 0
        #: the job's image (by its `image` name, else the backend's own), its root, bwrap's
        #: arguments for that root and its USER as (uid, gid)
        self.image = image = backend.image_for(job)
        self.rootfs = str(image.rootfs) if image is not None else backend.rootfs
        self.base_args, self.image_user = backend.root_of(image)
        if image is not None and not job.workdir and image.workdir.strip("/"):
            self.inside_workspace = "/" + posixpath.normpath(image.workdir).strip(
                "/"
            )  # the image's WORKDIR
        #: bwrap itself runs as the dropped uid (root runner; a user namespace of the job's own)
        self.drop_first = self.owner is not None and (job.profile == "harbor" or image is not None)
        self.limits = effective_limits(
            job.limits, backend.default_limits, cgroup=backend.cgroups.version is not None,
            # a kept job directory must outlive the run: no tmpfs (and so no disk bound) for it
            disk=self.owner is not None and job.keep == "never" and _tmpfs.can_mount(),
        )  # fmt: skip

    def place_verify_files(self, verify: Verify | None = None) -> None:
        super().place_verify_files(verify)
        self.verifying = True
        v = verify or self.job.verify
        self.verify_network = v.network if v is not None else None
        copied = self.copied_targets()
        shutil.rmtree(self.verify_root, ignore_errors=True)
        if not copied:
            return
        # a fresh name each time: what a verifier left that cannot be removed stays out of the way
        self._verify_roots += 1
        self.verify_root = self.jobdir / f"verify-root-{self._verify_roots}"
        self.verify_root.mkdir(mode=0o755)
        for target in copied:  # a copy, not a bind: the verifier may move or remove it
            shutil.copytree(self.mount_of(target), self.verify_root / target.lstrip("/"),
                            symlinks=True)  # fmt: skip
        if self.owner is not None:
            chown_tree(self.verify_root, *self.owner)

    def end_verify(self) -> None:
        self.verifying, self.verify_network = False, None
        shutil.rmtree(self.verify_root, ignore_errors=True)

    def copied_targets(self) -> list[str]:
        """A harbor job's verify-only mount targets that no reward file or collect path lies
        under: its verify steps get them as writable copies (as docker copies them into the
        trial container) instead of binds, so /tests is a plain directory there."""
        if self.job.profile != "harbor":
            return []
        read = [*self.job.collect, *(v.reward_file for v in self.job.verifies() if v.reward_file)]
        return [
            t
            for t in sorted(self.job.verify_only_targets())
            if not any(p.startswith("/") and _under(p, {t}) for p in read)
        ]

    def writable_places(self) -> list[str]:
        # harbor's /root is the job's own home. The job's /tmp is not here: a runner's PATH entry
        # under /tmp (a test's temporary venv, say) stays on PATH, and each step shows it either
        # read-only from the host (the command's programs) or as an empty read-only tmpfs
        # (`_masked_path_args`), never as what the job left in its /tmp
        home = ["/root"] if self.job.profile == "harbor" else []
        return [self.inside_workspace, *self.job.mount_targets(), *home]

    def _masked_path_args(self, bound: set[str]) -> list[str]:
        """An empty read-only tmpfs over each inherited PATH entry inside the job's /tmp that the
        step does not show from the host: a program the job planted there never runs."""
        args: list[str] = []
        for entry in dict.fromkeys(self.inherited_path().split(os.pathsep)):
            norm = posixpath.normpath(entry)
            if _under(norm, ("/tmp", "/var/tmp")) and not _under(norm, bound):
                args += ["--tmpfs", norm, "--remount-ro", norm]
        return args

    def inherited_path(self) -> str:
        # /tmp itself cannot be masked (it is the job's own): it never is on a job's PATH
        kept = [
            e
            for e in super().inherited_path().split(os.pathsep)
            if posixpath.normpath(e) not in ("/tmp", "/var/tmp")
        ]
        return os.pathsep.join(kept) or DEFAULT_PATH

    def env(self) -> dict[str, str]:
        env = super().env()
        if self.job.profile == "harbor":
            env["HOME"] = "/root"
            env.update(self.job.image_env)  # the Dockerfile's ENV HOME, say, over /root
            env.update(self.job.env)
        if self.image is not None:  # the image's ENV (docker's PATH if none), under the job's own
            env["PATH"] = DEFAULT_PATH
            env.update(self.image.env)
            env.update(self.job.image_env)
            env.update(self.job.env)
        return env

    async def lookup(self, program: str, command: Command, *, timeout_s: float) -> bool | None:
        # the probe sees what `command` would: the host paths its programs need bound back
        self._shown_for = command
        try:
            return await super().lookup(program, command, timeout_s=timeout_s)
        finally:
            self._shown_for = None

    async def start(self) -> None:
        if self.backend.cgroups.version is not None:
            try:
                self.cgroup = _cgroup.JobCgroup.create(self.backend.cgroups, self.limits, "bwrap")
            except OSError as exc:
                raise InfraError(f"cannot create the job's cgroup: {exc}") from exc
        if self.job.network.policy == "proxy":
            run_dir = self.jobdir / "run"
            run_dir.mkdir(mode=0o755)
            host, port = parse_http_url(self.job.network.proxy_url or "")
            self.relay = _forward.Relay(host, port)
            await self.relay.start_unix(run_dir / "proxy.sock")

    def _argv(self, command: Command) -> tuple[list[str], list[str]]:
        """bwrap's argv and the command to run inside: namespaces, the root (copied verify
        targets), binds, what the command's programs need, hidden paths, the inner command."""
        copied = set(self.copied_targets()) if self.verifying else set()
        args = self._namespace_args()
        if copied:  # the verify step's own writable root holds the copies (place_verify_files)
            args += ["--bind", str(self.verify_root), "/"]
        args += _without_binds_at(self.base_args, copied)
        args += self._bind_args(copied)
        bound, shown = self._program_args(self._shown_for or command)
        args += shown
        args += self._masked_path_args(bound)
        for h in sorted(self.backend.hidden):  # e.g. the job directories, inside a bound dir
            if _under(h, bound) or _under(h, VISIBLE_ROOTS):
                args += ["--tmpfs", h]
        if not copied:
            args += ["--remount-ro", "/"]  # bwrap's root tmpfs, too
        args += ["--chdir", self.inside_workspace]
        inner = self._inner(command)
        if self.owner is not None:
            uid, gid = self.owner
            # leaving uid 0 clears every capability; no_new_privs stops setuid/file-cap binaries
            drop = [self.backend.setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
                    "--no-new-privs"]  # fmt: skip
            if self.drop_first:  # drop before bwrap: the user namespace's uid 0 (or the image's
                args = [*drop, *args]  # USER) is the unprivileged uid
            else:
                inner = [*drop, *inner]
        return args, inner

    def policy(self) -> str:
        """The network policy of what runs now: a verify step's own (verify.network), else the
        job's."""
        return (self.verifying and self.verify_network) or self.job.network.policy

    def _namespace_args(self) -> list[str]:
        """bwrap itself and the namespaces: pid, ipc, uts, cgroup, net (unless host), user."""
        args = [self.backend.bwrap, "--die-with-parent", "--new-session", "--unshare-pid",
                "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox"]  # fmt: skip
        if self.policy() != "host":
            args.append("--unshare-net")
        if self.image_user is not None:  # the image's USER, in a user namespace
            uid, gid = self.image_user
            args += ["--unshare-user", "--uid", str(uid), "--gid", str(gid), "--cap-drop", "ALL"]
        elif (
            self.job.profile == "harbor"
        ):  # uid 0 in a user namespace of its own (as the dropped host uid, when root)
            args += ["--unshare-user", "--uid", "0", "--gid", "0", "--cap-drop", "ALL"]
        elif self.owner is None:
            args += ["--unshare-user", "--uid", "1000", "--gid", "1000", "--cap-drop", "ALL"]
        return args

    def _bind_args(self, copied: set[str]) -> list[str]:
        """The writable binds (/tmp, the workspace, harbor's /root, the job's mounts; verify-only
        mounts in verify steps only), the proxy relay's socket directory, host DNS."""
        job = self.job
        harbor = job.profile == "harbor"
        binds = [(self.tmp, "/tmp"), (self.workspace, self.inside_workspace)]
        if harbor:
            binds.append((self.tmp / "home", "/root"))
        verify_only = job.verify_only_targets()
        for i, target in enumerate(job.mount_targets()):
            if target in copied:
                continue  # a plain directory of the verify root, not a bind
            if target not in verify_only or self.verifying:  # verify mounts: verify steps only
                binds.append((self.mount_dir(i), target))
        if (
            self.drop_first
            and self.owner is not None
            and not _others_reach(str(self.jobdir.parent), read=False)
        ):
            why = "profile harbor" if harbor else "an image"
            raise JobError(
                f"job {job.job_id!r}: {why}: bwrap runs as uid {self.owner[0]}, "
                f"which cannot reach the job directories under {self.jobdir.parent} "
                "(give --workdir a directory whose parents all have mode o+x)"
            )
        args: list[str] = []
        for src, dest in binds:
            args += ["--bind", str(src), dest]
        if self.relay is not None and self.policy() == "proxy":
            args += ["--bind", str(self.jobdir / "run"), "/run/claw"]
        if self.policy() == "host":
            for f in ("/run/systemd/resolve",):
                args += ["--ro-bind-try", f, f]
        return args

    def _program_args(self, command: Command) -> tuple[set[str], list[str]]:
        """Read-only binds of what the programs the command names need (e.g. a harness in a
        venv under the checkout) and of --ro-path: (the bound paths, the args)."""
        args: list[str] = []
        bound: set[str] = set()
        made: set[str] = {"/", "/root", "/home", "/run", "/var", "/tmp"}
        # an image brings its own programs: of the host, only what --ro-path names
        needs = [] if self.image else command_paths(command, self.env().get("PATH", ""))
        needs += [] if self.image else venv_paths(command)
        # parents before children, so a bound directory never hides a bind inside it
        wanted = sorted(
            {os.path.normpath(p) for p in [*needs, *self.backend.ro_paths]},
            key=lambda p: (p.count("/"), p),
        )
        for p in wanted:
            if p == "/" or _under(p, VISIBLE_ROOTS) or not os.path.exists(p):
                continue
            if self.drop_first and not _others_reach(p):
                continue  # bwrap runs as the dropped uid: it could not bind this path
            if _under(p, bound):
                continue  # already visible through a bound parent
            bound.add(p)
            for parent in reversed(Path(p).parents[:-1]):  # else bwrap makes them 0700
                if str(parent) not in made:
                    made.add(str(parent))
                    args += ["--perms", "0755", "--dir", str(parent)]
            args += ["--ro-bind", p, p]
        return bound, args

    def _inner(self, command: Command) -> list[str]:
        """The command inside: through the rootfs's shell, the proxy relay and the rlimits."""
        inner = argv_of(command)
        if self.rootfs and isinstance(command, str):  # the rootfs's shell, not the host's
            has_bash = any(
                os.path.exists(os.path.join(self.rootfs, d, "bash")) for d in ("bin", "usr/bin")
            )
            inner = ["/bin/bash" if has_bash else "/bin/sh", "-c", command]
        if self.relay is not None and self.policy() == "proxy":
            inner = (
                _forward.inner_command(
                    self.job.network.port or 0, self.backend.socat, sys.executable
                )
                + inner
            )
        if self.cgroup is None:
            inner = rlimit_wrap(self.job.limits, inner)  # the job's own limits only: see README
        return inner

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
        seccomp_fd = _seccomp.program_fd() if self.backend.seccomp else None
        if seccomp_fd is not None:
            args += ["--seccomp", str(seccomp_fd)]
        fds = (status_w,) if seccomp_fd is None else (status_w, seccomp_fd)
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
                kill_is_quick=self.cgroup is None, merge_stderr=merge_stderr, pass_fds=fds,
            )  # fmt: skip
        finally:
            os.close(status_w)
            if seccomp_fd is not None:
                os.close(seccomp_fd)
            self._read_status()
            os.close(status_r)
        # bwrap reports the command's exit code only when the command ran: a failed setup (a
        # bind source gone, e.g. a broken workdir) says child-pid, then exits 1 with no exit-code
        if b'"exit-code"' not in self._status and not result.timed_out:
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
            self.notes += self.cgroup.limit_notes(self.limits)
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
                 hide: tuple[str, ...] = (), default_limits: Limits = DEFAULT_LIMITS,
                 seccomp: bool = True, rootfs: str | None = None,
                 image: _oci.Image | None = None,
                 images: dict[str, _oci.Image] | None = None) -> None:  # fmt: skip
        self.bwrap = shutil.which("bwrap") or ""
        self.setpriv = shutil.which("setpriv") or ""
        self.socat = shutil.which("socat")
        self.cgroups = _cgroup.detect()
        self.owner = (uid, gid) if os.geteuid() == 0 and self.setpriv else None
        env_paths = tuple(p for p in os.environ.get("CLAW_SANDBOX_RO_PATHS", "").split(":") if p)
        self.ro_paths = (*ro_paths, *env_paths)
        #: a directory to use as the root filesystem (e.g. an exported image) instead of the host's
        self.rootfs = rootfs or os.environ.get("CLAW_SANDBOX_ROOTFS") or None
        #: an unpacked OCI image (`_oci.unpack`) for every job: its rootfs as the root, its ENV,
        #: WORKDIR, USER; `images`: one for the jobs whose `image` names it (over `image`)
        self.image = image
        self.images = dict(images or {})
        if (image is not None or self.images) and rootfs:
            raise BackendUnavailable("bwrap: give images or a rootfs, not both")
        if image is not None:
            self.rootfs = str(image.rootfs)
        self.base_args = rootfs_binds(self.rootfs) if self.rootfs else root_binds()
        self._roots = {  # USER resolved now: a bad one is an error before any job runs
            str(im.rootfs): (rootfs_binds(str(im.rootfs)), _oci.resolve_user(im.rootfs, im.user))
            for im in (image, *self.images.values())
            if im is not None
        }
        self.default_limits = default_limits
        self.seccomp = seccomp and _seccomp.program() is not None
        self.hidden: set[str] = set()
        for h in hide:
            self.hide(h)
        self._reason: str | None | bool = False

    def image_for(self, job: Job) -> _oci.Image | None:
        """The image a job runs in: the one its `image` names, else the backend's own, else none."""
        return self.images.get(job.image or "", self.image)

    def root_of(self, image: _oci.Image | None) -> tuple[list[str], tuple[int, int] | None]:
        """bwrap's arguments for an image's root (else the backend's root) and its USER."""
        if image is None:
            return self.base_args, None
        return self._roots[str(image.rootfs)]

    def hide(self, path: str) -> None:
        """Hide a host directory (e.g. the one holding every job directory) behind an empty tmpfs
        wherever a step would otherwise see it (under a visible or bound-back directory)."""
        self.hidden.add(os.path.realpath(path))

    def unavailable(self) -> str | None:
        if self._reason is not False:
            return self._reason  # type: ignore[return-value]
        self._reason = self._probe()
        return self._reason

    def _probe(self) -> str | None:
        if not self.bwrap:
            return "bwrap is not installed (apt-get install bubblewrap)"
        if self.rootfs and not os.path.isdir(self.rootfs):
            return f"--rootfs {self.rootfs}: not a directory"
        argv = [self.bwrap, "--die-with-parent", "--unshare-pid", "--unshare-net", "--unshare-ipc"]
        if self.owner is None:
            argv += ["--unshare-user", "--uid", "1000", "--gid", "1000"]
        argv += [*self.base_args, "--", "/bin/sh", "-c", "true"]
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
