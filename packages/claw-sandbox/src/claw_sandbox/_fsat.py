"""File operations inside a job's tree that never follow a symlink the job could have planted.

The runner (often root) works on directories the sandboxed code wrote to. Every operation here
starts from a directory file descriptor and opens each path component relative to its parent
with ``O_NOFOLLOW``, so no component is ever resolved through a link, whatever the job left and
even if it swaps entries while the runner works:

- writes replace what stands in the way (the link itself is unlinked, never its target);
- reads and walks refuse links (``OSError`` with ``ELOOP``) and anything not a regular file;
- removal (:func:`rmtree_at`) walks with one directory fd at a time, enters no link, and works at
  any depth and whatever modes the job left (a tree deeper than Python's recursion limit, or a
  directory the job made unreadable, is removed all the same).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Generator, Iterator, Sequence

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_SWAP_TRIES = 8  # a concurrent writer swapping an entry back and forth: give up after this


Entry = tuple[int, tuple[str, ...], str, str]


class NotRegularFile(OSError):
    """The path names a directory, fifo, socket or device, not a regular file."""


def open_root(path: str | os.PathLike) -> int:
    """A directory fd for `path`; its last component must not be a symlink."""
    return os.open(path, DIR_FLAGS)


def remove_at(dir_fd: int, name: str) -> None:
    """Remove the entry `name` of a directory: a link or file is unlinked, a directory removed
    with everything in it (no link is followed). A missing entry is not an error."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    try:
        if stat.S_ISDIR(st.st_mode):
            rmtree_at(dir_fd, name)
        else:
            os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def rmtree_at(dir_fd: int, name: str) -> None:
    """Remove the directory `name` of `dir_fd` and everything under it, without recursion.

    Depth first with a single open directory fd: files and links are unlinked (never followed),
    the walk enters a subdirectory by name with ``O_NOFOLLOW`` and comes back up through ``..``,
    checking that ``..`` is the directory it came from (device and inode), so a tree moved while
    the runner works is an error, never a walk elsewhere. A directory the job made unreadable or
    unwritable is given mode 0700 first (its owner, or root, may)."""
    fd = _open_for_removal(dir_fd, name)
    way: list[tuple[tuple[int, int], str]] = []  # per level below `name`: (parent's id, name)
    try:
        while True:
            sub = _empty_files(fd)
            if sub is not None:
                child = _open_for_removal(fd, sub)
                way.append((_ident(fd), sub))
                os.close(fd)
                fd = child
                continue
            if not way:
                break
            parent_id, me = way.pop()
            parent = os.open("..", DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            if _ident(fd) != parent_id:
                raise OSError(errno.ESTALE, f"{name!r}: a directory moved while it was removed")
            os.rmdir(me, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)


def _ident(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _open_for_removal(dir_fd: int, name: str) -> int:
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:  # made unreadable by the job: a directory, not a link (O_NOFOLLOW)
        _chmod_dir(dir_fd, name, 0o700)
        fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    if os.fstat(fd).st_mode & 0o700 != 0o700:
        with contextlib.suppress(PermissionError):  # root needs no bits; others do
            os.fchmod(fd, 0o700)
    return fd


def _chmod_dir(dir_fd: int, name: str, mode: int) -> None:
    """chmod the directory `name` itself, never a link's target: through an ``O_PATH`` fd of
    it (which needs no permission on it) where /proc can name that fd."""
    try:
        pfd = os.open(
            name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except AttributeError:  # no O_PATH (not Linux)
        os.chmod(name, mode, dir_fd=dir_fd)
        return
    try:
        os.chmod(f"/proc/self/fd/{pfd}", mode)
    finally:
        os.close(pfd)


def _empty_files(fd: int) -> str | None:
    """Unlink every entry of the directory `fd` that is not a directory; the name of its first
    subdirectory, or None when it is empty."""
    with os.scandir(fd) as it:
        entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
    for entry, is_dir in entries:
        if is_dir:
            return entry
        with contextlib.suppress(FileNotFoundError):
            os.unlink(entry, dir_fd=fd)
    return None


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def open_subdir(dir_fd: int, name: str, create: bool = False, mode: int = 0o755) -> int:
    """fd of the directory `name` under `dir_fd`, never through a link.

    create: make it if missing and replace a link, file or anything else standing there.
    Otherwise a link raises OSError(ELOOP), a non-directory NotADirectoryError.
    """
    for _ in range(_SWAP_TRIES):
        try:
            return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            if not create:
                raise
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, mode, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            if create:
                remove_at(dir_fd, name)
                continue
            if _is_link(dir_fd, name):  # O_DIRECTORY on a link says ENOTDIR
                raise OSError(errno.ELOOP, f"{name!r} is a symbolic link") from None
            raise
    raise OSError(errno.ELOOP, f"{name!r} keeps changing under the runner")


def open_dirs(root_fd: int, parts: Sequence[str], create: bool = False) -> int:
    """fd of root/parts[0]/parts[1]/..., each component opened by :func:`open_subdir`."""
    fd = os.dup(root_fd)
    try:
        for part in parts:
            sub = open_subdir(fd, part, create)
            os.close(fd)
            fd = sub
    except BaseException:
        os.close(fd)
        raise
    return fd


def create_file(dir_fd: int, name: str, mode: int = 0o644) -> int:
    """A new, empty regular file `name` open for writing; whatever stood there is removed first."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(_SWAP_TRIES):
        remove_at(dir_fd, name)
        try:
            fd = os.open(name, flags, mode, dir_fd=dir_fd)
        except FileExistsError:
            continue
        os.fchmod(fd, mode)  # exactly `mode`, whatever the umask
        return fd
    raise OSError(errno.EEXIST, f"{name!r} keeps reappearing under the runner")


def write_file(root_fd: int, parts: Sequence[str], data: bytes, mode: int = 0o644) -> None:
    """Write root/parts... afresh, creating directories and replacing links on the way."""
    dfd = open_dirs(root_fd, parts[:-1], create=True)
    try:
        fd = create_file(dfd, parts[-1], mode)
    finally:
        os.close(dfd)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def read_file(root_fd: int, parts: Sequence[str], limit: int) -> tuple[bytes, bool]:
    """The first `limit` bytes of the regular file root/parts..., and whether it holds more.

    FileNotFoundError when missing, OSError(ELOOP) when any component is a link,
    NotRegularFile for a directory, fifo, socket or device (never opened for reading blocking).
    """
    dfd = open_dirs(root_fd, parts[:-1])
    try:
        fd = os.open(
            parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd
        )
    finally:
        os.close(dfd)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(errno.EINVAL, f"{'/'.join(parts)} is not a regular file")
        data = f.read(limit + 1)
    return data[:limit], len(data) > limit


def walk(root_fd: int, descend: Callable[[tuple[str, ...]], bool]) -> Generator[Entry, None, None]:
    """Every entry under root_fd, depth first in directory order: (dir fd, the directory's parts,
    name, kind) with kind "dir", "file" (regular), "link" or "other". Only real directories are
    entered, and only those for which `descend(parts)` is true; one directory fd (and one
    listing) stays open per level, so a wide tree costs no more descriptors than a narrow one.
    The dir fd is valid until the generator is resumed."""
    stack: list[tuple[int, tuple[str, ...], Iterator[os.DirEntry]]] = []

    def push(fd: int, parts: tuple[str, ...]) -> None:
        try:
            stack.append((fd, parts, os.scandir(fd)))
        except OSError:
            os.close(fd)
            raise

    push(os.dup(root_fd), ())
    try:
        while stack:
            fd, parts, it = stack[-1]
            try:
                entry = next(it, None)
            except OSError:  # the directory went away under the walk
                entry = None
            if entry is None:
                stack.pop()
                it.close()  # type: ignore[attr-defined]
                os.close(fd)
                continue
            try:
                if entry.is_symlink():
                    kind = "link"
                elif entry.is_dir(follow_symlinks=False):
                    kind = "dir"
                elif entry.is_file(follow_symlinks=False):
                    kind = "file"
                else:
                    kind = "other"
            except OSError:
                continue
            yield fd, parts, entry.name, kind
            sub_parts = (*parts, entry.name)
            if kind == "dir" and descend(sub_parts):
                try:
                    push(open_subdir(fd, entry.name), sub_parts)
                except OSError:  # replaced by a link or removed since it was listed
                    continue
    finally:
        for fd, _, it in stack:
            it.close()  # type: ignore[attr-defined]
            os.close(fd)


def chown_tree(root_fd: int, uid: int, gid: int) -> None:
    """Give a tree to uid:gid: links themselves are changed (never their targets), and only real
    directories are entered."""
    os.fchown(root_fd, uid, gid)
    for dir_fd, _, name, _ in walk(root_fd, lambda parts: True):
        try:
            os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
