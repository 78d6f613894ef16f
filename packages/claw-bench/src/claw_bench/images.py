"""Images of a suite's tasks: which are here, and building the missing ones from their Dockerfile.

A task runs in ``task.image``; none means the backend's default image. A Harbor task's compose
sidecars with a ``build`` add rows of their own (``meta["compose"]["builds"]``), built the same way. A Harbor task with
``environment/Dockerfile`` and no ``[environment] docker_image`` gets a tag derived from the
content of ``environment/`` and ``task.meta["docker_context"]`` (see claw_bench.harbor): that image
is built here with ``docker build -t TAG CONTEXT``. Images named by ``docker_image`` are published
elsewhere and are only looked up, never built under their name (``docker pull`` them).

Two builders, each run as a subprocess (no SDK, no import of claw-sandbox): ``docker`` (``docker``
may name another executable) keeps images in the engine; ``claw-sandbox`` (``claw-sandbox build``,
no daemon) writes each image as an OCI image layout under a layouts directory, at
``layout_path(root, tag)``, and lists every layout there as ``--oci=TAG=PATH`` lines in
``root/oci-args``, the arguments `claw-sandbox run --backend bwrap` takes to run each job in the
image its ``image`` names.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from claw_bench.errors import ClawError, DockerError
from claw_bench.tasks import Task

STATUSES = ("default", "present", "missing", "built", "failed")
BUILDERS = ("docker", "claw-sandbox")
TAIL_LINES = 20
OCI_ARGS = "oci-args"


@attrs.frozen(kw_only=True)
class ImageRow:
    """One task's image: ``status`` is one of STATUSES; ``output`` the end of a failed build's log."""

    task: str
    image: str | None  # None: the backend's default image
    context: str | None  # the folder `docker build` builds ``image`` from; None: not built here
    status: str
    output: str = ""
    seconds: float | None = None  # how long the build took
    layout: str | None = None  # claw-sandbox builder: the image's OCI layout (here once present)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (what `claw-bench images --json` prints)."""
        return attrs.asdict(self)


def _row(task: Task, status: str = "default") -> ImageRow:
    context = task.meta.get("docker_context") if task.image else None
    return ImageRow(
        task=task.id,
        image=task.image,
        context=context if isinstance(context, str) else None,
        status=status,
    )


def check_docker(docker: str = "docker") -> str:
    """The docker executable's path, once an engine answers it; DockerError saying what is wrong."""
    exe = shutil.which(docker)
    if exe is None:
        raise DockerError(
            f"{docker}: command not found on PATH; install the Docker CLI and engine "
            "to list or build task images"
        )
    try:
        p = subprocess.run(
            [exe, "version", "--format", "{{.Server.Version}}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired as exc:
        raise DockerError(f"no Docker engine answered `{docker} version` within 60 s") from exc
    if p.returncode != 0:
        last = (p.stderr.strip() or p.stdout.strip()).splitlines()[-1:] or [
            f"exit code {p.returncode}"
        ]
        raise DockerError(f"no Docker engine answering {docker}: {last[0]} (is dockerd running?)")
    return exe


def _present(exe: str, image: str) -> bool:
    p = subprocess.run(
        [exe, "image", "inspect", "--format", "{{.Id}}", image], capture_output=True, text=True
    )
    return p.returncode == 0


def _sidecar_rows(task: Task) -> list[ImageRow]:
    """The images of a Harbor task's compose sidecars built from a folder (claw_bench.harbor)."""
    compose = c if isinstance(c := task.meta.get("compose"), dict) else {}
    return [
        ImageRow(task=task.id, image=b["image"], context=b["context"], status="missing")
        for b in compose.get("builds", [])
    ]


def layout_path(root: str | os.PathLike[str], image: str) -> Path:
    """Where the claw-sandbox builder keeps ``image``'s OCI layout: a folder of ``root`` named
    after the tag (``claw-harbor/t:ab12`` -> ``claw-harbor_t_ab12``)."""
    return Path(root) / re.sub(r"[^A-Za-z0-9._-]", "_", image)


def default_layouts() -> Path:
    """The claw-sandbox builder's layouts directory: ``images/`` in claw-bench's cache
    ($CLAW_BENCH_CACHE, else $XDG_CACHE_HOME/claw-bench); a tag names its content, so a layout
    there is never stale."""
    from claw_bench.datasets import cache_dir

    return cache_dir() / "images"


def pick_builder(builder: str = "auto", docker: str = "docker") -> tuple[str, str]:
    """(the builder, why it was picked): ``auto`` is docker when an engine answers, else
    claw-sandbox."""
    if builder != "auto":
        if builder not in BUILDERS:
            raise ClawError(
                f"unknown image builder {builder!r}; one of auto, {', '.join(BUILDERS)}"
            )
        return builder, ""
    try:
        check_docker(docker)
    except DockerError as exc:
        return "claw-sandbox", f"{exc}; building with claw-sandbox (no daemon) instead"
    return "docker", ""


def _sandbox_exe() -> str:
    from claw_bench._sandbox import sandbox_executable

    exe = sandbox_executable()
    if exe is None:
        raise ClawError(
            "claw-sandbox: command not found (on PATH or next to this Python); install "
            "claw-sandbox to build task images without Docker"
        )
    return exe


def _list(
    tasks: list[Task], docker: str, layouts: Path | None = None
) -> tuple[list[ImageRow], str | None]:
    """The rows with each image's status: in the engine (``layouts`` None) or as an OCI layout
    under ``layouts``; and the docker executable when the engine was asked."""
    wanted = [r for t in tasks for r in (_row(t), *_sidecar_rows(t))]
    if not any(r.image for r in wanted):
        return wanted, None
    if layouts is not None:
        rows = []
        for r in wanted:
            where = layout_path(layouts, r.image) if r.image else None
            status = "default" if where is None else "present" if _is_layout(where) else "missing"
            rows.append(
                attrs.evolve(r, status=status, layout=None if where is None else str(where))
            )
        return rows, None
    exe = check_docker(docker)
    seen: dict[str, bool] = {}
    rows = []
    for r in wanted:
        if r.image and r.image not in seen:
            seen[r.image] = _present(exe, r.image)
        status = "default" if not r.image else "present" if seen[r.image] else "missing"
        rows.append(attrs.evolve(r, status=status))
    return rows, exe


def _is_layout(path: Path) -> bool:
    return (path / "index.json").is_file() and (path / "oci-layout").is_file()


def list_images(
    tasks: Iterable[Task],
    *,
    docker: str = "docker",
    layouts: str | os.PathLike[str] | None = None,
) -> list[ImageRow]:
    """Each task's image and whether it exists locally, in task order: in the Docker engine
    (``docker image inspect``), or with ``layouts`` as an OCI layout there (the claw-sandbox
    builder's; no Docker needed).

    Tasks without an image are ``default`` and need no Docker; otherwise the engine must answer
    (DockerError when the CLI is missing or no engine answers).
    """
    return _list(list(tasks), docker, None if layouts is None else Path(layouts))[0]


def _stream(argv: list[str], timeout_s: float | None, why: str) -> tuple[bool, str]:
    """Run a build command; (succeeded, the last TAIL_LINES lines of its output). A build
    running past ``timeout_s`` is killed, and the output's last line says so (``why``)."""
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    with subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    ) as p:
        timer = threading.Timer(timeout_s, p.kill) if timeout_s else None
        if timer:
            timer.start()
        try:
            assert p.stdout is not None
            for line in p.stdout:
                tail.append(line.rstrip("\n"))
        finally:
            if timer:
                timer.cancel()
    if timer is not None and p.returncode == -signal.SIGKILL:
        tail.append(f"killed at {why} ({timeout_s:g}s)")
    return p.returncode == 0, "\n".join(tail)


def _build(exe: str, image: str, context: str, timeout_s: float | None = None,
           why: str = "the task's build_timeout_sec") -> tuple[bool, str]:  # fmt: skip
    """``docker build -t IMAGE CONTEXT``; (succeeded, the end of its output)."""
    return _stream([exe, "build", "-t", image, context], timeout_s, why)


def _sandbox_build(exe: str, image: str, context: str, final: Path, timeout_s: float | None,
                   why: str, bases: Mapping[str, str]) -> tuple[bool, str]:  # fmt: skip
    """``claw-sandbox build CONTEXT -o TMP -t IMAGE``, TMP renamed to ``final`` once complete,
    so a killed build leaves no half layout under the tag's name."""
    final.parent.mkdir(parents=True, exist_ok=True)
    _sweep(final.parent)
    tmp = final.parent / f".build-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    argv = [exe, "build", context, "-o", str(tmp), "-t", image]
    argv += [f"--from={name}={os.path.abspath(path)}" for name, path in bases.items()]
    try:
        ok, output = _stream(argv, timeout_s, why)
        if ok:
            try:
                os.rename(tmp, final)
            except OSError:  # another build won the race: its layout stands
                if not _is_layout(final):
                    raise
        return ok, output
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _sweep(root: Path) -> None:
    """Remove the ``.build-*-PID`` folders of builders that died (killed before their rename)."""
    for d in root.glob(".build-*"):
        pid = d.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_oci_args(root: str | os.PathLike[str]) -> Path:
    """Write ``root/oci-args``: ``--oci=TAG=PATH`` per OCI layout in ``root`` (its tag from
    index.json's ``org.opencontainers.image.ref.name``), the arguments that make
    `claw-sandbox run --backend bwrap` run each job in the image its ``image`` names."""
    root = Path(root)
    lines = []
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        if d.name.startswith(".") or not _is_layout(d):
            continue
        try:
            index = json.loads((d / "index.json").read_text())
            tag = index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"]
        except (OSError, ValueError, LookupError, TypeError):
            continue
        lines.append(f"--oci={tag}={d.absolute()}\n")
    out = root / OCI_ARGS
    tmp = root / f".{OCI_ARGS}-{os.getpid()}"
    tmp.write_text("".join(lines))
    os.replace(tmp, out)
    return out


def build_images(
    tasks: Iterable[Task],
    *,
    docker: str = "docker",
    progress: Callable[[str], None] | None = None,
    builder: str = "docker",
    layouts: str | os.PathLike[str] | None = None,
    bases: Mapping[str, str] | None = None,
    timeout_multiplier: float = 1.0,
) -> list[ImageRow]:
    """List the images (see list_images) and build the missing ones that have a build context.

    ``builder``: ``docker`` (``docker build -t TAG CONTEXT``), ``claw-sandbox`` (``claw-sandbox
    build``, no daemon: an OCI layout under ``layouts``, default ``default_layouts()``, with
    ``bases`` mapping a ``FROM`` name to a local image, and ``layouts/oci-args`` rewritten), or
    ``auto`` (docker when an engine answers, else claw-sandbox). A task's
    ``build_timeout_sec`` times ``timeout_multiplier`` kills a build that runs longer.

    Builds run one at a time; ``progress`` gets one short line before and after each. A failed
    build is a ``failed`` row with the end of its output, and the other images are still built.
    Missing images without a context (named by ``docker_image``) stay ``missing``.
    """
    if not timeout_multiplier > 0:
        raise ClawError(f"the timeout multiplier must be > 0, got {timeout_multiplier}")
    say = progress or (lambda _msg: None)
    builder, why = pick_builder(builder, docker)
    if why:
        say(why)
    tasks = list(tasks)
    root = None
    if builder == "claw-sandbox":
        root = Path(layouts) if layouts is not None else default_layouts()
    rows, exe = _list(tasks, docker, root)
    todo = {r.image: r for r in rows if r.status == "missing" and r.context}  # one build per image
    if todo:
        build = _builder(builder, exe, dict(bases or {}), _timeouts(tasks, timeout_multiplier))
    done: dict[str | None, ImageRow] = {}
    for i, r in enumerate(todo.values(), start=1):
        say(f"[{i}/{len(todo)}] building {r.image} for {r.task}")
        started = time.monotonic()
        ok, output = build(r)
        seconds = round(time.monotonic() - started, 1)
        done[r.image] = attrs.evolve(
            r, status="built" if ok else "failed", output="" if ok else output, seconds=seconds
        )
        say(f"[{i}/{len(todo)}] {'built' if ok else 'FAILED'} {r.image} in {seconds:g}s")
    if root is not None and root.is_dir():
        say(f"image layouts: {root} (run them: claw-sandbox run JOBS --backend bwrap "
            f"$(cat {write_oci_args(root)}))")  # fmt: skip
    return [
        attrs.evolve(done[r.image], task=r.task) if r.image in done and r.context else r
        for r in rows
    ]


def _timeouts(tasks: list[Task], factor: float) -> dict[str | None, tuple[float | None, str]]:
    """Each image's build timeout (its task's build_timeout_sec times ``factor``), and how a
    killed build's last line names it."""
    out: dict[str | None, tuple[float | None, str]] = {}
    for t in tasks:
        value = t.meta.get("build_timeout_s")
        if t.image and isinstance(value, (int, float)):
            scaled = value * factor
            what = "the task's build_timeout_sec"
            out[t.image] = (scaled, what if factor == 1 else f"{what} x {factor:g}")
    return out


def _builder(builder: str, exe: str | None, bases: dict[str, str],
             timeouts: dict[str | None, tuple[float | None, str]]) -> Callable[[ImageRow], tuple[bool, str]]:  # fmt: skip
    """A function building one row's image with ``builder``."""
    sandbox = _sandbox_exe() if builder == "claw-sandbox" else None

    def build(r: ImageRow) -> tuple[bool, str]:
        assert r.image is not None and r.context is not None
        timeout_s, why = timeouts.get(r.image, (None, ""))
        if sandbox is not None:
            assert r.layout is not None
            return _sandbox_build(
                sandbox, r.image, r.context, Path(r.layout), timeout_s, why, bases
            )
        assert exe is not None
        return _build(exe, r.image, r.context, timeout_s, why)

    return build
