"""Build an OCI image layout from a Dockerfile without a daemon (`claw-sandbox build`).

The image's root filesystem is assembled in a temporary directory: the base image (``FROM
scratch``, or a local OCI layout / `docker save` archive named by ``--from NAME=PATH``) is
unpacked there by `_oci.unpack`, each ``COPY``/``ADD`` becomes a layer made from the build
context's files (applied to the root by the same code that unpacks images), and each ``RUN``
runs inside bwrap with that root as ``/`` (writable; no network unless asked), its changes (new,
changed and removed paths, as whiteouts) becoming the next layer. ``ENV``, ``WORKDIR``, ``USER``, ``CMD``, ``ENTRYPOINT``,
``LABEL`` and ``EXPOSE`` go into the config. The result is an OCI image layout: gzip layers,
the config with their ``diff_ids`` and a history, a manifest and ``index.json`` (the tag as
``org.opencontainers.image.ref.name``), every blob named by its sha256.

A ``RUN`` is never host root. As root, the build's work dir (0700, in the system temp dir) and
the root in it belong to `BUILD_UID`, an unprivileged uid no host account has, and every ``RUN``
runs as that uid (``setpriv``, no_new_privs) in a user namespace that maps only it, to 0 or to
``USER``'s uid: ``id -u`` says 0, but the step has no capability (``--cap-drop ALL``), runs under
the job seccomp filter (`_seccomp`: no mounts, no new namespaces, ...) with its root mounted
``nosuid``, and reaches nothing of the host but what the root holds: a host-wide sysctl or a
host file is as closed to it as to any unprivileged user. After each step the root is given back
to `BUILD_UID` and setuid/setgid bits are cleared, by file descriptors that follow no link.
Built layers carry no setuid bit, and a setgid bit only on a directory (a base image's layers are
kept as they are).

Deviations from ``docker build``: one stage; a ``RUN`` owns every file of the root (it may change
a file another uid owns in the image; files it makes or changes belong to the uid it ran as) and
has no capability (``chown`` to another uid, ``mknod`` and a package manager that drops to its
own user fail); device nodes are not carried; setuid bits are cleared; ``ADD`` takes only local
files and does not unpack archives.
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import io
import json
import os
import posixpath
import shutil
import stat
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from claw_sandbox import _fsat, _oci, _seccomp
from claw_sandbox._dockerfile import Step, expand, pairs, steps, words
from claw_sandbox.errors import BuildError, ImageError

WHITEOUT = _oci.WHITEOUT

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_SKIP = ("dev", "proc", "sys")  # mount points of a RUN step, never part of a layer
LAYER_MEDIA = "application/vnd.oci.image.layer.v1.tar+gzip"
BUILD_UID = 2147483646  # a RUN's host uid when the build runs as root: an unused uid, not nobody
# (no host account or process has it, so nothing else on the host can reach the root being built)
_SUID_BITS = stat.S_ISUID | stat.S_ISGID


@attrs.define
class _State:
    """The image as built so far."""

    rootfs: Path
    config: dict[str, Any]
    owner: tuple[int, int]  # the host uid/gid the root belongs to and RUN steps run as
    layers: list[tuple[bytes, str]] = attrs.field(factory=list)  # (gzip blob, diff_id)
    history: list[dict[str, Any]] = attrs.field(factory=list)
    args: dict[str, str] = attrs.field(factory=dict)

    def env(self) -> dict[str, str]:
        env = (self.config.get("config") or {}).get("Env") or []
        return dict(e.split("=", 1) for e in env if "=" in e)

    def scope(self) -> dict[str, str]:
        return {**self.args, **self.env()}

    def note(self, step: Step, empty: bool) -> None:
        self.history.append({"created_by": f"{step.kind} {step.text}", "empty_layer": empty})


@attrs.frozen(kw_only=True)
class Built:
    """What `build` wrote: the layout directory, the manifest's and the config's digests."""

    layout: Path
    manifest_digest: str
    config_digest: str
    layers: int


def build(
    context: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    dockerfile: str | os.PathLike[str] | None = None,
    bases: Mapping[str, str | os.PathLike[str]] | None = None,
    build_args: Mapping[str, str] | None = None,
    tag: str | None = None,
    network: bool = False,
    progress: Callable[[str], None] | None = None,
    image_budget: _oci.Budget | None = None,
) -> Built:
    """Build ``dockerfile`` (default ``CONTEXT/Dockerfile``) into an OCI image layout at
    ``output`` (a new or empty directory). ``bases`` maps a FROM name to a local image
    (unpacked within ``image_budget``, default ``_oci.Budget()``);
    BuildError names the Dockerfile line that fails."""
    ctx = Path(context)
    path = Path(dockerfile) if dockerfile is not None else ctx / "Dockerfile"
    if not ctx.is_dir():
        raise BuildError(f"{ctx}: the build context is not a directory")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BuildError(f"{path}: cannot read the Dockerfile: {exc}") from None
    out = Path(output)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BuildError(f"{out}: the output must be a new or empty directory")
    todo = steps(text, str(path))
    work = Path(tempfile.mkdtemp(prefix="claw-sandbox-build-"))  # 0700
    try:
        owner = (BUILD_UID, BUILD_UID) if os.geteuid() == 0 else (os.geteuid(), os.getegid())
        os.chown(work, *owner)
        state = _State(rootfs=work / "rootfs", config={}, owner=owner)
        state.args.update(build_args or {})
        for n, step in enumerate(todo, 1):
            if progress:
                progress(f"step {n}/{len(todo)}: {step.kind} {step.text}"[:200])
            _do(step, state, ctx, str(path), dict(bases or {}), work, network, image_budget)
        return _write_layout(state, out, tag)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _do(step: Step, state: _State, ctx: Path, path: str, bases: dict[str, Any], work: Path,
        network: bool, budget: _oci.Budget | None = None) -> None:  # fmt: skip
    where = step.where(path)
    cfg = state.config.setdefault("config", {})
    if step.kind == "FROM":
        _from(step, state, bases, where, work, budget)
    elif step.kind == "ARG":
        for word in words(step.text, where):
            name, eq, default = word.partition("=")
            if name not in state.args and eq:
                state.args[name] = expand(default, state.scope())
    elif step.kind == "ENV":
        env = state.env()
        env.update(pairs(step.text, where, state.scope()))
        cfg["Env"] = [f"{k}={v}" for k, v in env.items()]
    elif step.kind == "WORKDIR":
        wd = expand(step.text, state.scope())
        cfg["WorkingDir"] = posixpath.normpath(posixpath.join(cfg.get("WorkingDir") or "/", wd))
        if not (state.rootfs / cfg["WorkingDir"].lstrip("/")).is_dir():  # made, as Docker does
            _add_layer(state, _dirs_layer(state.rootfs, cfg["WorkingDir"]), step)
            return
    elif step.kind == "USER":
        cfg["User"] = expand(step.text, state.scope())
    elif step.kind in ("CMD", "ENTRYPOINT"):
        argv = (
            words(step.text, where) if step.text.startswith("[") else ["/bin/sh", "-c", step.text]
        )
        cfg["Cmd" if step.kind == "CMD" else "Entrypoint"] = argv
    elif step.kind == "LABEL":
        cfg.setdefault("Labels", {}).update(pairs(step.text, where, state.scope()))
    elif step.kind == "EXPOSE":
        for port in words(expand(step.text, state.scope()), where):
            cfg.setdefault("ExposedPorts", {})[port if "/" in port else f"{port}/tcp"] = {}
    elif step.kind in ("COPY", "ADD"):
        _add_layer(state, _copy_layer(step, state, ctx, where), step)
        return
    else:  # RUN
        _add_layer(state, _run_layer(step, state, where, network), step)
        return
    state.note(step, empty=True)


def _from(step: Step, state: _State, bases: dict[str, Any], where: str, work: Path,
          budget: _oci.Budget | None = None) -> None:  # fmt: skip
    parts = [w for w in words(expand(step.text, state.args), where) if not w.startswith("--")]
    if not parts:
        raise BuildError(f"{where}: FROM needs an image")
    name = parts[0]
    if name == "scratch":
        state.rootfs.mkdir(mode=0o755)
        _own(state)
        state.config = {"architecture": _arch(), "os": "linux", "config": {}}
        return
    if name not in bases:
        raise BuildError(
            f"{where}: no local image for {name!r}: give --from {name}=PATH (an OCI image layout "
            "or a `docker save` archive), or build FROM scratch"
        )
    try:
        image = _oci.unpack(bases[name], work / "base", budget=budget)
        config, layers = _base_blobs(Path(bases[name]))
    except ImageError as exc:
        raise BuildError(f"{where}: {exc}") from None
    shutil.move(str(image.rootfs), state.rootfs)
    state.config = config
    state.config.pop("rootfs", None)
    state.history = list(config.pop("history", None) or [])
    state.layers = layers
    _own(state)


def _base_blobs(source: Path) -> tuple[dict[str, Any], list[tuple[bytes, str]]]:
    """The base image's config and its layers as gzip blobs with their diff_ids."""
    src = _oci._Source(source)
    try:
        config_bytes, layers = _oci._plan(src)
        out = []
        for name, _ in layers:
            with src.open(name) as f:
                data = f.read()
            plain = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
            blob = data if plain is not data else gzip.compress(data, mtime=0)
            out.append((blob, _sha(plain)))
    finally:
        src.close()
    config = json.loads(config_bytes)
    if not isinstance(config, dict):
        raise ImageError(f"{source}: the image config is not a JSON object")
    return config, out


def _arch() -> str:
    import platform

    return _oci.ARCHES.get(platform.machine(), platform.machine())


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _own(state: _State) -> None:
    """Give the root being built to the build's uid (as root) and clear every setuid/setgid bit
    of its files, through directory fds that follow no link."""
    uid, gid = state.owner
    as_root = os.geteuid() == 0
    root_fd = _fsat.open_root(state.rootfs)
    try:
        if as_root:
            os.fchown(root_fd, uid, gid)
        for dir_fd, _, name, kind in _fsat.walk(root_fd, lambda parts: True):
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if as_root and (st.st_uid, st.st_gid) != (uid, gid):
                    os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
                if kind == "file" and st.st_mode & _SUID_BITS:
                    _clear_suid(dir_fd, name)  # rechecked on the file it opens
            except FileNotFoundError:
                continue
    finally:
        os.close(root_fd)


def _clear_suid(dir_fd: int, name: str) -> None:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_mode & _SUID_BITS:
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~_SUID_BITS)
    finally:
        os.close(fd)


def _strip(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """A built layer's member: no setuid bit, and a setgid bit only on a directory."""
    info.mode &= ~(stat.S_ISUID if info.isdir() else _SUID_BITS)
    return info


def _add_layer(state: _State, tar: bytes, step: Step) -> None:
    """Apply a layer (plain tar) to the rootfs and keep it (gzip) for the layout."""
    notes: list[str] = []
    _oci._apply_layer(io.BytesIO(tar), state.rootfs, f"{step.kind} line {step.line}", (None, None),
                      notes)  # fmt: skip
    _own(state)
    state.layers.append((gzip.compress(tar, mtime=0), _sha(tar)))
    state.note(step, empty=False)


# --- COPY / ADD ---


def _copy_layer(step: Step, state: _State, ctx: Path, where: str) -> bytes:
    """A layer holding the context files a COPY/ADD names, at their destination."""
    args = words(expand(step.text, state.scope()), where)
    flags = {a.split("=", 1)[0]: a.split("=", 1)[1] if "=" in a else "" for a in args
             if a.startswith("--")}  # fmt: skip
    args = [a for a in args if not a.startswith("--")]
    unknown = set(flags) - {"--chown", "--chmod"}
    if unknown or len(args) < 2:
        raise BuildError(f"{where}: expected [--chown=U[:G]] [--chmod=MODE] SRC... DEST"
                         + (f" ({sorted(unknown)[0]} is not supported)" if unknown else ""))  # fmt: skip
    owner = _oci.resolve_user(state.rootfs, flags["--chown"]) if "--chown" in flags else (0, 0)
    mode = int(flags["--chmod"], 8) if "--chmod" in flags else None
    wd = state.config.get("config", {}).get("WorkingDir") or "/"
    dest = posixpath.join(wd, args[-1])
    into = args[-1].endswith("/") or len(args) > 2 or (state.rootfs / dest.lstrip("/")).is_dir()
    sources = [s for pat in args[:-1] for s in _sources(ctx, pat, where)]
    if len(sources) > 1:
        into = True
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        top = posixpath.normpath(dest if into else posixpath.dirname(dest))
        _parents(tar, state.rootfs, top, owner)
        for src in sources:  # a folder's contents go into the destination, not the folder
            if src.is_dir() and not src.is_symlink():
                for child in sorted(src.iterdir()):
                    _add_tree(tar, child, posixpath.join(dest, child.name), owner, mode)
            else:
                name = posixpath.join(dest, src.name) if into else dest
                _add_tree(tar, src, posixpath.normpath(name), owner, mode)
    return buf.getvalue()


def _dirs_layer(rootfs: Path, path: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _parents(tar, rootfs, path, (0, 0))
    return buf.getvalue()


def _sources(ctx: Path, pattern: str, where: str) -> list[Path]:
    if "://" in pattern:
        raise BuildError(f"{where}: {pattern}: only files of the build context can be copied")
    root = ctx.resolve()
    parent = (root / pattern).parent.resolve()
    base = posixpath.basename(pattern.rstrip("/")) or "."
    found = sorted(parent.glob(base)) if any(c in base for c in "*?[") else [parent / base]
    found = [p for p in found if fnmatch.fnmatch(p.name, base) or base == "."]
    out = []
    for p in found:
        if not p.resolve().is_relative_to(root) or not (p.exists() or p.is_symlink()):
            raise BuildError(f"{where}: {pattern}: not a file or folder of the context {ctx}")
        out.append(p)
    if not out:
        raise BuildError(f"{where}: {pattern}: no file of the context {ctx} matches")
    return out


def _parents(tar: tarfile.TarFile, rootfs: Path, dest: str, owner: tuple[int, int]) -> None:
    """Directory entries for the destination's missing parents (existing ones keep their mode)."""
    parts = [p for p in dest.split("/") if p]
    for i in range(1, len(parts) + 1):
        rel = "/".join(parts[:i])
        if not os.path.lexists(rootfs / rel):
            info = tarfile.TarInfo(rel)
            info.type, info.mode, (info.uid, info.gid) = tarfile.DIRTYPE, 0o755, owner
            tar.addfile(_strip(info))


def _add_tree(tar: tarfile.TarFile, src: Path, name: str, owner: tuple[int, int],
              mode: int | None) -> None:  # fmt: skip
    """``src`` (a file, a symlink, or a folder's contents, recursively) as ``name``."""
    info = tar.gettarinfo(str(src), arcname=name.lstrip("/"))
    info.uid, info.gid, info.uname, info.gname = *owner, "", ""
    if mode is not None and not info.issym():
        info.mode = mode
    _strip(info)
    if info.isdir():
        tar.addfile(info)
        for child in sorted(src.iterdir()):
            _add_tree(tar, child, posixpath.join(name, child.name), owner, mode)
    elif info.isreg():
        with open(src, "rb") as f:
            tar.addfile(info, f)
    elif info.issym():
        tar.addfile(info)


# --- RUN ---


def _snapshot(rootfs: Path) -> dict[str, tuple[int, ...]]:
    """rel path -> (mode, uid, gid, size, mtime_ns, inode) of everything under the rootfs."""
    out: dict[str, tuple[int, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(rootfs):
        rel_dir = os.path.relpath(dirpath, rootfs)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d not in _SKIP]
        for name in dirnames + filenames:
            rel = os.path.normpath(os.path.join(rel_dir, name))
            st = os.lstat(os.path.join(dirpath, name))
            out[rel] = (st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, st.st_ino)
    return out


def _run_layer(step: Step, state: _State, where: str, network: bool) -> bytes:
    """Run the step in bwrap over the rootfs; its changes as a layer (whiteouts for removals)."""
    bwrap = shutil.which("bwrap")
    if not bwrap:
        raise BuildError(f"{where}: RUN needs bubblewrap (apt-get install bubblewrap)")
    cfg = state.config.get("config", {})
    uid, gid = _oci.resolve_user(state.rootfs, cfg.get("User") or "")
    env = {"PATH": DEFAULT_PATH, **state.scope()}
    argv = words(step.text, where) if step.text.startswith("[") else ["/bin/sh", "-c", step.text]
    before = _snapshot(state.rootfs)
    cmd = [*_drop(state, where), bwrap, "--die-with-parent", "--new-session", "--unshare-all",
           "--unshare-user", "--uid", str(uid), "--gid", str(gid), "--cap-drop", "ALL",
           "--bind", str(state.rootfs), "/", "--dev", "/dev", "--proc", "/proc",
           "--chdir", cfg.get("WorkingDir") or "/", "--clearenv"]  # fmt: skip
    if network:
        cmd[cmd.index("--unshare-all") + 1 : cmd.index("--unshare-all") + 1] = ["--share-net"]
        cmd += ["--ro-bind-try", "/etc/resolv.conf", "/etc/resolv.conf"]
    for k, v in env.items():
        cmd += ["--setenv", k, v]
    seccomp_fd = _seccomp.program_fd()
    if seccomp_fd is not None:
        cmd += ["--seccomp", str(seccomp_fd)]
    try:
        proc = subprocess.run([*cmd, "--", *argv], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL,
                              pass_fds=() if seccomp_fd is None else (seccomp_fd,))  # fmt: skip
    finally:
        if seccomp_fd is not None:
            os.close(seccomp_fd)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip()[-2000:]
        raise BuildError(f"{where}: exited {proc.returncode}:\n{tail}")
    return _diff_layer(state.rootfs, before, _snapshot(state.rootfs), (uid, gid))


def _drop(state: _State, where: str) -> list[str]:
    """As root: ``setpriv`` to the build's unprivileged uid (no groups, no_new_privs) before
    bwrap, whose user namespace then maps only that uid. Otherwise nothing: the caller's own uid
    is already unprivileged."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if not setpriv:
        raise BuildError(f"{where}: RUN as root needs setpriv (util-linux) to drop host root")
    for d in reversed(state.rootfs.parents[1:]):  # the work dir's parents: walked by BUILD_UID
        if not os.stat(d).st_mode & 0o001:
            raise BuildError(
                f"{where}: runs as uid {state.owner[0]}, which cannot reach the build's work "
                f"dir under {d} (mode {stat.S_IMODE(os.stat(d).st_mode):o}): set TMPDIR to a "
                "directory whose parents all have mode o+x"
            )
    uid, gid = state.owner
    return [setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--no-new-privs"]


def _diff_layer(rootfs: Path, before: dict[str, tuple[int, ...]],
                after: dict[str, tuple[int, ...]], runner: tuple[int, int]) -> bytes:  # fmt: skip
    """A tar of what changed between two snapshots: new and changed paths (belonging to
    ``runner``, the uid the step ran as: on the host every path belongs to the build's uid),
    whiteouts for removed ones (not their children). No RUN process is left when it is read."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        gone = set(before) - set(after)
        for rel in sorted(gone):
            if os.path.dirname(rel) not in gone:
                tar.addfile(tarfile.TarInfo(posixpath.join(*_split_wh(rel))))
        for rel in sorted(after):
            if before.get(rel) == after[rel]:
                continue
            info = tar.gettarinfo(str(rootfs / rel), arcname=rel)
            info.uname = info.gname = ""
            info.uid, info.gid = runner
            _strip(info)
            if stat.S_ISREG(after[rel][0]):
                with open(rootfs / rel, "rb") as f:
                    tar.addfile(info, f)
            elif info.isdir() or info.issym():
                tar.addfile(info)
    return buf.getvalue()


def _split_wh(rel: str) -> tuple[str, str]:
    """(parent, whiteout name) of a removed path."""
    return posixpath.dirname(rel), WHITEOUT + posixpath.basename(rel)


# --- the layout ---


def _write_layout(state: _State, out: Path, tag: str | None) -> Built:
    """Write the OCI image layout (into a temporary sibling, renamed into place when done)."""
    cfg = state.config
    cfg["rootfs"] = {"type": "layers", "diff_ids": [d for _, d in state.layers]}
    cfg["history"] = state.history
    config_bytes = json.dumps(cfg, sort_keys=True).encode()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    blobs = tmp / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes, media: str) -> dict[str, Any]:
        digest = _sha(data)
        (blobs / digest.split(":")[1]).write_bytes(data)
        return {"mediaType": media, "digest": digest, "size": len(data)}

    manifest: dict[str, Any] = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": put(config_bytes, "application/vnd.oci.image.config.v1+json"),
        "layers": [put(blob, LAYER_MEDIA) for blob, _ in state.layers],
    }
    desc = put(json.dumps(manifest, sort_keys=True).encode(), manifest["mediaType"])
    desc["platform"] = {"os": "linux", "architecture": cfg.get("architecture") or _arch()}
    if tag:
        desc["annotations"] = {"org.opencontainers.image.ref.name": tag}
    (tmp / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [desc]}))
    (tmp / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    os.chmod(tmp, 0o755)
    if out.exists():
        out.rmdir()
    os.rename(tmp, out)
    return Built(layout=out, manifest_digest=desc["digest"],
                 config_digest=manifest["config"]["digest"], layers=len(state.layers))  # fmt: skip
