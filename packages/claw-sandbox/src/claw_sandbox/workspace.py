"""Host-side workspace handling: build it from a job, place hidden verify files, collect results.

Everything here runs as the runner, possibly root, on a directory the sandboxed code could write
to. So no path is followed through a symlink the job may have planted: writes replace symlinks
on the way, reads refuse anything that resolves outside the workspace.
"""

from __future__ import annotations

import glob
import json
import math
import os
import shutil
import stat
import tarfile
from pathlib import Path

from claw_sandbox.errors import JobError
from claw_sandbox.records import check_relpath

COLLECT_FILE_BYTES = 1 << 20  # a collected file is cut to its first MiB


def safe_write(root: Path, rel: str, content: str | bytes, where: str = "workspace") -> Path:
    """Write `rel` under `root`, creating directories, never following a symlink in the way."""
    check_relpath(rel, where, rel)
    parts = Path(rel).parts
    cur = root
    for part in parts[:-1]:
        cur = cur / part
        try:
            st = os.lstat(cur)
            if not stat.S_ISDIR(st.st_mode):
                _remove(cur)
                os.mkdir(cur)
        except FileNotFoundError:
            os.mkdir(cur)
    target = cur / parts[-1]
    if os.path.lexists(target):
        _remove(target)
    data = content.encode() if isinstance(content, str) else content
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return target


def _remove(path: Path) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def copy_into(src: str, dest: Path, where: str) -> None:
    """Copy a host directory or a .tar/.tar.gz/.tgz/.tar.xz/.tar.bz2 tarball into `dest`."""
    path = Path(src)
    if path.is_dir():
        shutil.copytree(path, dest, symlinks=True, dirs_exist_ok=True)
    elif path.is_file() and tarfile.is_tarfile(path):
        with tarfile.open(path) as tar:
            members = tar.getmembers()
            for member in members:
                _check_member(member, where)
            if hasattr(tarfile, "data_filter"):
                try:
                    tar.extractall(dest, filter="data")
                except tarfile.FilterError as exc:
                    raise JobError(f"{where}: copy_from: {exc}") from None
            else:  # Python < 3.11.4: the checks above stand in for the data filter
                for member in members:
                    member.mode &= 0o777 if member.isdir() else 0o755
                    member.uid = member.gid = 0
                tar.extractall(dest, members=members, numeric_owner=True)
    elif not path.exists():
        raise JobError(f"{where}: copy_from: {src!r} does not exist")
    else:
        raise JobError(f"{where}: copy_from: {src!r} is neither a directory nor a tarball")


def _check_member(member: tarfile.TarInfo, where: str) -> None:
    """Refuse tarball members that would land, or point, outside the workspace, and devices."""
    parts = Path(member.name).parts
    if member.name.startswith("/") or ".." in parts:
        raise JobError(f"{where}: copy_from: tarball member {member.name!r} escapes the workspace")
    if member.isdev() or member.isfifo():
        raise JobError(f"{where}: copy_from: tarball member {member.name!r} is a device or fifo")
    if member.issym() or member.islnk():
        base = os.path.dirname(member.name) if member.issym() else ""
        target = os.path.normpath(os.path.join(base, member.linkname))
        if member.linkname.startswith("/") or target == ".." or target.startswith("../"):
            raise JobError(
                f"{where}: copy_from: tarball link {member.name!r} points outside the workspace"
            )


def build_workspace(ws: Path, files: dict[str, str], copy_from: str | None, where: str) -> None:
    """Fill an empty workspace directory: copy_from first, then the inline files on top."""
    ws.mkdir(parents=True, exist_ok=True)
    if copy_from:
        copy_into(copy_from, ws, where)
    for rel, text in files.items():
        safe_write(ws, rel, text, where)


def chown_tree(root: Path, uid: int, gid: int) -> None:
    """Give the sandbox user the workspace (no symlink is followed)."""
    os.lchown(root, uid, gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, gid)


def _inside(root: Path, path: str) -> bool:
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    return real == real_root or real.startswith(real_root + os.sep)


def read_inside(root: Path, rel: str, limit: int = COLLECT_FILE_BYTES) -> bytes | None:
    """Read a regular file under root, or None if missing or resolving outside the workspace."""
    full = os.path.join(root, rel)
    if not _inside(root, full):
        return None
    try:
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a directory, fifo, device: not collected
        os.close(fd)
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read(limit)


def collect(root: Path, globs: tuple[str, ...] | list[str]) -> dict[str, str]:
    """Files matching the job's globs (relative to the workspace), as UTF-8 text.

    `**` matches across directories. Files resolving outside the workspace (symlinks) are
    skipped; files over 1 MiB are cut; undecodable bytes become U+FFFD.
    """
    out: dict[str, str] = {}
    for pattern in globs:
        for rel in sorted(glob.glob(pattern, root_dir=root, recursive=True, include_hidden=True)):
            if rel in out:
                continue
            data = read_inside(root, rel)
            if data is not None:
                out[rel] = data.decode("utf-8", errors="replace")
    return out


def parse_reward(text: str) -> tuple[float, dict]:
    """A reward file: a float in [0, 1], or a JSON object of named sub-scores (reward = their mean).

    Raises ValueError with a clear message otherwise.
    """
    text = text.strip()
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(
            f"reward file is neither a number nor a JSON object: {text[:80]!r}"
        ) from None
    if isinstance(value, bool):
        raise ValueError("reward file holds a boolean, not a number")
    if isinstance(value, int | float):
        return _unit(float(value), "reward"), {}
    if isinstance(value, dict) and value:
        scores = {}
        for k, v in value.items():
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ValueError(f"sub-score {k!r} is not a number: {v!r}")
            scores[k] = _unit(float(v), f"sub-score {k!r}")
        return sum(scores.values()) / len(scores), scores
    raise ValueError(f"reward file must hold a number or a non-empty object, got {text[:80]!r}")


def _unit(x: float, what: str) -> float:
    if not math.isfinite(x) or not 0.0 <= x <= 1.0:
        raise ValueError(f"{what} {x} is outside [0, 1]")
    return x
