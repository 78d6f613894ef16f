"""OCI images without a daemon: unpack an OCI image layout directory or a `docker save` archive
into a root filesystem the bwrap backend can use as `/`.

The archive is untrusted. A layer is read through once before any of it is applied: its digest
(and the config's diff_id for it) must match, and its members must fit the image's `Budget`.
Layers are then applied member by member under the rootfs, every path opened from the root's
directory fd one component at a time with ``O_NOFOLLOW``, so nothing outside the root is ever
written, removed or chmodded: a name with a `..` component, a path through a symlink (`a/b`
where `a` is a link) or a hard link to anything but a regular file of the rootfs is refused with
an `ImageError`; device nodes and fifos are skipped (one note); setuid/setgid bits are dropped.
Whiteouts (`.wh.NAME`, `.wh..wh..opq`) remove what lower layers left. The `Budget` (bytes of
regular files by apparent size, and entries, all layers together) is charged member by member
before each is written; a sparse member is written sparse (its holes take no disk) but counts
its apparent size. Images are cached under `cache_root()` by content only (the config digest,
with the layers' content digests when the config lists no diff_ids), unpacked into a temporary
directory (``.unpack-*``) that is renamed into place only when complete. The unpacker holds a flock on the directory's ``.unpack.lock`` while it works, so
the directory of one that was killed (the kernel dropped its lock) is swept by the next
`unpack` into that cache; one without a lock file (an older claw-sandbox's, or one caught in its
first instant) only once it is ``STALE_AGE_S`` old.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gzip
import hashlib
import json
import os
import platform
import posixpath
import shutil
import stat
import tarfile
import tempfile
import time
import zlib
from pathlib import Path
from typing import IO, Any

import attrs

from claw_sandbox import _fsat, _leftovers
from claw_sandbox.errors import ImageError

WHITEOUT = ".wh."
#: platform.machine() -> the OCI architecture name
ARCHES = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le"}
OPAQUE = ".wh..wh..opq"
UNPACKING = ".unpack-"  # the prefix of an unpack's temporary directory in the cache
LOCK = ".unpack.lock"  # in it: flock-held by the unpacker while it works
STALE_AGE_S = 3600.0  # a temporary directory without a lock file is swept after this long
MAX_BYTES = 8 << 30  # the default budget of one image: bytes of regular files (apparent size)
MAX_FILES = 1_000_000  # ... and entries (files, directories, links)
MAX_HEADER = 1 << 20  # a pax or GNU long-name header larger than this is refused
MAX_TRAILER = 4 << 20  # bytes allowed after a layer tar's end-of-archive blocks


@attrs.frozen(kw_only=True)
class Budget:
    """What unpacking one image may write, all its layers together, charged member by member
    before each is written (a file a later layer replaces or removes still counts):
    ``max_bytes`` of regular files by apparent size (a sparse file is kept sparse on disk but
    counts its holes, which anything that copies it writes out) and ``max_files`` entries
    (files, directories, links, and the parent directories a layer implies)."""

    max_bytes: int = attrs.field(default=MAX_BYTES, validator=attrs.validators.gt(0))
    max_files: int = attrs.field(default=MAX_FILES, validator=attrs.validators.gt(0))


@attrs.define
class _Usage:
    """What the layers applied so far have written, against a budget."""

    budget: Budget
    bytes: int = 0
    files: int = 0

    def charge(self, where: str, member: str, nbytes: int, files: int) -> None:
        """Count a member (before writing it); over the budget is an error naming it."""
        self.bytes += nbytes
        self.files += files
        if self.files > self.budget.max_files:
            raise ImageError(f"{where}: member {member!r}: {self.files} entries, over the image "
                             f"budget of {self.budget.max_files} files")  # fmt: skip
        if self.bytes > self.budget.max_bytes:
            raise ImageError(f"{where}: member {member!r} ({nbytes} bytes): {self.bytes} bytes "
                             f"in all, over the image budget of {self.budget.max_bytes} bytes")  # fmt: skip


@attrs.frozen(kw_only=True)
class Image:
    """An unpacked image: its root filesystem and the config's ENV, WORKDIR and USER."""

    rootfs: Path
    env: dict[str, str]
    workdir: str
    user: str
    digest: str  # the config's digest, "sha256:<hex>"
    notes: tuple[str, ...] = ()


def cache_root() -> Path:
    """Where unpacked images live: $CLAW_SANDBOX_IMAGE_CACHE, else
    $XDG_CACHE_HOME/claw-sandbox/images (default ~/.cache/claw-sandbox/images; for root,
    /var/cache/claw-sandbox/images)."""
    if os.environ.get("CLAW_SANDBOX_IMAGE_CACHE"):
        return Path(os.environ["CLAW_SANDBOX_IMAGE_CACHE"])
    if os.geteuid() == 0 and not os.environ.get("XDG_CACHE_HOME"):
        # root's ~ is 0700; the sandbox's unprivileged uid must reach the rootfs
        return Path("/var/cache/claw-sandbox/images")
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "claw-sandbox" / "images"


class _Source:
    """The files of an image: a layout directory or a tar archive, read by relative name."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tar = None if path.is_dir() else _open_tar(path)
        self.names = set() if self.tar is None else {_clean(m.name) for m in self.tar.getmembers()}

    def close(self) -> None:
        if self.tar is not None:
            self.tar.close()

    def has(self, name: str) -> bool:
        return (self.path / name).is_file() if self.tar is None else _clean(name) in self.names

    def open(self, name: str) -> IO[bytes]:
        if ".." in name.split("/") or name.startswith("/"):
            raise ImageError(f"{self.path}: refers to {name!r}, outside the image")
        if self.tar is None:
            try:
                return open(self.path / name, "rb")
            except OSError as exc:
                raise ImageError(f"{self.path}: cannot read {name}: {exc.strerror}") from None
        for member in self.tar.getmembers():
            if _clean(member.name) == _clean(name) and member.isfile():
                f = self.tar.extractfile(member)
                if f is not None:
                    return f
        raise ImageError(f"{self.path}: no file {name!r} in the archive")

    def json(self, name: str) -> Any:
        with self.open(name) as f:
            data = f.read()
        try:
            return json.loads(data)
        except ValueError as exc:
            raise ImageError(f"{self.path}: {name} is not JSON: {exc}") from None


def _open_tar(path: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(path)
    except (OSError, tarfile.TarError) as exc:
        raise ImageError(
            f"{path}: neither an OCI image layout directory nor a tar archive ({exc})"
        ) from None


def _clean(name: str) -> str:
    """A member name relative to the root (`./a/b`, `/a/b` -> `a/b`; `..` is kept, to refuse)."""
    clean = posixpath.normpath("./" + name.lstrip("/"))
    return "" if clean == "." else clean


def _blob(digest: Any, where: str) -> str:
    if not isinstance(digest, str) or ":" not in digest:
        raise ImageError(f"{where}: digest {digest!r} is not ALG:HEX")
    alg, hexd = digest.split(":", 1)
    if alg != "sha256" or len(hexd) != 64 or not all(c in "0123456789abcdef" for c in hexd):
        raise ImageError(f"{where}: digest {digest!r} is not sha256:<64 hex digits>")
    return f"blobs/sha256/{hexd}"


def _pick(index: Any, where: str) -> Any:
    """The digest of an index's manifest for this machine's platform (linux and this CPU), else
    of its only or first manifest."""
    manifests = index.get("manifests") if isinstance(index, dict) else None
    if not manifests or not all(isinstance(m, dict) for m in manifests):
        raise ImageError(f"{where}: lists no manifest")
    arch = ARCHES.get(platform.machine(), platform.machine())
    for m in manifests:
        p = m.get("platform") or {}
        if p.get("os") == "linux" and p.get("architecture") == arch:
            return m.get("digest")
    return manifests[0].get("digest")


def _plan(src: _Source) -> tuple[bytes, list[tuple[str, str | None]]]:
    """The image's config (bytes) and its layers in order: (name in the source, digest or None)."""
    if src.has("index.json"):
        index = src.json("index.json")
        manifest = src.json(_blob(_pick(index, f"{src.path}: index.json"), f"{src.path}"))
        if isinstance(manifest, dict) and "manifests" in manifest:  # a (multi-platform) index
            manifest = src.json(_blob(_pick(manifest, f"{src.path}: image index"), f"{src.path}"))
        if not isinstance(manifest, dict):
            raise ImageError(f"{src.path}: the image manifest is not a JSON object")
        cfg_digest = manifest.get("config", {}).get("digest")
        with src.open(_blob(cfg_digest, f"{src.path}: manifest config")) as f:
            config = f.read()
        if "sha256:" + hashlib.sha256(config).hexdigest() != cfg_digest:
            raise ImageError(f"{src.path}: the config blob does not match its digest {cfg_digest}")
        layers = [(_blob(d.get("digest"), f"{src.path}: layer"), d.get("digest"))
                  for d in manifest.get("layers", [])]  # fmt: skip
        return config, layers
    if src.has("manifest.json"):
        manifest = src.json("manifest.json")
        if not isinstance(manifest, list) or not manifest or "Config" not in manifest[0]:
            raise ImageError(f"{src.path}: manifest.json is not a `docker save` manifest")
        with src.open(manifest[0]["Config"]) as f:
            config = f.read()
        return config, [(name, None) for name in manifest[0].get("Layers", [])]
    raise ImageError(f"{src.path}: no index.json (OCI layout) or manifest.json (docker save)")


def unpack(
    source: str | os.PathLike[str],
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    budget: Budget | None = None,
) -> Image:
    """Unpack an OCI layout directory or `docker save` archive (once per content) within
    `budget` (default: `Budget()`) and return the image: rootfs, ENV, WORKDIR, USER."""
    budget = budget if budget is not None else Budget()
    path = Path(source)
    if not path.exists():
        raise ImageError(f"{path}: no such image layout directory or archive")
    src = _Source(path)
    try:
        config_bytes, layers = _plan(src)
        digest = "sha256:" + hashlib.sha256(config_bytes).hexdigest()
        ids = _diff_ids(config_bytes)
        if ids is None or len(ids) != len(layers):
            ids = None  # the key must still name content, never a layer's name in the archive
            layers = [(name, d or _content_digest(src, name)) for name, d in layers]
        cache = Path(cache_dir) if cache_dir is not None else cache_root()
        sweep(cache)
        final = cache / _cache_key(digest, layers, ids)
        if not (final / "image.json").is_file():
            _unpack_into(src, layers, ids, config_bytes, cache, final, budget)
    finally:
        src.close()
    meta = json.loads((final / "image.json").read_text())
    _within(budget, meta.get("usage") or _count(final / "rootfs"), path, final)
    return Image(rootfs=final / "rootfs", env=meta["env"], workdir=meta["workdir"],
                 user=meta["user"], digest=digest, notes=tuple(meta["notes"]))  # fmt: skip


def _diff_ids(config_bytes: bytes) -> list[str] | None:
    """The config's rootfs.diff_ids (the uncompressed layers' digests), if it lists them."""
    try:
        ids = (json.loads(config_bytes).get("rootfs") or {}).get("diff_ids")
    except (ValueError, AttributeError):
        return None
    return ids if isinstance(ids, list) and all(isinstance(i, str) for i in ids) else None


def _content_digest(src: _Source, name: str) -> str:
    """The sha256 of a layer's bytes as the source holds them."""
    h = hashlib.sha256()
    with src.open(name) as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def _cache_key(digest: str, layers: list[tuple[str, str | None]], ids: list[str] | None) -> str:
    """The config digest when the config names every layer by diff_id (checked before
    unpacking), so an OCI layout and a `docker save` of one image share it; else the layers'
    content digests count too."""
    if ids is not None:
        return digest.split(":", 1)[1]
    key = json.dumps([digest, *(d for _, d in layers)]).encode()
    return hashlib.sha256(key).hexdigest()


def _within(budget: Budget, usage: dict[str, int], path: Path, final: Path) -> None:
    """A cached image is handed out only within the budget asked for now."""
    for what, n, most in (("files", usage["files"], budget.max_files),
                          ("bytes", usage["bytes"], budget.max_bytes)):  # fmt: skip
        if n > most:
            raise ImageError(f"{path}: the cached image at {final} holds {n} {what}, over the "
                             f"image budget of {most} {what}")  # fmt: skip


def _count(rootfs: Path) -> dict[str, int]:
    """What an image cached without its usage (by an older claw-sandbox) holds: entries, and
    bytes of regular files by apparent size; no link followed."""
    files = size = 0
    root = _fsat.open_root(rootfs)
    try:
        for dir_fd, _, name, kind in _fsat.walk(root, lambda parts: True):
            files += 1
            if kind == "file":
                size += os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_size
    finally:
        os.close(root)
    return {"files": files, "bytes": size}


def _unpack_into(src: _Source, layers: list[tuple[str, str | None]], ids: list[str] | None,
                 config_bytes: bytes, cache: Path, final: Path, budget: Budget) -> None:  # fmt: skip
    """Apply the layers in a temporary directory of the cache, then rename it to `final`."""
    try:
        config = json.loads(config_bytes).get("config") or {}
    except (ValueError, AttributeError):
        raise ImageError(f"{src.path}: the image config is not a JSON object") from None
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=UNPACKING, dir=cache))
    lock = None
    try:
        lock = _leftovers.hold(tmp, LOCK)
        os.chmod(tmp, 0o755)  # the sandbox may run as an unprivileged uid that must reach it
        rootfs = tmp / "rootfs"
        rootfs.mkdir(mode=0o755)
        notes: list[str] = []
        usage = _Usage(budget=budget)
        for i, (name, digest) in enumerate(layers):
            where = f"{src.path}: layer {name}"
            digests = (digest, ids[i] if ids is not None else None)
            if digests != (None, None):  # checked before a byte of the layer is applied
                with src.open(name) as f:
                    _check_layer(f, where, digests, usage)
            with src.open(name) as f:
                _apply_layer(f, rootfs, where, digests, notes, usage)
        env = dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e)
        meta = {"env": env, "workdir": config.get("WorkingDir") or "/",
                "user": config.get("User") or "", "notes": notes,
                "usage": {"bytes": usage.bytes, "files": usage.files}}  # fmt: skip
        (tmp / "image.json").write_text(json.dumps(meta))
        os.unlink(tmp / LOCK)  # still held through `lock` until the rename is done
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "image.json").is_file():  # not another unpacker that won the race
                raise
    finally:
        if tmp.exists():
            _remove_tmp(cache, tmp.name)
        if lock is not None:
            os.close(lock)


def sweep(cache: str | os.PathLike[str], max_age_s: float = STALE_AGE_S) -> int:
    """Remove the ``.unpack-*`` directories in ``cache`` that no live unpacker holds (their lock
    file can be locked), or, without a lock file, older than ``max_age_s``; returns how many."""
    cache = Path(cache)
    try:
        names = [n for n in os.listdir(cache) if n.startswith(UNPACKING)]
    except OSError:
        return 0
    removed = 0
    for name in names:
        if _abandoned(cache / name, max_age_s):
            with contextlib.suppress(OSError):
                _remove_tmp(cache, name)
                removed += 1
    return removed


def _abandoned(path: Path, max_age_s: float) -> bool:
    try:
        fd = os.open(path / LOCK, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        try:
            st = os.lstat(path)
        except OSError:
            return False
        return time.time() - st.st_mtime > max_age_s
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: its unpacker is at work
        return False
    finally:
        os.close(fd)
    return True


def _remove_tmp(parent: Path, name: str) -> None:
    """Remove ``parent/name`` whatever modes a layer left in it (no link followed)."""
    fd = _fsat.open_root(parent)
    try:
        _fsat.remove_at(fd, name)
    finally:
        os.close(fd)


class _TooLarge(Exception):
    """A tar header over MAX_HEADER bytes (raised while tarfile parses it)."""


class _Member(tarfile.TarInfo):
    """A tar header that refuses a pax or GNU long-name header over ``MAX_HEADER`` bytes before
    it is read into memory."""

    def _proc_member(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _META_TYPES and self.size > MAX_HEADER:
            raise _TooLarge(
                f"a {self.type.decode()!r} header of {self.size} bytes (at most {MAX_HEADER}); "
                "refused"
            )
        return super()._proc_member(tar)  # type: ignore[misc]


_META_TYPES = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE,
               tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)  # fmt: skip


class _Hashing:
    """A file wrapper that hashes what is read."""

    def __init__(self, f: Any) -> None:
        self.f, self.h, self.n = f, hashlib.sha256(), 0

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.h.update(data)
        self.n += len(data)
        return data


def _check_layer(f: IO[bytes], where: str, digests: tuple[str | None, str | None],
                 usage: _Usage) -> None:  # fmt: skip
    """Read a layer through without writing anything: its digest and diff_id (those known) must
    match, and its members fit what is left of the budget (not counting the parent directories
    it implies, which only applying it shows)."""
    _read_layer(f, where, digests, attrs.evolve(usage), None)


def _apply_layer(f: IO[bytes], rootfs: Path, where: str, digests: tuple[str | None, str | None],
                 notes: list[str], usage: _Usage | None = None) -> None:  # fmt: skip
    """Apply one layer (plain or gzip tar) to the rootfs, charging what it writes to `usage` (a
    default budget of its own without one), and check its digest and diff_id when known: a
    layer that reads differently from when `_check_layer` read it is an error."""
    usage = usage if usage is not None else _Usage(budget=Budget())
    root = _fsat.open_root(rootfs)
    try:
        layer = _Layer(root, where, usage)
        _read_layer(f, where, digests, usage, layer)
        try:
            layer.finish()
        except OSError as exc:
            raise ImageError(f"{where}: cannot set a directory's mode: {exc}") from None
    finally:
        os.close(root)
    if layer.skipped:
        notes.append(f"{where}: skipped {len(layer.skipped)} device/fifo entries "
                     f"(e.g. {layer.skipped[0]})")  # fmt: skip


def _read_layer(f: IO[bytes], where: str, digests: tuple[str | None, str | None],
                usage: _Usage, layer: _Layer | None) -> None:  # fmt: skip
    """Read a layer tar through, member by member: each charged to `usage` before any of it is
    written and, with a `layer`, applied; then compare the digests."""
    raw = _Hashing(f)
    head = f.peek(2)[:2] if hasattr(f, "peek") else b""
    gz = gzip.GzipFile(fileobj=raw) if head == b"\x1f\x8b" else None  # type: ignore[call-overload]
    plain = _Hashing(gz) if gz is not None else raw
    name = None
    try:
        with tarfile.open(fileobj=plain, mode="r|", tarinfo=_Member) as tar:  # type: ignore[call-overload]
            for member in tar:
                name = member.name
                if layer is not None:
                    layer.apply(member, tar)
                else:
                    usage.charge(where, _clean(member.name), *_cost(member))
            name = None
            end = plain.n
            while plain.read(65536):  # the rest (tar padding), for the digests
                if plain.n - end > MAX_TRAILER:
                    raise ImageError(f"{where}: more than {MAX_TRAILER} bytes after its tar ends")
        while raw.read(65536):
            pass
    except _TooLarge as exc:
        raise ImageError(f"{where}: {exc}") from None
    except (tarfile.TarError, gzip.BadGzipFile, zlib.error, EOFError) as exc:
        raise ImageError(f"{where}: not a (gzip) tar layer: {exc}") from None
    except OSError as exc:
        at = f"member {name!r}: " if name is not None else ""
        raise ImageError(f"{where}: {at}cannot unpack: {exc}") from None
    for want, got, what in ((digests[0], raw, "digest"), (digests[1], plain, "diff_id")):
        if want is not None and "sha256:" + got.h.hexdigest() != want:
            raise ImageError(f"{where}: content does not match its {what} {want}")


def _cost(member: tarfile.TarInfo) -> tuple[int, int]:
    """What a member writes: (bytes, entries). A regular file counts its apparent size (a sparse
    one its holes too); whiteouts, the root itself and skipped devices and fifos count nothing."""
    rel = _clean(member.name)
    if not rel or posixpath.basename(rel).startswith(WHITEOUT) or not _kept(member):
        return 0, 0
    return (member.size if member.isfile() else 0), 1


def _kept(member: tarfile.TarInfo) -> bool:
    return member.isdir() or member.issym() or member.islnk() or member.isfile()


class _Layer:
    """One layer applied onto the rootfs through directory fds: every path is opened component by
    component from the root's fd with ``O_NOFOLLOW``, so no link (the image's own or one planted
    in the same layer) is ever followed, by a write, a removal or a directory's mode. A plain
    whiteout removes what stands at its name; an opaque one spares the paths this layer made."""

    def __init__(self, root: int, where: str, usage: _Usage) -> None:
        self.root, self.where, self.usage = root, where, usage
        self.made: set[str] = set()
        self.dir_modes: dict[tuple[str, ...], int] = {}
        self.skipped: list[str] = []

    def _parts(self, name: str) -> list[str]:
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise ImageError(f"{self.where}: entry {name!r} leaves the root (`..`); refused")
        return parts

    def _parent(self, name: str, parts: list[str], create: bool) -> int | None:
        """A new fd of the directory that holds parts[-1], its missing parents made (and charged)
        with `create`, else None when one is missing; a parent that is a link or not a
        directory is refused."""
        fd = os.dup(self.root)
        try:
            for i, part in enumerate(parts[:-1]):
                try:
                    sub = os.open(part, _fsat.DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        os.close(fd)
                        return None
                    self.usage.charge(self.where, name, 0, 1)
                    os.mkdir(part, 0o755, dir_fd=fd)
                    sub = os.open(part, _fsat.DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    at = "/" + "/".join(parts[: i + 1])
                    if stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode):
                        raise ImageError(
                            f"{self.where}: entry {name!r} goes through the symlink {at}; refused"
                        ) from None
                    raise ImageError(
                        f"{self.where}: entry {name!r}: its parent {at} is not a directory"
                    ) from None
                os.close(fd)
                fd = sub
        except BaseException:
            os.close(fd)
            raise
        return fd

    def apply(self, member: tarfile.TarInfo, tar: tarfile.TarFile) -> None:
        rel = _clean(member.name)
        parts = self._parts(rel)
        if not parts:  # the root itself
            return
        if parts[-1].startswith(WHITEOUT):
            self._whiteout(rel, parts)
            return
        dfd = self._parent(rel, parts, create=True)
        assert dfd is not None
        try:
            if not _kept(member):
                self.skipped.append("/" + rel)
                return
            self.usage.charge(self.where, rel, *_cost(member))  # before a byte of it is written
            self.made.add(rel)
            name, mode = parts[-1], member.mode & 0o1777  # no setuid / setgid
            if member.isdir():
                st = _lstat(dfd, name)
                if st is None or not stat.S_ISDIR(st.st_mode):
                    _fsat.remove_at(dfd, name)
                    os.mkdir(name, 0o755, dir_fd=dfd)
                self.dir_modes[tuple(parts)] = mode  # applied in finish(), children first
            elif member.issym():
                _fsat.remove_at(dfd, name)
                os.symlink(member.linkname, name, dir_fd=dfd)
            elif member.islnk():
                self._link(rel, member.linkname, dfd, name)
            else:
                self._file(rel, member, tar, dfd, name, mode)
        finally:
            os.close(dfd)

    def _link(self, rel: str, linkname: str, dfd: int, name: str) -> None:
        target = self._parts(_clean(linkname))
        tfd = self._parent(linkname, target, create=False) if target else None
        try:
            st = _lstat(tfd, target[-1]) if tfd is not None else None
            if st is None or not stat.S_ISREG(st.st_mode):
                raise ImageError(
                    f"{self.where}: hard link {rel!r} -> {linkname!r}: not a file of the image; "
                    "refused"
                )
            _fsat.remove_at(dfd, name)
            os.link(target[-1], name, src_dir_fd=tfd, dst_dir_fd=dfd, follow_symlinks=False)
        finally:
            if tfd is not None:
                os.close(tfd)

    def _file(self, rel: str, member: tarfile.TarInfo, tar: tarfile.TarFile, dfd: int,
              name: str, mode: int) -> None:  # fmt: skip
        data = tar.extractfile(member)
        _fsat.remove_at(dfd, name)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(name, flags, 0o600, dir_fd=dfd)
        try:
            if data is not None and member.sparse is not None:
                self._sparse(rel, member, data, fd)
            elif data is not None:
                with os.fdopen(fd, "wb", closefd=False) as out:
                    shutil.copyfileobj(data, out, 1 << 20)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)

    def _sparse(self, rel: str, member: tarfile.TarInfo, data: IO[bytes], fd: int) -> None:
        """Write only a sparse member's data regions, at their offsets: its holes stay holes."""
        raw = getattr(data, "raw", data)  # unbuffered: a seek over a hole reads nothing
        regions: list[tuple[int, int]] = list(member.sparse or ())  # type: ignore[arg-type]
        end = 0
        for offset, size in regions:
            if offset < end or offset + size > member.size:
                raise ImageError(
                    f"{self.where}: member {rel!r}: its sparse map is out of order or goes past "
                    f"its size ({member.size}); refused"
                )
            raw.seek(offset)
            pos, end = offset, offset + size
            while pos < end:
                chunk = raw.read(min(end - pos, 1 << 20))
                if not chunk:
                    raise ImageError(f"{self.where}: member {rel!r}: its data ends early")
                pos += os.pwrite(fd, chunk, pos)
        os.ftruncate(fd, member.size)

    def _whiteout(self, rel: str, parts: list[str]) -> None:
        dfd = self._parent(rel, parts, create=False)
        if dfd is None:  # nothing there to remove
            return
        try:
            if parts[-1] == OPAQUE:  # the directory's lower-layer contents go
                prefix = "/".join(parts[:-1])
                for child in os.listdir(dfd):
                    if posixpath.join(prefix, child) not in self.made:
                        _fsat.remove_at(dfd, child)
                return
            name = parts[-1][len(WHITEOUT) :]
            if name and name not in (".", ".."):
                _fsat.remove_at(dfd, name)
        finally:
            os.close(dfd)

    def finish(self) -> None:
        """Give the directories this layer made their modes, children before parents, each
        through a no-follow fd: one since removed or replaced (by a whiteout, a file or a link
        later in the layer) is no longer this layer's directory and is left alone."""
        for parts in sorted(self.dir_modes, key=len, reverse=True):
            try:
                fd = _fsat.open_dirs(self.root, parts)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                    continue
                raise
            try:
                os.fchmod(fd, self.dir_modes[parts])
            finally:
                os.close(fd)


def _lstat(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def resolve_user(rootfs: Path, user: str) -> tuple[int, int]:
    """USER of an image (`name`, `uid`, `name:group`, `uid:gid`, empty: root) as (uid, gid),
    from the image's own /etc/passwd and /etc/group (never the host's); a uid the image does
    not list gets gid 0, as docker does."""
    name, _, group = (user or "0").partition(":")
    uid: int | None = None
    gid = 0
    for row in _table(rootfs, "passwd"):
        if len(row) >= 4 and row[3].isdigit() and (row[0] == name or row[2] == name):
            uid, gid = int(row[2]), int(row[3])
            break
    if uid is None:
        if not name.isdigit():
            raise ImageError(f"image USER {user!r}: no user {name!r} in the image's /etc/passwd")
        uid = int(name)
    if group.isdigit():
        gid = int(group)
    elif group:
        rows = [r for r in _table(rootfs, "group") if r[0] == group]
        if not rows:
            raise ImageError(f"image USER {user!r}: no group {group!r} in the image's /etc/group")
        gid = int(rows[0][2])
    return uid, gid


def _table(rootfs: Path, name: str) -> list[list[str]]:
    """The rows of the image's /etc/NAME, not following a symlink out of the image."""
    etc, path = rootfs / "etc", rootfs / "etc" / name
    if etc.is_symlink() or path.is_symlink() or not path.is_file():
        return []
    rows = [line.split(":") for line in path.read_text(errors="replace").splitlines()]
    return [r for r in rows if len(r) >= 3 and r[2].isdigit()]
