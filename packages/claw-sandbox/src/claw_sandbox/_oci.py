"""OCI images without a daemon: unpack an OCI image layout directory or a `docker save` archive
into a root filesystem the bwrap backend can use as `/`.

The archive is untrusted. Layers are applied member by member under the rootfs: a name with a
`..` component, a path through a symlink (`a/b` where `a` is a link) or a hard link to anything
but a regular file of the rootfs is refused with an `ImageError`; device nodes and fifos are
skipped (one note); setuid/setgid bits are dropped. Whiteouts (`.wh.NAME`, `.wh..wh..opq`)
remove what lower layers left. Images are cached under `cache_root()` by their config digest
and layers, unpacked into a temporary directory (``.unpack-*``) that is renamed into place only
when complete. The unpacker holds a flock on the directory's ``.unpack.lock`` while it works, so
the directory of one that was killed (the kernel dropped its lock) is swept by the next
`unpack` into that cache; one without a lock file (an older claw-sandbox's, or one caught in its
first instant) only once it is ``STALE_AGE_S`` old.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import json
import os
import platform
import posixpath
import shutil
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
    source: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None
) -> Image:
    """Unpack an OCI layout directory or `docker save` archive (once per config digest) and
    return the image: rootfs, ENV, WORKDIR, USER."""
    path = Path(source)
    if not path.exists():
        raise ImageError(f"{path}: no such image layout directory or archive")
    src = _Source(path)
    try:
        config_bytes, layers = _plan(src)
        digest = "sha256:" + hashlib.sha256(config_bytes).hexdigest()
        cache = Path(cache_dir) if cache_dir is not None else cache_root()
        sweep(cache)
        final = cache / _cache_key(config_bytes, digest, layers)
        if not (final / "image.json").is_file():
            _unpack_into(src, layers, config_bytes, cache, final)
    finally:
        src.close()
    meta = json.loads((final / "image.json").read_text())
    return Image(rootfs=final / "rootfs", env=meta["env"], workdir=meta["workdir"],
                 user=meta["user"], digest=digest, notes=tuple(meta["notes"]))  # fmt: skip


def _diff_ids(config_bytes: bytes) -> list[str] | None:
    """The config's rootfs.diff_ids (the uncompressed layers' digests), if it lists them."""
    try:
        ids = (json.loads(config_bytes).get("rootfs") or {}).get("diff_ids")
    except (ValueError, AttributeError):
        return None
    return ids if isinstance(ids, list) and all(isinstance(i, str) for i in ids) else None


def _cache_key(config_bytes: bytes, digest: str, layers: list[tuple[str, str | None]]) -> str:
    """The config digest when the config names every layer by diff_id (checked on unpacking),
    so an OCI layout and a `docker save` of one image share it; else the layers count too."""
    ids = _diff_ids(config_bytes)
    if ids is not None and len(ids) == len(layers):
        return digest.split(":", 1)[1]
    key = json.dumps([digest, *(d or name for name, d in layers)]).encode()
    return hashlib.sha256(key).hexdigest()


def _unpack_into(src: _Source, layers: list[tuple[str, str | None]], config_bytes: bytes,
                 cache: Path, final: Path) -> None:  # fmt: skip
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
        ids = _diff_ids(config_bytes) or []
        for i, (name, digest) in enumerate(layers):
            with src.open(name) as f:
                diff_id = ids[i] if len(ids) == len(layers) else None
                _apply_layer(f, rootfs, f"{src.path}: layer {name}", (digest, diff_id), notes)
        env = dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e)
        meta = {"env": env, "workdir": config.get("WorkingDir") or "/",
                "user": config.get("User") or "", "notes": notes}  # fmt: skip
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


class _Hashing:
    """A file wrapper that hashes what is read (a layer's digest is checked after applying)."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f, self.h = f, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.h.update(data)
        return data


def _apply_layer(f: IO[bytes], rootfs: Path, where: str, digests: tuple[str | None, str | None],
                 notes: list[str]) -> None:  # fmt: skip
    """Apply one layer (plain or gzip tar), checking its digest and its diff_id when known."""
    raw = _Hashing(f)
    head = f.peek(2)[:2] if hasattr(f, "peek") else b""
    gz = gzip.GzipFile(fileobj=raw) if head == b"\x1f\x8b" else None  # type: ignore[call-overload]
    plain = _Hashing(gz) if gz is not None else raw
    layer = _Layer(rootfs, where)
    try:
        with tarfile.open(fileobj=plain, mode="r|") as tar:  # type: ignore[call-overload]
            for member in tar:
                layer.apply(member, tar)
            while plain.read(65536):  # the rest (tar padding), for the digests
                pass
        while raw.read(65536):
            pass
    except (tarfile.TarError, gzip.BadGzipFile, zlib.error, EOFError) as exc:
        raise ImageError(f"{where}: not a (gzip) tar layer: {exc}") from None
    except OSError as exc:
        raise ImageError(f"{where}: cannot unpack: {exc}") from None
    layer.finish()
    for want, got, what in ((digests[0], raw, "digest"), (digests[1], plain, "diff_id")):
        if want is not None and "sha256:" + got.h.hexdigest() != want:
            raise ImageError(f"{where}: content does not match its {what} {want}")
    if layer.skipped:
        notes.append(f"{where}: skipped {len(layer.skipped)} device/fifo entries "
                     f"(e.g. {layer.skipped[0]})")  # fmt: skip


class _Layer:
    """One layer applied onto the rootfs; paths this layer made are immune to its whiteouts."""

    def __init__(self, rootfs: Path, where: str) -> None:
        self.rootfs, self.where = rootfs, where
        self.made: set[str] = set()
        self.dir_modes: dict[str, int] = {}
        self.skipped: list[str] = []

    def _safe(self, name: str) -> Path:
        """The rootfs path of a member name: no `..`, no component through a symlink or file."""
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise ImageError(f"{self.where}: entry {name!r} leaves the root (`..`); refused")
        if not parts:
            return self.rootfs
        parent = self.rootfs
        for part in parts[:-1]:
            parent = parent / part
            if os.path.islink(parent):
                raise ImageError(
                    f"{self.where}: entry {name!r} goes through the symlink /"
                    f"{parent.relative_to(self.rootfs)}; refused"
                )
            if not parent.exists():
                parent.mkdir(mode=0o755)
            elif not parent.is_dir():
                raise ImageError(f"{self.where}: entry {name!r}: a parent is not a directory")
        return parent / parts[-1]

    def apply(self, member: tarfile.TarInfo, tar: tarfile.TarFile) -> None:
        rel = _clean(member.name)
        base = posixpath.basename(rel)
        if base.startswith(WHITEOUT):
            self._whiteout(rel, base)
            return
        path = self._safe(rel)
        if path == self.rootfs:
            return
        if member.ischr() or member.isblk() or member.isfifo():
            self.skipped.append("/" + rel)
            return
        if not member.isdir() or not path.is_dir() or path.is_symlink():
            _remove(path)
        self.made.add(rel)
        mode = member.mode & 0o1777  # no setuid / setgid
        if member.isdir():
            path.mkdir(mode=0o755, exist_ok=True)
            self.dir_modes[str(path)] = mode
        elif member.issym():
            os.symlink(member.linkname, path)
        elif member.islnk():
            target = self._safe(_clean(member.linkname))
            if target.is_symlink() or not target.is_file():
                raise ImageError(
                    f"{self.where}: hard link {rel!r} -> {member.linkname!r}: not a file of the "
                    "image; refused"
                )
            os.link(target, path, follow_symlinks=False)
        elif member.isfile():
            data = tar.extractfile(member)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as out:
                if data is not None:
                    shutil.copyfileobj(data, out)
            os.chmod(path, mode)
        else:
            self.skipped.append("/" + rel)

    def _whiteout(self, rel: str, base: str) -> None:
        parent = self._safe(rel).parent
        if base == OPAQUE:  # the directory's lower-layer contents go
            prefix = posixpath.dirname(rel)
            if parent.is_dir() and not parent.is_symlink():
                for child in os.listdir(parent):
                    if posixpath.join(prefix, child) not in self.made:
                        _remove(parent / child)
            return
        name = base[len(WHITEOUT) :]
        if name and name not in (".", "..") and "/" not in name:
            _remove(parent / name)

    def finish(self) -> None:
        for d in sorted(self.dir_modes, key=len, reverse=True):  # children before parents
            os.chmod(d, self.dir_modes[d])


def _remove(path: Path) -> None:
    """Remove a rootfs entry (a link itself, never what it points to)."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


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
