"""Before a verify step, the places the verifier writes to are made the verifier's alone.

The job ran as the same user the verifier runs as, so it could leave anything at the reward
path: a file holding 1 in a read-only directory (the verifier's own `rm` and write then fail and
the planted file would be read), a link, a fifo, a directory, a 10 GB sparse file. The runner
removes all of it host side, through directory descriptors that follow no link (`_fsat`), and
gives every directory on the way back to the sandbox user (owner, mode 0755). A directory the
job made unreadable or unwritable is opened up first, so a runner without root (whose job runs
as its own uid) can remove what the job left, too.

The job's processes are gone by then (each backend kills a step's whole tree when it ends, and
the docker trial container's leftovers are killed before verification), so whatever stands at
the reward path after the verify step was written during it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from claw_sandbox import _fsat

DIR_MODE = 0o755


def _parts(rel: str) -> list[str]:
    path = PurePosixPath(rel)
    if path.is_absolute() or ".." in path.parts:
        raise OSError(errno.EINVAL, f"{rel!r} is not a path inside the job's directory")
    return [p for p in path.parts if p not in ("", ".")]


@contextlib.contextmanager
def _parent_of(root: Path, parts: list[str], owner: tuple[int, int] | None) -> Iterator[int]:
    """fd of root/parts[:-1], each directory on the way made real, owned and mode 0755."""
    root_fd = _fsat.open_root(root)
    try:
        dfd = _open_way(root_fd, parts[:-1], owner)
        try:
            yield dfd
        finally:
            os.close(dfd)
    finally:
        os.close(root_fd)


def reset_file(root: Path, rel: str, owner: tuple[int, int] | None) -> None:
    """Remove whatever stands at root/rel, and make root and every directory on the way to rel a
    real directory owned by `owner` (None: left as it is) with mode 0755. OSError when it cannot."""
    parts = _parts(rel)
    with _parent_of(root, parts, owner) as dfd:
        if parts:
            _remove(dfd, parts[-1])


def reset_dir(root: Path, rel: str, owner: tuple[int, int] | None) -> None:
    """Make root/rel an empty directory owned by `owner` with mode 0755 (what stood there goes:
    a file, a link, a tree), its parents as in :func:`reset_file`. With rel empty, root itself is
    emptied (it stays: it is mounted where the sandbox sees it)."""
    parts = _parts(rel)
    with _parent_of(root, parts, owner) as dfd:
        if parts:
            _remove(dfd, parts[-1])
            sub = _open_dir(dfd, parts[-1])
        else:
            sub = os.dup(dfd)
        try:
            _claim(sub, owner)
            for name in os.listdir(sub):
                _remove(sub, name)
        finally:
            os.close(sub)


def _claim(fd: int, owner: tuple[int, int] | None) -> None:
    if owner is not None:
        os.fchown(fd, *owner)
    os.fchmod(fd, DIR_MODE)


def _open_way(root_fd: int, parts: list[str], owner: tuple[int, int] | None) -> int:
    """fd of root/parts..., each a real directory (a link or file in the way is replaced),
    claimed for the sandbox user on the way down."""
    fd = os.dup(root_fd)
    try:
        _claim(fd, owner)
        for part in parts:
            sub = _open_dir(fd, part)
            os.close(fd)
            fd = sub
            _claim(fd, owner)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_dir(dir_fd: int, name: str) -> int:
    """The directory `name` (made when missing, replacing a link or file), even when the job took
    its read permission away (a runner that is not root)."""
    try:
        return _fsat.open_subdir(dir_fd, name, create=True, mode=DIR_MODE)
    except PermissionError:
        if not _is_dir(dir_fd, name):
            raise
        os.chmod(name, 0o700, dir_fd=dir_fd)  # a directory, not a link: nothing is followed
        return _fsat.open_subdir(dir_fd, name, create=True, mode=DIR_MODE)


def _is_dir(dir_fd: int, name: str) -> bool:
    return stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)


def _remove(dir_fd: int, name: str) -> None:
    """Remove an entry and all under it, at any depth and whatever modes the job set on its
    directories (see :func:`_fsat.rmtree_at`)."""
    _fsat.remove_at(dir_fd, name)
