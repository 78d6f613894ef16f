"""A local base image for the Harbor fixtures' Dockerfiles (``FROM claw-bench-fixture/base:1``),
made with ``docker import`` from this host's own programs and their libraries: no registry is
needed (none is reachable in CI). It holds bash and the tools the fixture scripts use."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

BASE_IMAGE = "claw-bench-fixture/base:1"
TOOLS = [
    "bash",
    "sh",
    "cat",
    "cp",
    "mv",
    "rm",
    "ls",
    "mkdir",
    "mktemp",
    "echo",
    "printf",
    "test",
    "grep",
    "sed",
    "awk",
    "head",
    "tail",
    "wc",
    "cut",
    "tr",
    "sha256sum",
    "tar",
    "gzip",
    "sleep",
    "id",
    "pwd",
    "touch",
    "dirname",
    "basename",
    "timeout",
    "env",
    "true",
    "false",
    "python3",
]


def _libs(path: str) -> set[str]:
    out = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
    return {m for m in re.findall(r"(/\S+)", out) if os.path.exists(m)}


def _usr(path: str) -> str:
    """The tar name of a host path, with /bin, /lib, /lib64 under /usr (the merged-/usr layout)."""
    p = path.lstrip("/")
    return p if p.startswith("usr/") else f"usr/{p}"


def rootfs_tar() -> bytes:
    """A tar of a root filesystem holding TOOLS (resolved on this host), their shared libraries,
    the dynamic loader and the Python standard library python3 needs."""
    names: dict[str, str] = {}  # tar name -> host file (real path)
    for tool in TOOLS:
        path = shutil.which(tool, path="/usr/bin:/bin")
        if path:
            for f in (path, *_libs(os.path.realpath(path))):
                names[_usr(f)] = os.path.realpath(f)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in ("tmp", "root", "app", "etc", "opt", "usr/bin", "usr/lib", "usr/lib64"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
        for link in ("bin", "lib", "lib64", "sbin"):
            info = tarfile.TarInfo(link)
            info.type, info.linkname = tarfile.SYMTYPE, f"usr/{link if link != 'sbin' else 'bin'}"
            tar.addfile(info)
        real = sorted(set(names.values()))
        for f in real:
            tar.add(f, _usr(f), recursive=False)
        for name, f in sorted(names.items()):
            if name != _usr(
                f
            ):  # e.g. usr/bin/python3 -> python3.11, usr/lib64/ld-linux -> usr/lib/...
                info = tarfile.TarInfo(name)
                info.type, info.linkname = tarfile.SYMTYPE, "/" + _usr(f)
                tar.addfile(info)
        py = Path("/usr/lib") / f"python{sys.version_info.major}.{sys.version_info.minor}"
        if py.is_dir():
            tar.add(
                str(py),
                _usr(str(py)),
                filter=lambda t: (
                    None
                    if any(
                        x in t.name
                        for x in ("site-packages", "dist-packages", "__pycache__", "/test/")
                    )
                    else t
                ),
            )
    return buf.getvalue()


def ensure_base_image() -> str | None:
    """Import BASE_IMAGE when the engine lacks it; None when done, else why it could not be."""
    docker = shutil.which("docker")
    if not docker:
        return "the docker CLI is not installed"
    if (
        subprocess.run([docker, "image", "inspect", BASE_IMAGE], capture_output=True).returncode
        == 0
    ):
        return None
    if not shutil.which("ldd"):
        return "ldd is needed to gather the base image's libraries"
    p = subprocess.run([docker, "import", "-", BASE_IMAGE], input=rootfs_tar(), capture_output=True)
    return (
        None
        if p.returncode == 0
        else f"docker import failed: {p.stderr.decode(errors='replace')[-300:]}"
    )


def rootfs_dir(dest: Path, tools: tuple[str, ...]) -> Path:
    """A root filesystem folder (merged /usr) holding ``tools`` resolved on this host and their
    shared libraries, for a ``FROM scratch`` Dockerfile to ``COPY rootfs/ /``."""
    names: dict[str, str] = {}
    for tool in tools:
        path = shutil.which(tool, path="/usr/bin:/bin")
        if path is None:
            raise FileNotFoundError(f"{tool} is not installed on this host")
        for f in (path, *_libs(os.path.realpath(path))):
            names[_usr(f)] = os.path.realpath(f)
    for d in ("usr/bin", "usr/lib", "usr/lib64", "etc", "tmp"):
        (dest / d).mkdir(parents=True, exist_ok=True)
    (dest / "tmp").chmod(0o1777)
    for link in ("bin", "lib", "lib64", "sbin"):
        (dest / link).symlink_to(f"usr/{link if link != 'sbin' else 'bin'}")
    for name, real in sorted(names.items()):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if name == _usr(real):
            shutil.copy2(real, target)
        elif not target.exists():
            target.symlink_to("/" + _usr(real))
    for real in set(names.values()):
        if not (dest / _usr(real)).exists():
            (dest / _usr(real)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(real, dest / _usr(real))
    return dest
