"""Docker images of a suite's tasks: which are here, and building the missing ones from their Dockerfile.

A task runs in ``task.image``; none means the backend's default image. A Harbor task's compose
sidecars with a ``build`` add rows of their own (``meta["compose"]["builds"]``), built the same way. A Harbor task with
``environment/Dockerfile`` and no ``[environment] docker_image`` gets a tag derived from the
content of ``environment/`` and ``task.meta["docker_context"]`` (see claw_bench.harbor): that image
is built here with ``docker build -t TAG CONTEXT``. Images named by ``docker_image`` are published
elsewhere and are only looked up, never built under their name (``docker pull`` them).

The docker CLI is run as a subprocess (no SDK); ``docker`` may name another executable.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from claw_bench.errors import DockerError
from claw_bench.tasks import Task

STATUSES = ("default", "present", "missing", "built", "failed")
TAIL_LINES = 20


@attrs.frozen(kw_only=True)
class ImageRow:
    """One task's image: ``status`` is one of STATUSES; ``output`` the end of a failed build's log."""

    task: str
    image: str | None  # None: the backend's default image
    context: str | None  # the folder `docker build` builds ``image`` from; None: not built here
    status: str
    output: str = ""
    seconds: float | None = None  # how long the build took

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


def _list(tasks: list[Task], docker: str) -> tuple[list[ImageRow], str | None]:
    wanted = [r for t in tasks for r in (_row(t), *_sidecar_rows(t))]
    if not any(r.image for r in wanted):
        return wanted, None
    exe = check_docker(docker)
    seen: dict[str, bool] = {}
    rows = []
    for r in wanted:
        if r.image and r.image not in seen:
            seen[r.image] = _present(exe, r.image)
        status = "default" if not r.image else "present" if seen[r.image] else "missing"
        rows.append(attrs.evolve(r, status=status))
    return rows, exe


def list_images(tasks: Iterable[Task], *, docker: str = "docker") -> list[ImageRow]:
    """Each task's image and whether it exists locally (``docker image inspect``), in task order.

    Tasks without an image are ``default`` and need no Docker; otherwise the engine must answer
    (DockerError when the CLI is missing or no engine answers).
    """
    return _list(list(tasks), docker)[0]


def _build(exe: str, image: str, context: str, timeout_s: float | None = None) -> tuple[bool, str]:
    """Run ``docker build -t IMAGE CONTEXT``; (succeeded, the last TAIL_LINES lines of its output).

    ``timeout_s`` (the task's ``[environment] build_timeout_sec``) kills a build that runs longer.
    """
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    with subprocess.Popen(
        [exe, "build", "-t", image, context],
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
        tail.append(f"killed at the task's build_timeout_sec ({timeout_s:g}s)")
    return p.returncode == 0, "\n".join(tail)


def build_images(
    tasks: Iterable[Task], *, docker: str = "docker", progress: Callable[[str], None] | None = None
) -> list[ImageRow]:
    """List the images (see list_images) and build the missing ones that have a build context.

    Builds run one at a time; ``progress`` gets one short line before and after each. A failed
    build is a ``failed`` row with the end of its output, and the other images are still built.
    Missing images without a context (named by ``docker_image``) stay ``missing``.
    """
    say = progress or (lambda _msg: None)
    tasks = list(tasks)
    timeouts = {t.image: t.meta.get("build_timeout_s") for t in tasks if t.image}
    rows, exe = _list(tasks, docker)
    todo = {r.image: r for r in rows if r.status == "missing" and r.context}  # one build per image
    done: dict[str | None, ImageRow] = {}
    for i, r in enumerate(todo.values(), start=1):
        assert exe is not None and r.image is not None and r.context is not None
        say(f"[{i}/{len(todo)}] building {r.image} for {r.task}")
        started = time.monotonic()
        ok, output = _build(exe, r.image, r.context, timeouts.get(r.image))
        seconds = round(time.monotonic() - started, 1)
        done[r.image] = attrs.evolve(
            r, status="built" if ok else "failed", output="" if ok else output, seconds=seconds
        )
        say(f"[{i}/{len(todo)}] {'built' if ok else 'FAILED'} {r.image} in {seconds:g}s")
    return [
        attrs.evolve(done[r.image], task=r.task) if r.image in done and r.context else r
        for r in rows
    ]
