"""Host-side workspace handling: build it from a job, place hidden verify files, collect results.

Everything here runs as the runner, possibly root, on a directory the sandboxed code could write
to. So no path is followed through a symlink the job may have planted: every operation walks
the tree through directory descriptors opened with O_NOFOLLOW (see `_fsat`); writes replace
links on the way, reads, collect and chown refuse or skip them.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import math
import os
import stat
import tarfile
import threading
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from claw_sandbox import _fsat
from claw_sandbox.errors import JobError
from claw_sandbox.records import DEFAULT_COLLECT_BYTES, DEFAULT_COLLECT_FILES, check_relpath

COLLECT_FILE_BYTES = 1 << 20  # a collected file is cut to its first MiB
COLLECT_MAX_ENTRIES = 100_000  # directory entries looked at by one collect, at most
COLLECT_MAX_DEPTH = 64  # directories deeper than this are not entered by collect


def _parts(rel: str) -> list[str]:
    return [p for p in PurePosixPath(rel).parts if p not in ("", ".")]


def safe_write(root: Path, rel: str, content: str | bytes, where: str = "workspace") -> None:
    """Write `rel` under `root`, creating directories, never following a symlink in the way
    (a link, file or directory standing where a directory or the file goes is replaced)."""
    check_relpath(rel, where, rel)
    parts = _parts(rel)
    if not parts:
        raise JobError(f"{where}: {rel!r}: not a file path")
    data = content.encode() if isinstance(content, str) else content
    root_fd = _fsat.open_root(root)
    try:
        _fsat.write_file(root_fd, parts, data)
    finally:
        os.close(root_fd)


def copy_into(src: str, dest: Path, where: str) -> None:
    """Copy a host directory or a .tar/.tar.gz/.tgz/.tar.xz/.tar.bz2 tarball into `dest`.

    `dest` may hold what a job left: nothing under it is followed through a link (a link where
    a directory or file of the source goes is replaced by it).
    """
    path = Path(src)
    if path.is_dir():
        kind = "dir"
    elif path.is_file() and tarfile.is_tarfile(path):
        kind = "tar"
    elif not path.exists():
        raise JobError(f"{where}: copy_from: {src!r} does not exist")
    else:
        raise JobError(f"{where}: copy_from: {src!r} is neither a directory nor a tarball")
    os.makedirs(dest, exist_ok=True)
    root_fd = _fsat.open_root(dest)
    try:
        if kind == "dir":
            _copy_tree(str(path), root_fd, where)
        else:
            _extract_tar(path, root_fd, where)
    finally:
        os.close(root_fd)


def _copy_tree(src: str, dir_fd: int, where: str) -> None:
    """Like shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True) with copy2's modes and
    times, writing only through descriptors opened without following links."""
    with os.scandir(src) as it:
        entries = list(it)
    for entry in entries:
        st = entry.stat(follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            _fsat.remove_at(dir_fd, entry.name)
            os.symlink(os.readlink(entry.path), entry.name, dir_fd=dir_fd)
        elif stat.S_ISDIR(st.st_mode):
            sub = _fsat.open_subdir(dir_fd, entry.name, create=True)
            try:
                _copy_tree(entry.path, sub, where)
            finally:
                os.close(sub)
        elif stat.S_ISREG(st.st_mode):
            out = _fsat.create_file(dir_fd, entry.name, stat.S_IMODE(st.st_mode))
            try:
                with open(entry.path, "rb") as fin:
                    while chunk := fin.read(1 << 20):
                        _write_all(out, chunk)
                os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
            finally:
                os.close(out)
        else:
            raise JobError(f"{where}: copy_from: {entry.path!r} is a device, fifo or socket")
    st = os.stat(src)
    os.fchmod(dir_fd, stat.S_IMODE(st.st_mode))
    os.utime(dir_fd, ns=(st.st_atime_ns, st.st_mtime_ns))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _extract_tar(path: Path, root_fd: int, where: str) -> None:
    """Extract a tarball member by member through descriptors (the `data` filter's rules:
    no absolute or `..` names, no links out, no devices; modes lose setuid and group/other
    write bits); a hard link becomes a copy of its target."""
    try:
        with tarfile.open(path) as tar:
            members = tar.getmembers()
            for member in members:
                _check_member(member, where)
            for member in members:
                parts = _parts(member.name)
                if not parts:
                    continue
                dfd = _fsat.open_dirs(root_fd, parts[:-1], create=True)
                try:
                    name = parts[-1]
                    if member.isdir():
                        sub = _fsat.open_subdir(dfd, name, create=True)
                        os.fchmod(sub, (member.mode & 0o755) | 0o700)
                        os.close(sub)
                    elif member.issym():
                        _fsat.remove_at(dfd, name)
                        os.symlink(member.linkname, name, dir_fd=dfd)
                    else:
                        fin = tar.extractfile(member)
                        out = _fsat.create_file(dfd, name, (member.mode & 0o755) | 0o600)
                        try:
                            while fin is not None and (chunk := fin.read(1 << 20)):
                                _write_all(out, chunk)
                            os.utime(out, (member.mtime, member.mtime))
                        finally:
                            os.close(out)
                finally:
                    os.close(dfd)
    except (tarfile.TarError, KeyError) as exc:
        raise JobError(f"{where}: copy_from: {path}: {exc}") from None


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


def build_workspace(
    ws: Path, files: dict[str, str | bytes], copy_from: str | None, where: str
) -> None:
    """Fill an empty workspace directory: copy_from first, then the inline files on top."""
    ws.mkdir(parents=True, exist_ok=True)
    if copy_from:
        copy_into(copy_from, ws, where)
    for rel, text in files.items():
        safe_write(ws, rel, text, where)


def chown_tree(root: Path, uid: int, gid: int) -> None:
    """Give the sandbox user the workspace (no symlink is followed)."""
    root_fd = _fsat.open_root(root)
    try:
        _fsat.chown_tree(root_fd, uid, gid)
    finally:
        os.close(root_fd)


def read_file(root: Path, rel: str, limit: int = COLLECT_FILE_BYTES) -> bytes:
    """The first `limit` bytes of the regular file `rel` under root, no link followed.

    FileNotFoundError when missing; OSError (ELOOP) when a component is a symlink;
    _fsat.NotRegularFile for a directory, fifo, socket or device.
    """
    root_fd = _fsat.open_root(root)
    try:
        return _fsat.read_file(root_fd, _parts(rel), limit)[0]
    finally:
        os.close(root_fd)


def read_inside(root: Path, rel: str, limit: int = COLLECT_FILE_BYTES) -> bytes | None:
    """Like :func:`read_file`, but None for anything but a regular file reached without links."""
    try:
        return read_file(root, rel, limit)
    except OSError:
        return None


def collect(
    root: Path,
    globs: Sequence[str],
    *,
    max_files: int = DEFAULT_COLLECT_FILES,
    max_bytes: int = DEFAULT_COLLECT_BYTES,
    stop: threading.Event | None = None,
) -> tuple[dict[str, str], str | None]:
    """Regular files matching the job's globs (relative to the workspace), as UTF-8 text, and a
    note saying why collecting stopped early (None when it did not).

    `**` matches any number of directories, `*` any name, hidden ones included. No symlink is
    followed or collected, so a link loop costs nothing. Each file is cut to its first MiB and
    undecodable bytes become U+FFFD. Collecting stops at `max_files` files, at `max_bytes` bytes
    in all as the texts take in the JSON record (escapes counted; the file reaching the cap is
    cut), after COLLECT_MAX_ENTRIES directory entries, and as soon as `stop` is set (the runner
    is shutting down).
    """
    patterns = [tuple(_parts(g)) for g in globs]
    notes: list[str] = []
    interrupted = "collect: interrupted (the runner is stopping)"
    root_fd = _fsat.open_root(root)
    try:
        found = _find(root_fd, patterns, notes, stop)
        if found is None:
            return {}, interrupted
        out = _read_found(root_fd, found, max_files, max_bytes, notes, stop)
        if out is None:
            return {}, interrupted
    finally:
        os.close(root_fd)
    return out, "; ".join(notes) or None


_Found = list[tuple[int, str, tuple[str, ...]]]  # (pattern index, rel path, its parts), sorted


def _find(
    root_fd: int,
    patterns: list[tuple[str, ...]],
    notes: list[str],
    stop: threading.Event | None,
) -> _Found | None:
    """The regular files matching a pattern (each under its first pattern), sorted; None when
    ``stop`` is set. Notes when the search was cut (too deep, too many entries)."""

    def descend(parts: tuple[str, ...]) -> bool:
        if len(parts) > COLLECT_MAX_DEPTH:
            too_deep = f"collect: directories deeper than {COLLECT_MAX_DEPTH} not searched"
            if too_deep not in notes:
                notes.append(too_deep)
            return False
        return any(_may_hold(p, parts) for p in patterns)

    found: _Found = []
    seen = 0
    walker = _fsat.walk(root_fd, descend)
    try:
        for _, parts, name, kind in walker:
            if stop is not None and stop.is_set():
                return None
            seen += 1
            if seen > COLLECT_MAX_ENTRIES:
                notes.append(
                    f"collect: stopped searching after {COLLECT_MAX_ENTRIES} directory entries"
                )
                break
            if kind != "file":
                continue
            path = (*parts, name)
            for i, pattern in enumerate(patterns):
                if _match(pattern, path):
                    found.append((i, "/".join(path), path))
                    break
    finally:
        walker.close()
    found.sort()
    return found


def _read_found(
    root_fd: int,
    found: _Found,
    max_files: int,
    max_bytes: int,
    notes: list[str],
    stop: threading.Event | None,
) -> dict[str, str] | None:
    """The found files' texts within max_files and max_bytes (JSON size); None when ``stop``
    is set. Notes when the limits cut the collection."""
    out: dict[str, str] = {}
    total = 0
    for n, (_, rel, path) in enumerate(found):
        if stop is not None and stop.is_set():
            return None
        if len(out) >= max_files:
            notes.append(
                f"collect: stopped at limits/collect_files={max_files} "
                f"({len(found) - n} more matching files not collected)"
            )
            break
        room = max_bytes - total
        if room <= 0:
            notes.append(
                f"collect: stopped at limits/collect_bytes={max_bytes} "
                f"({len(found) - n} more matching files not collected)"
            )
            break
        try:  # the text is never shorter in the record than the bytes read
            data, more = _fsat.read_file(root_fd, path, min(COLLECT_FILE_BYTES, room))
        except OSError:  # swapped for a link, removed, not a regular file
            continue
        text = data.decode("utf-8", errors="replace")
        size = _json_size(text)
        if size > room:
            text, size, more = _cut_to(text, room), room, True
        total += size
        out[rel] = text
        if more and room <= COLLECT_FILE_BYTES:
            notes.append(
                f"collect: stopped at limits/collect_bytes={max_bytes} ({rel} cut, "
                f"{len(found) - n - 1} more matching files not collected)"
            )
            break
    return out


def _json_size(text: str) -> int:
    """Bytes `text` takes in a JSON line (UTF-8, escapes for quotes, backslash and controls)."""
    return len(json.dumps(text, ensure_ascii=False).encode()) - 2


def _char_size(c: str) -> int:
    if c in '"\\\n\r\t\b\f':
        return 2
    return 6 if c < " " else len(c.encode())


def _cut_to(text: str, budget: int) -> str:
    """The longest prefix of `text` whose JSON size is at most `budget`."""
    used = 0
    for i, c in enumerate(text):
        used += _char_size(c)
        if used > budget:
            return text[:i]
    return text


@functools.lru_cache(maxsize=4096)
def _match(pattern: tuple[str, ...], path: tuple[str, ...]) -> bool:
    """Whether a path (components) matches a glob (components; `**` = any number of them)."""
    if not pattern:
        return not path
    if pattern[0] == "**":
        return any(_match(pattern[1:], path[k:]) for k in range(len(path) + 1))
    return bool(path) and fnmatch.fnmatchcase(path[0], pattern[0]) and _match(pattern[1:], path[1:])


def _may_hold(pattern: tuple[str, ...], dir_parts: tuple[str, ...]) -> bool:
    """Whether a file under the directory `dir_parts` could match the glob."""
    if not dir_parts:
        return bool(pattern)
    if not pattern:
        return False
    if pattern[0] == "**":
        return True
    return fnmatch.fnmatchcase(dir_parts[0], pattern[0]) and _may_hold(pattern[1:], dir_parts[1:])


def parse_reward(text: str) -> tuple[float, dict]:
    """A reward file: a float in [0, 1], or a JSON object of named sub-scores (reward = their mean).

    Raises ValueError with a clear message otherwise. A strict reader of docs/formats.md,
    Verifier reward file (held to formats/conformance/reward-file.jsonl).
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
