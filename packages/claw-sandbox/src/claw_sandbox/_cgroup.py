"""Per-job control groups (v2, or v1 where that is what the machine has) for limits and kill-all.

A job's processes enter its group through a tiny `sh` wrapper that writes its own pid into the
group's `cgroup.procs` and then execs the real command, so every descendant (also daemonized
ones) stays inside and can be killed together. Without a writable cgroup tree the backends fall
back to rlimits and process-group / namespace killing.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import time
import uuid
from pathlib import Path

import attrs

from claw_sandbox._proc import pid_alive
from claw_sandbox.records import Limits

ROOT = Path("/sys/fs/cgroup")
ENTER_FAILED = "claw-sandbox: cannot enter the job's cgroup"
V1_CONTROLLERS = ("memory", "pids", "cpu")
RUNNER_LEAF = "claw-runner"  # cgroup v2: where a runner alone in its cgroup moves itself


@attrs.frozen
class CgroupSupport:
    version: int | None  # 2, 1 or None
    base: tuple[Path, ...] = ()  # v2: (base,), v1: one base per controller in V1_CONTROLLERS
    reason: str = ""


def _writable_dir(path: Path) -> bool:
    try:
        path.mkdir(exist_ok=True)
    except OSError:
        return False
    probe = path / f"probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
        probe.rmdir()
        return True
    except OSError:
        return False


def own_cgroups(text: str | None = None) -> dict[str, str]:
    """This process's cgroup per v1 controller (and "" for the v2 tree): /proc/self/cgroup."""
    if text is None:
        try:
            text = Path("/proc/self/cgroup").read_text()
        except OSError:
            return {}
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for ctl in parts[1].split(",") if parts[1] else [""]:
                out[ctl] = parts[2]
    return out


def _below(mount: Path, own: str) -> Path:
    rel = own.strip("/")
    if rel and not (mount / rel).is_dir():  # a cgroup namespace the mount does not match
        rel = ""
    return mount / rel if rel else mount


def detect(name: str = "claw-sandbox") -> CgroupSupport:
    """Find a cgroup tree this process may create job groups in: `NAME` below the runner's own
    cgroup (per controller on v1), so a job is charged and bounded where the runner is
    (override: CLAW_SANDBOX_CGROUP)."""
    override = os.environ.get("CLAW_SANDBOX_CGROUP")
    own = own_cgroups()
    if (ROOT / "cgroup.controllers").exists():  # pure v2
        here = _below(ROOT, own.get("", "/"))
        if here.name == RUNNER_LEAF:  # moved there by an earlier detect() of this runner
            here = here.parent
        base = Path(override) if override else here / name
        want = {"memory", "pids", "cpu"}
        if not override and here != ROOT:
            _leave_for_leaf(here)
        if not _writable_dir(base):
            return CgroupSupport(
                None, reason=f"cgroup v2 at {ROOT} but {base} is not writable (not root?)"
            )
        for parent in [base.parent, base] if not override else [base]:
            ctl = parent / "cgroup.subtree_control"
            with contextlib.suppress(OSError):
                have = set((parent / "cgroup.controllers").read_text().split())
                ctl.write_text(" ".join(f"+{c}" for c in sorted(want & have)))
        enabled = set((base / "cgroup.subtree_control").read_text().split())
        if not {"memory", "pids"} <= enabled:
            return CgroupSupport(
                None,
                reason=f"cgroup v2: cannot enable memory+pids in {base} (have {sorted(enabled)};"
                " the runner's cgroup must hold no other process, or set CLAW_SANDBOX_CGROUP)",
            )
        return _swept(CgroupSupport(2, (base,), "cgroup v2"))
    bases = []
    for controller in V1_CONTROLLERS:
        mount = ROOT / controller
        if not mount.is_dir():
            alt = [p for p in ROOT.glob(f"*{controller}*") if p.is_dir()]
            if not alt:
                return CgroupSupport(
                    None, reason=f"no cgroup v1 {controller} hierarchy under {ROOT}"
                )
            mount = alt[0]
        base = _below(mount, own.get(controller, "/")) / name
        if not _writable_dir(base):
            return CgroupSupport(
                None, reason=f"cgroup v1 {controller} hierarchy {base} is not writable (not root?)"
            )
        bases.append(base)
    return _swept(CgroupSupport(1, tuple(bases), "cgroup v1"))


def _leave_for_leaf(here: Path) -> None:
    """cgroup v2 gives a group's children controllers only while the group itself holds no
    process. When the runner is alone in its cgroup, it moves into a leaf `claw-runner` there."""
    try:
        procs = (here / "cgroup.procs").read_text().split()
        if procs != [str(os.getpid())]:
            return
        leaf = here / RUNNER_LEAF
        leaf.mkdir(exist_ok=True)
        (leaf / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        return


def _swept(support: CgroupSupport) -> CgroupSupport:
    sweep_stale(support)
    return support


def sweep_stale(support: CgroupSupport) -> int:
    """Remove job groups left by runners that died (killed with SIGKILL); returns how many."""
    removed = 0
    for base in support.base:
        with contextlib.suppress(OSError):
            for entry in os.scandir(base):
                parts = entry.name.rsplit("-", 2)
                if not entry.is_dir() or len(parts) != 3 or not parts[1].isdigit():
                    continue
                if pid_alive(int(parts[1])):
                    continue
                group = JobCgroup(support, [Path(entry.path)])
                group.kill_all(deadline_s=1.0)
                with contextlib.suppress(OSError):
                    os.rmdir(entry.path)
                    removed += 1
    return removed


@attrs.define
class JobCgroup:
    """One job's group(s); `wrap(argv)` makes a command enter them before exec."""

    support: CgroupSupport
    dirs: list[Path]

    @classmethod
    def create(cls, support: CgroupSupport, limits: Limits, tag: str) -> JobCgroup:
        name = f"{tag[:40]}-{os.getpid()}-{uuid.uuid4().hex[:10]}"  # runner pid: see sweep_stale
        dirs = [b / name for b in support.base]
        for d in dirs:
            d.mkdir()
        group = cls(support, dirs)
        try:
            group._limit(limits)
        except OSError:
            group.destroy()
            raise
        return group

    def _limit(self, limits: Limits) -> None:
        if self.support.version == 2:
            d = self.dirs[0]
            if limits.memory_mb:
                (d / "memory.max").write_text(str(limits.memory_mb << 20))
                with contextlib.suppress(OSError):
                    (d / "memory.swap.max").write_text("0")
            if limits.pids:
                (d / "pids.max").write_text(str(limits.pids))
            if limits.cpus and (d / "cpu.max").exists():
                (d / "cpu.max").write_text(f"{int(limits.cpus * 100000)} 100000")
            return
        mem, pids, cpu = self.dirs
        if limits.memory_mb:
            (mem / "memory.limit_in_bytes").write_text(str(limits.memory_mb << 20))
            with contextlib.suppress(OSError):
                (mem / "memory.memsw.limit_in_bytes").write_text(str(limits.memory_mb << 20))
        if limits.pids:
            (pids / "pids.max").write_text(str(limits.pids))
        if limits.cpus:
            (cpu / "cpu.cfs_period_us").write_text("100000")
            (cpu / "cpu.cfs_quota_us").write_text(str(int(limits.cpus * 100000)))

    def wrap(self, argv: list[str]) -> list[str]:
        writes = " && ".join(f"echo $$ > {shlex.quote(str(d / 'cgroup.procs'))}" for d in self.dirs)
        script = (
            f'{{ {writes}; }} 2>/dev/null || {{ echo "{ENTER_FAILED}" >&2; exit 125; }}; exec "$@"'
        )
        return ["/bin/sh", "-c", script, "claw-enter", *argv]

    def pids(self) -> list[int]:
        out: set[int] = set()
        for d in self.dirs:
            with contextlib.suppress(OSError):
                out.update(int(x) for x in (d / "cgroup.procs").read_text().split())
        return sorted(out)

    def kill_all(self, deadline_s: float = 5.0) -> None:
        """SIGKILL every process in the group until it is empty (a fork bomb cannot outrun it)."""
        if self.support.version == 2 and (self.dirs[0] / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                (self.dirs[0] / "cgroup.kill").write_text("1")
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.002)

    def memory_exceeded(self) -> bool:
        """Whether the memory limit was hit (the kernel OOM-killed inside or refused memory)."""
        try:
            if self.support.version == 2:
                events = dict(
                    line.split()
                    for line in (self.dirs[0] / "memory.events").read_text().splitlines()
                )
                return int(events.get("oom_kill", 0)) > 0 or int(events.get("max", 0)) > 0
            mem = self.dirs[0]
            oom = dict(
                line.split() for line in (mem / "memory.oom_control").read_text().splitlines()
            )
            return int(oom.get("oom_kill", 0)) > 0 or int((mem / "memory.failcnt").read_text()) > 0
        except (OSError, ValueError):
            return False

    def limit_notes(self, limits: Limits) -> list[str]:
        """What to say in the run's `error` about limits the step ran into."""
        notes = []
        if limits.memory_mb and self.memory_exceeded():
            notes.append(f"memory limit exceeded ({limits.memory_mb} MB)")
        if limits.pids and self.pids_exceeded():
            notes.append(f"pids limit reached ({limits.pids})")
        return notes

    def pids_exceeded(self) -> bool:
        d = self.dirs[0] if self.support.version == 2 else self.dirs[1]
        try:
            events = dict(line.split() for line in (d / "pids.events").read_text().splitlines())
            return int(events.get("max", 0)) > 0
        except (OSError, ValueError):
            return False

    def destroy(self) -> None:
        self.kill_all()
        for d in self.dirs:
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)
