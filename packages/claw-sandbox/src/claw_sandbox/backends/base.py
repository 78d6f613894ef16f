"""What every backend provides: open a sandbox for a job, run steps in it, throw it away."""

from __future__ import annotations

import abc
import contextlib
import functools
import os
import posixpath
import shlex
import shutil
import sys
from pathlib import Path
from typing import ClassVar

import attrs

from claw_sandbox import _fsat, _leftovers, _reward, _tmpfs
from claw_sandbox._hostpaths import venv_closure
from claw_sandbox._proc import StepResult
from claw_sandbox.errors import JobError
from claw_sandbox.records import Command, Job, Limits, Mount, Step, Verify
from claw_sandbox.workspace import build_workspace, chown_tree, copy_into, safe_write

# what `Sandbox.lookup`'s probe prints
_FOUND, _MISSING = "claw-lookup-found", "claw-lookup-missing"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Bounds for a job that names none. memory/pids/cpus apply through the job's cgroup (so only
# where the cgroup tree is writable; the rlimit fallback applies a job's own limits only: an
# address-space or per-user process rlimit as a default would break ordinary programs); disk_mb
# through a tmpfs on the job directory (only a root runner may mount one).
DEFAULT_LIMITS = Limits(memory_mb=4096, pids=1024, cpus=2.0, disk_mb=4096)


def effective_limits(limits: Limits, defaults: Limits, *, cgroup: bool, disk: bool) -> Limits:
    """What is enforced: the job's limits, each one it leaves out taken from `defaults`, for
    the kinds this sandbox can enforce (`cgroup`: memory, pids, cpus; `disk`: disk_mb). A disk
    bound that cannot be enforced is dropped, so the run record never claims it."""
    keys = (("memory_mb", "pids", "cpus") if cgroup else ()) + (("disk_mb",) if disk else ())
    filled: dict = {
        k: getattr(defaults, k)
        for k in keys
        if getattr(limits, k) is None and getattr(defaults, k) is not None
    }
    if not disk and limits.disk_mb is not None:
        filled["disk_mb"] = None
    return attrs.evolve(limits, **filled) if filled else limits


def job_path(runner_path: str, writable: list[str]) -> str:
    """The runner's PATH without what would let a job's own files run as programs: relative and
    empty entries (``bin``, ``''``, ``.``, ``~/bin``: looked up from the step's cwd, the job's
    workspace) and entries inside a place the job can write (`writable`, e.g. its workspace or
    /tmp); `DEFAULT_PATH` when nothing is left."""
    places = [posixpath.normpath(w) for w in writable if w.startswith("/")]
    kept = []
    for entry in runner_path.split(os.pathsep):
        if not entry.startswith("/"):
            continue
        norm = posixpath.normpath(entry)
        if any(norm == w or norm.startswith(w.rstrip("/") + "/") for w in places):
            continue
        kept.append(entry)
    return os.pathsep.join(dict.fromkeys(kept)) or DEFAULT_PATH


def argv_of(command: Command) -> list[str]:
    """A string runs under `bash -c`; a list is an argv."""
    if isinstance(command, str):
        return [shutil.which("bash") or "/bin/bash", "-c", command]
    return list(command)


def rlimit_wrap(limits: Limits, argv: list[str]) -> list[str]:
    """Fallback limits without cgroups: address space for memory, RLIMIT_NPROC for pids.

    RLIMIT_NPROC counts every process of the (real) user, so it is only meaningful when the job
    runs as a user of its own; root ignores it. There is no rlimit equivalent of `cpus`.
    """
    parts = []
    if limits.memory_mb:
        parts.append(f"ulimit -v {limits.memory_mb * 1024}")
    if limits.pids:
        parts.append(f"ulimit -u {limits.pids}")
    if not parts:
        return argv
    bash = shutil.which("bash") or "/bin/bash"
    return [bash, "-c", " && ".join(parts) + ' || exit 125; exec "$@"', "claw-limit", *argv]


class Sandbox(abc.ABC):
    """One job's throw-away sandbox: a job directory holding the workspace and the job's /tmp."""

    def __init__(self, backend: Backend, job: Job, jobdir: Path) -> None:
        self.backend = backend
        self.job = job
        self.jobdir = jobdir
        self.workspace = jobdir / "ws"
        self.tmp = jobdir / "tmp"
        self.notes: list[str] = []  # what the run's `error` should mention (limits hit, ...)
        self.limits: Limits = job.limits  # what is enforced: the job's, plus backend defaults
        self.mounted = False  # the job directory is a tmpfs of its own (limits.disk_mb)
        self.owner: tuple[int, int] | None = None  # uid/gid the sandboxed code runs as
        self.lock: int | None = None  # flock fd: the job directory is in flight (_leftovers)
        if job.workdir:
            self.inside_workspace = job.workdir

    # paths as the sandboxed code sees them
    inside_workspace: str = ""
    inside_tmp: str = ""

    def prepare(self) -> None:
        """Create the job directory and fill the workspace (JobError on bad copy_from)."""
        self.jobdir.mkdir(parents=True)
        if self.limits.disk_mb:
            _tmpfs.mount(self.jobdir, self.limits.disk_mb)
            self.mounted = True
        self.lock = _leftovers.hold(self.jobdir)  # after a SIGKILL, the next run removes it
        self.tmp.mkdir()
        (self.tmp / "home").mkdir()
        build_workspace(
            self.workspace, self.job.files, self.job.copy_from, f"job {self.job.job_id!r}"
        )
        for i in range(len(self.job.mount_targets())):
            self.mount_dir(i).mkdir(parents=True)
        for i, m in enumerate(self.job.mounts):
            for rel, content in m.files.items():
                safe_write(
                    self.mount_of(m.target), rel, content, f"job {self.job.job_id!r}: mounts/{i}"
                )
        if self.owner:
            chown_tree(self.workspace, *self.owner)
            chown_tree(self.tmp, *self.owner)
            if self.job.mount_targets():
                chown_tree(self.jobdir / "mnt", *self.owner)

    def mount_dir(self, i: int) -> Path:
        """The host directory of the i-th of the job's mount targets (`Job.mount_targets`)."""
        return self.jobdir / "mnt" / str(i)

    def mount_of(self, target: str) -> Path:
        """The host directory bound at a mount target."""
        return self.mount_dir(self.job.mount_targets().index(target))

    def _refill(self, mounts: tuple[Mount, ...], where: str) -> None:
        """Empty each mount's directory (what the job put there goes; the directory, a bind
        mount's source, stays) and write the mount's files into it."""
        for i, m in enumerate(mounts):
            d = self.mount_of(m.target)
            dfd = _fsat.open_root(d)
            try:
                for child in os.listdir(dfd):
                    _fsat.remove_at(dfd, child)  # follows no link, any depth
            finally:
                os.close(dfd)
            for rel, content in m.files.items():
                safe_write(d, rel, content, f"{where}/mounts/{i}")
            if self.owner:
                chown_tree(d, *self.owner)

    def begin_step(self, step: Step, index: int) -> None:
        """Before a step of `Job.steps`: its files into the workspace, its mounts refilled."""
        where = f"job {self.job.job_id!r}: steps/{index}"
        for rel, content in step.files.items():
            safe_write(self.workspace, rel, content, f"{where}/files")
        if self.owner and step.files:
            chown_tree(self.workspace, *self.owner)
        self._refill(step.mounts, where)

    def end_verify(self) -> None:
        """After a verify step that more steps follow: verify-only mounts go away again."""
        return None

    def host_root(self, path: str) -> tuple[Path, str] | None:
        """(host directory, relative path) holding a job path (relative: the workspace; absolute:
        under workdir or a mount target), None when the job holds no such place."""
        place = self.job.place_of(path)
        if place is None:
            return None
        i, rel = place
        return (self.workspace if i is None else self.mount_dir(i)), rel

    async def sync_out(self) -> None:
        """Bring the workspace's state to the host directory before reading it (a backend whose
        workspace lives elsewhere, e.g. inside a container, copies it out)."""
        return None  # here the workspace is the host directory itself

    def clear_for_verify(self, verify: Verify) -> None:
        """Before a verify step, host side and following no link: each of its `reset` directories
        is emptied, whatever stands at its `reward_file` removed, and every directory on the way
        made a real directory the sandbox user can write (see `_reward`). OSError when that cannot
        be done; the verifier then does not run."""
        for path in verify.reset:
            root, rel = self.host_root(path) or (self.workspace, path)
            _reward.reset_dir(root, rel, self.owner)
        if verify.reward_file:
            root, rel = self.host_root(verify.reward_file) or (self.workspace, verify.reward_file)
            _reward.reset_file(root, rel, self.owner)

    def place_verify_files(self, verify: Verify | None = None) -> None:
        """Put the hidden verifier files into the workspace and its mounts (default: the job's
        verify); only ever after the command ended."""
        verify = verify or self.job.verify
        if verify is None:
            return
        where = f"job {self.job.job_id!r}: verify"
        if verify.copy_from:
            copy_into(verify.copy_from, self.workspace, where)
        for rel, text in verify.files.items():
            safe_write(self.workspace, rel, text, where)
        self._refill(verify.mounts, where)
        if self.owner:
            chown_tree(self.workspace, *self.owner)

    def writable_places(self) -> list[str]:
        """Directories, as the sandboxed code sees them, that it can write (and so plant a
        program in): the workspace, its /tmp, its mounts."""
        return [self.inside_workspace, self.inside_tmp, *self.job.mount_targets()]

    def inherited_path(self) -> str:
        """The runner's PATH as a job inherits it (`job_path`)."""
        return job_path(os.environ.get("PATH", ""), self.writable_places())

    def env(self) -> dict[str, str]:
        """The step environment: a small clean base (nothing of the runner's leaks) + job env.
        The runner's PATH comes without entries the job could plant a program in
        (`inherited_path`); a PATH in the job's own env is its author's and stays as given."""
        env = {
            "PATH": self.inherited_path(),
            "LANG": "C.UTF-8",
            "HOME": f"{self.inside_tmp}/home",
            "TMPDIR": self.inside_tmp,
            "CLAW_WORKSPACE": self.inside_workspace,
            "CLAW_JOB_ID": self.job.job_id,
        }
        if self.job.network.policy == "proxy":
            env["CLAW_PROXY_URL"] = self.proxy_url_inside()
        if not self.backend.builds_images:  # a backend that runs the image has its ENV already
            env.update(self.job.image_env)
        env.update(self.job.env)
        return env

    async def lookup(self, program: str, command: Command, *, timeout_s: float) -> bool | None:
        """Whether `program`, the one `command` starts, exists in the job's environment as the
        command would find it: its shell's own ``command -v`` (builtins, keywords and PATH, in the
        job's root and working directory, with the job's env), run as a step of its own. None
        when the lookup gave no answer (it timed out, or its shell did not start). The runner
        calls this before the agent's command, while no agent process has run: its answer is the
        runner's."""
        probe = (
            f"command -v -- {shlex.quote(program)} >/dev/null 2>&1 "
            f"&& echo {_FOUND} || echo {_MISSING}"
        )
        r = await self.run(probe, timeout_s=timeout_s)
        words = r.stdout.split()
        if r.timed_out or r.exit_code != 0 or len(words) != 1:
            return None
        return {_FOUND: True, _MISSING: False}.get(words[0])

    def proxy_url_inside(self) -> str:
        return f"http://127.0.0.1:{self.job.network.port}"

    @abc.abstractmethod
    async def start(self) -> None:
        """Set up what the steps share (cgroup, proxy forwarder); InfraError when it cannot."""

    @abc.abstractmethod
    async def run(
        self, command: Command, *, timeout_s: float, merge_stderr: bool = False
    ) -> StepResult:
        """Run one step in the sandbox."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Kill whatever is left and release shared resources (not the job directory)."""

    def remove(self) -> None:
        if self.mounted:  # unmounting discards the tree at once, links and all
            _tmpfs.unmount(self.jobdir)
            self.mounted = False
        try:
            parent = _fsat.open_root(self.jobdir.parent)
        except FileNotFoundError:
            return
        try:  # no recursion: a job that planted a tree thousands of levels deep is removed too
            _fsat.remove_at(parent, self.jobdir.name)
        finally:
            os.close(parent)

    def remove_if_untouched(self) -> bool:
        """Remove the job directory if it is still the empty skeleton `prepare()` made (a job
        that left no file behind): a few rmdir calls, cheaper than a thread hop. False when
        anything is left (rmdir removes only empty directories and follows no symlink); the
        caller then runs `remove()`, which finishes the job."""
        if self.mounted:
            return False
        try:
            for d in (self.workspace, self.tmp / "home", self.tmp):
                os.rmdir(d)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.jobdir / _leftovers.LOCK_NAME)
            os.rmdir(self.jobdir)
        except OSError:
            return False
        return True


class Backend(abc.ABC):
    """A way to run jobs. `unavailable()` says why it cannot run here (None: it can)."""

    name: ClassVar[str]
    isolates: ClassVar[bool]
    warning: ClassVar[str] = ""
    builds_images: ClassVar[bool] = False  # runs jobs in their `image` (else image_run is skipped)
    runs_services: ClassVar[bool] = False  # starts a job's `services` (sidecar containers)

    @abc.abstractmethod
    def unavailable(self) -> str | None: ...

    @abc.abstractmethod
    def sandbox(self, job: Job, jobdir: Path) -> Sandbox: ...

    def check_job(self, job: Job) -> None:
        """Reject what this backend cannot do for a job (JobError, reported per job)."""
        if job.network.policy == "proxy" and job.network.port is None:
            raise JobError(f"job {job.job_id!r}: network/port: policy proxy needs a port")
        if job.services and not self.runs_services:
            names = ", ".join(s.name for s in job.services)
            raise JobError(
                f"job {job.job_id!r}: services: the {self.name} backend cannot start sidecar "
                f"containers ({names}); run the job on the docker backend"
            )


def venv_paths(command: Command) -> list[str]:
    """Directories a command's interpreter needs: the runner's and the command's venv, their base
    installations and the source directories of editable installs in them."""
    if isinstance(command, str):
        try:
            words = shlex.split(command)
        except ValueError:
            words = []
        first = words[0] if words else ""
    else:
        first = command[0]
    paths = [*venv_closure(sys.prefix), sys.base_prefix, _runner_bin_dir()]
    if first.startswith("/"):
        for parent in Path(first).parents:
            if (parent / "pyvenv.cfg").is_file():
                paths += venv_closure(str(parent))
                break
        paths.append(os.path.dirname(os.path.realpath(first)))
    return paths


@functools.cache
def _runner_bin_dir() -> str:
    return os.path.dirname(os.path.realpath(sys.executable))
