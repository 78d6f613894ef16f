"""Job directories left behind by a runner killed with SIGKILL, found and removed by the next run.

Every job directory holds a lock file that its runner keeps locked (flock) while the job is in
flight. The lock file is locked before it takes its name, so a directory whose lock file can be
locked by someone else belongs to no live runner: its runner died (the kernel dropped the lock).
A kept job directory (`keep`) loses its lock file when the job ends and is never removed. A
directory without a lock file (kept, or older than this scheme) is left alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
import time
from pathlib import Path

from claw_sandbox import _fsat, _tmpfs

LOCK_NAME = ".claw-job.lock"
ROOT_PREFIX = "claw-sandbox-"  # default roots: tempfile.mkdtemp(prefix=ROOT_PREFIX [+ "ray-"])
ROOT_MIN_AGE_S = 60.0  # an empty default root is removed only when untouched this long


def hold(jobdir: Path, name: str = LOCK_NAME) -> int:
    """Lock a fresh directory as in use (a job in flight, an image being unpacked): a lock file
    `name`, flock-held before it takes that name, so a sweeper never sees it unlocked while its
    owner lives; returns the fd to keep open until the work ends."""
    tmp = jobdir / f"{name}.{os.getpid()}"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(tmp, jobdir / name)
    except BaseException:
        os.close(fd)
        raise
    return fd


def release(fd: int | None, jobdir: Path, kept: bool) -> None:
    """The job has ended: a kept directory drops its lock file (never swept); then unlock."""
    if fd is None:
        return
    if kept:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(jobdir / LOCK_NAME)
    os.close(fd)


def sweep(root: Path) -> int:
    """Remove the job directories under `root` that no live runner holds; returns how many.

    Nothing is followed through a link: the root's entries are looked at through its fd, and a
    dead directory goes through the fd-based rmtree.
    """
    try:
        root_fd = _fsat.open_root(root)
    except OSError:
        return 0
    removed = 0
    try:
        with os.scandir(root_fd) as it:
            names = [e.name for e in it if e.is_dir(follow_symlinks=False)]
        for name in names:
            if _remove_if_dead(root_fd, name):
                removed += 1
    finally:
        os.close(root_fd)
    return removed


def _remove_if_dead(root_fd: int, name: str) -> bool:
    try:
        dfd = _fsat.open_subdir(root_fd, name)
    except OSError:
        return False
    try:
        try:
            lock = os.open(LOCK_NAME, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        except OSError:  # no lock file: kept, or not a job directory of this scheme
            return False
        try:
            if not stat.S_ISREG(os.fstat(lock).st_mode):
                return False
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a live runner holds it
            os.close(lock)
            return False
        try:  # hold the dead lock while removing, so two sweeping runners do not race
            with contextlib.suppress(OSError):  # a tmpfs job directory (limits.disk_mb)
                _tmpfs.unmount(f"/proc/self/fd/{dfd}")
            with contextlib.suppress(OSError):
                _fsat.remove_at(root_fd, name)
        finally:
            os.close(lock)
    finally:
        os.close(dfd)
    return True


def sweep_default_roots(own: Path | None = None, min_age_s: float = ROOT_MIN_AGE_S) -> int:
    """Sweep every default root of this user in the temp directory (`claw-sandbox-*`, made by
    runs that used no --workdir) and remove the roots left empty and untouched for `min_age_s`
    seconds (a root just made by a starting run is younger). Returns the job directories removed.
    """
    tmp = tempfile.gettempdir()
    removed = 0
    try:
        entries = [e for e in os.scandir(tmp) if e.name.startswith(ROOT_PREFIX)]
    except OSError:
        return 0
    now = time.time()
    for entry in entries:
        path = Path(entry.path)
        if own is not None and path == own:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            continue
        n = sweep(path)
        removed += n
        if n or now - st.st_mtime > min_age_s:
            with contextlib.suppress(OSError):
                os.rmdir(path)  # only when empty: kept sandboxes keep their root
    return removed
