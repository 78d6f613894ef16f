"""A size-capped tmpfs on a job directory: the disk limit (`limits.disk_mb`) where we may mount.

Mounting needs CAP_SYS_ADMIN in the mount namespace that holds the job directories, so only a
runner started as root uses it. The job's writes past the size fail with ENOSPC; what the job
writes there is memory and counts against its memory limit (the kernel charges tmpfs pages to
the writer's cgroup). Unmounting (lazily) discards the whole tree at once.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os

MS_NOSUID, MS_NODEV = 0x2, 0x4
MNT_DETACH = 0x2


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def can_mount() -> bool:
    return os.geteuid() == 0 and hasattr(_libc(), "mount")


def mount(path: str | os.PathLike, size_mb: int) -> None:
    """Mount a fresh tmpfs of `size_mb` MiB (nosuid, nodev, mode 0755) on the directory."""
    opts = f"size={int(size_mb)}m,mode=0755".encode()
    if _libc().mount(b"tmpfs", os.fsencode(path), b"tmpfs", MS_NOSUID | MS_NODEV, opts) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot mount a tmpfs on {os.fspath(path)}: {os.strerror(err)}")


def unmount(path: str | os.PathLike) -> bool:
    """Detach the mount on `path` (its files vanish); False when nothing was mounted there."""
    if _libc().umount2(os.fsencode(path), MNT_DETACH) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOENT):  # not a mount point / gone
        return False
    raise OSError(err, f"cannot unmount {os.fspath(path)}: {os.strerror(err)}")
