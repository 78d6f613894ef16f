"""Importer for Harbor / Terminal-Bench task directories (instruction.md, task.toml, tests/).

A Harbor task::

    my-task/
      instruction.md          the instruction
      task.toml               [metadata] free-form; [agent] timeout_sec; [verifier] timeout_sec;
                              [environment] docker_image, ...
      environment/Dockerfile  the image the task runs in, unless [environment] docker_image names one
      tests/test.sh           the verifier, run after the agent; writes /logs/verifier/reward.txt
      solution/solve.sh       optional reference ("oracle") solution

Task scripts run as Harbor runs them, unchanged (no text is rewritten): the job (planned with
``profile: "harbor"``) has the task's ``WORKDIR`` (default ``/app``) as its workspace and cwd, the
tests at ``/tests`` (verify time only), writable ``/logs/verifier`` and ``/logs/agent``, and, for
the oracle, the whole ``solution/`` folder at ``/solution``. The Dockerfile is read for what a
backend that does not build the image (bwrap) can still give: ``WORKDIR``, ``ENV`` and the
``COPY``/``ADD`` of local files into the WORKDIR (as workspace files), with ``ENV``, ``ARG`` and
paths expanded as Docker expands them. The ``ENV`` it sets is ``meta["harbor"]["image_env"]``
(the job's ``image_env``: a backend that runs the built image has it from there, so a base
image's own PATH is never replaced by a guess); its ``RUN`` lines (and copies elsewhere) are
listed in ``meta["harbor"]["image_run"]``.

A task whose ``environment/`` holds a compose file (``docker-compose.yaml``, ``compose.yaml``:
sidecar services, overrides of the main one) runs as Harbor runs it only on the docker backend,
which starts its sidecars (claw.job/v1 ``services``, read by claw_bench._compose); elsewhere, or
when the file uses what docker cannot carry out, it loads with the reason in
``meta["unsupported"]`` (``meta["compose"]["docker_reason"]`` for docker), ``plan`` gives it a
``not_scorable`` placeholder job that says so (and so does its outcome), and
``load_suite(strict=True)`` (``--strict``) refuses it.

The task's image is ``[environment] docker_image`` when set; else, when ``environment/Dockerfile``
exists, a tag derived from the content of ``environment/`` (``claw-harbor/<task>:<sha12>``, so an
edited Dockerfile or context file gives a new tag and a stale image is never reused), with
``task.meta["docker_context"]`` naming the folder to build it from (``claw-bench images --build``).
"""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
from pathlib import Path

import yaml

from claw_bench._compose import ComposeUnsupported, build_context, compose_services
from claw_bench._dockerfile import DockerfileError, read_image
from claw_bench.errors import TaskError
from claw_bench.tasks import FileContent, Script, Task, read_text_tree

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def is_harbor_task(path: Path) -> bool:
    """True when ``path`` looks like a Harbor / Terminal-Bench task directory."""
    return (path / "instruction.md").is_file() and (path / "tests").is_dir()


def is_harbor_multistep(path: Path) -> bool:
    """True for a Harbor multi-step task: task.toml and a ``steps/`` folder (one sub-folder per
    ``[[steps]]`` entry, each with its own instruction.md, tests/ and solution/)."""
    return path.is_dir() and (path / "steps").is_dir() and (path / "task.toml").is_file()


def step_names(meta: dict, tpath: Path) -> list[str]:
    """The ``[[steps]]`` names of a multi-step task.toml, in order (TaskError when malformed)."""
    steps = meta.get("steps")
    if not isinstance(steps, list) or not steps:
        raise TaskError(f"{tpath}: a steps/ folder needs [[steps]] entries (name = ...) in order")
    names = []
    for i, st in enumerate(steps):
        name = st.get("name") if isinstance(st, dict) else None
        if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
            raise TaskError(f"{tpath}: field steps[{i}].name must be a folder name, got {name!r}")
        names.append(name)
    if len(set(names)) != len(names):
        raise TaskError(f"{tpath}: [[steps]] names repeat: {names}")
    return names


def context_tag(task_id: str, context: Path) -> str:
    """``claw-harbor/<task>:<sha12>``: the first 12 hex digits of a SHA-256 over ``context``'s files.

    Every file's relative path and bytes are hashed, in path order, so any edit to the Dockerfile
    or to a file it copies changes the tag.
    """
    h = hashlib.sha256()
    for p in sorted(context.rglob("*")):
        if p.is_file():
            rel = p.relative_to(context).as_posix().encode()
            h.update(len(rel).to_bytes(4, "big") + rel)
            data = p.read_bytes()
            h.update(len(data).to_bytes(8, "big") + data)
    repo = (
        re.sub(r"[^a-z0-9]+", "-", task_id.lower()).strip("-") or "task"
    )  # a valid Docker repository name
    return f"claw-harbor/{repo}:{h.hexdigest()[:12]}"


#: where Harbor puts a task's tests (verify time only), its logs, and the oracle's solution folder
TESTS, LOGS_VERIFIER, LOGS_AGENT, SOLUTION = "/tests", "/logs/verifier", "/logs/agent", "/solution"
#: where a Harbor trial's artifacts are gathered (task.toml `artifacts`, and what tests put there)
LOGS_ARTIFACTS = "/logs/artifacts"
DEFAULT_WORKDIR = "/app"
#: claw's own verify files of a Harbor job (its verify runner, reward and details), at verify time
CLAW_LOGS = "/logs/claw"
HARBOR_DETAILS = f"{CLAW_LOGS}/details.json"


def read_dockerfile(
    context: Path, what: str, build_args: dict[str, str] | None = None
) -> tuple[str, dict[str, str], dict[str, FileContent], list[str]]:
    """(WORKDIR, ENV, files COPY/ADD puts into the WORKDIR, lines a plain host cannot carry out).

    The Dockerfile is walked as ``docker build`` walks it (claw_bench._dockerfile): ``ENV``,
    ``ARG`` (``build_args`` override their defaults), ``WORKDIR`` and ``COPY`` arguments are
    expanded as Docker expands them, against the image's environment as built so far (a base
    image that is not an earlier stage starts from Docker's default PATH), and only the final
    stage counts. Only what needs no image build is taken: ``WORKDIR``, ``ENV`` and
    ``COPY``/``ADD`` of local files or folders of ``environment/`` whose destination lies in the
    final WORKDIR. ``RUN`` lines, copies elsewhere, from URLs, from or in other stages are
    returned in the last list. TaskError names the line Docker would reject.
    """
    path = context / "Dockerfile"
    try:
        image = read_image(
            path.read_text(encoding="utf-8"), default_workdir=DEFAULT_WORKDIR, build_args=build_args
        )
    except DockerfileError as exc:
        raise TaskError(f"{path}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise TaskError(f"{path}: not UTF-8 text ({exc.reason})") from None
    workdir, skipped = image.workdir, list(image.not_run)
    files: dict[str, FileContent] = {}
    for srcs, dest_abs, line in image.copies:
        into_dir = dest_abs.endswith("/")
        dest_abs = os.path.normpath(dest_abs)
        if not (dest_abs == workdir or dest_abs.startswith(workdir.rstrip("/") + "/")):
            skipped.append(line)
            continue
        for src in srcs:
            sp = (context / src).resolve()
            if not sp.is_relative_to(context.resolve()) or not sp.exists():
                skipped.append(line)
                continue
            base = os.path.relpath(dest_abs, workdir)
            if sp.is_dir():
                for rel, content in read_text_tree(sp, what=what).items():
                    files[os.path.normpath(os.path.join(base, rel))] = content
            else:
                target = os.path.join(base, sp.name) if into_dir or dest_abs == workdir else base
                files[os.path.normpath(target)] = (
                    sp.read_bytes() if not _is_text(sp) else sp.read_text(encoding="utf-8")
                )
    return workdir, image.env, files, skipped


#: the compose files Harbor merges over its own base compose file (sidecars, main overrides)
COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")


def read_compose(context: Path, task_id: str = "task") -> tuple[dict, str] | None:
    """``({"file", "services", "sidecars", ...}, reason)`` when ``environment/`` holds a compose
    file, else None. Only claw-sandbox's docker backend starts sidecars: the reason says which
    services another backend would lack (or which ``main`` settings it would ignore). The info's
    ``job_services`` are the sidecars as claw.job/v1 ``services`` (claw_bench._compose) when the
    docker backend can carry the whole file out, else ``docker_reason`` names the key it cannot.
    A sidecar with a ``build`` gets the image ``claw-harbor/<task>-<service>:<sha12>`` of its
    folder, listed in ``builds`` (``{image, context}``) for ``claw-bench images --build``.
    TaskError when the file is not a compose mapping."""
    found = [context / n for n in COMPOSE_FILES if (context / n).is_file()]
    if not found:
        return None
    path = found[0]
    rel = f"{context.name}/{path.name}"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise TaskError(f"{path}: not a readable compose file: {exc}") from None
    services = data.get("services", {}) if isinstance(data, dict) else None
    if not isinstance(services, dict):
        raise TaskError(f"{path}: field services must be a mapping of service names")
    sidecars = sorted(str(k) for k in services if k != "main")
    info: dict = {"file": rel, "services": sorted(str(k) for k in services), "sidecars": sidecars}
    if sidecars:
        reason = (
            f"{rel} starts sidecar services ({', '.join(sidecars)}) next to the task's container; "
            "only claw-sandbox's docker backend starts them (plan --backend docker)"
        )
    else:
        main = services.get("main")
        keys = ", ".join(sorted(map(str, main))) if isinstance(main, dict) and main else "empty"
        reason = f"{rel} overrides the main service ({keys}); claw-sandbox applies no compose file"
    builds: list[dict[str, str]] = []

    def tag(name: str, build: object, where: str) -> str:
        folder = build_context(build, context, where)
        image = context_tag(f"{task_id}-{name}", folder)
        builds.append({"image": image, "context": str(folder)})
        return image

    try:
        info["job_services"] = compose_services(data, rel, tag) if sidecars else []
        if builds:
            info["builds"] = builds
    except ComposeUnsupported as exc:
        info["docker_reason"] = f"{exc}: the docker backend cannot run this compose file"
    if not sidecars:
        info["docker_reason"] = reason
    return info, reason


def unsupported_reason(meta: dict, backend: str | None) -> str | None:
    """Why a task cannot run on ``backend`` (None: it can): on ``docker`` a compose task runs
    unless its file uses what docker cannot carry out; elsewhere ``meta["unsupported"]``."""
    compose = meta.get("compose")
    if backend == "docker" and isinstance(compose, dict):
        return compose.get("docker_reason")
    reason = meta.get("unsupported")
    return reason if isinstance(reason, str) else None


def _is_text(path: Path) -> bool:
    try:
        path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _read_toml(tpath: Path) -> dict:
    """task.toml as a dict ({} when the task has none)."""
    if not tpath.is_file():
        return {}
    try:
        return tomllib.loads(tpath.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise TaskError(f"{tpath}: invalid TOML: {exc}") from exc


def _instruction(task_dir: Path, meta: dict, tpath: Path, multi: bool) -> str:
    """The task's instruction.md; a multi-step task's is its first step's (claw_bench.loaders.
    harbor_tb plans every step)."""
    ipath = (
        task_dir / "steps" / step_names(meta, tpath)[0] / "instruction.md"
        if multi
        else task_dir / "instruction.md"
    )
    if not ipath.is_file():
        raise TaskError(f"{task_dir}: not a Harbor task (no {ipath.relative_to(task_dir)})")
    instruction = ipath.read_text(encoding="utf-8")
    if not instruction.strip():
        raise TaskError(f"{ipath}: instruction is empty")
    return instruction


def _task_name(meta: dict, task_dir: Path) -> str:
    """The task id: [task] name when present, else the directory's name, made id-safe."""
    ttable = t if isinstance(t := meta.get("task"), dict) else {}
    raw_name = n if isinstance(n := ttable.get("name"), str) and n else task_dir.name
    return _SAFE.sub("-", raw_name).strip("-.")[:128] or "task"


def _verifier(task_dir: Path, name: str, multi: bool) -> tuple[Script, dict[str, FileContent]]:
    """(tests/test.sh as the verifier, the rest of tests/ as hidden files). A multi-step task's
    task-level tests/ holds shared helpers and maybe a fallback test.sh; each step brings its
    own (checked per step)."""
    test_sh = task_dir / "tests" / "test.sh"
    if not test_sh.is_file() and not multi:
        raise TaskError(f"{task_dir}: missing verifier: expected tests/test.sh")
    tests = read_text_tree(task_dir / "tests", what=f"task {name}")
    tests.setdefault("test.sh", "")
    if not isinstance(tests["test.sh"], str):
        raise TaskError(f"{test_sh}: not UTF-8 text")
    hidden: dict[str, FileContent] = {f"tests/{k}": v for k, v in tests.items() if k != "test.sh"}
    return Script(name="tests/test.sh", text=tests["test.sh"], interpreter="bash"), hidden


def _timeout(meta: dict, tpath: Path, table: str, default: float) -> float:
    """[table] timeout_sec, a positive number (``default`` when absent)."""
    v = (
        meta.get(table, {}).get("timeout_sec", default)
        if isinstance(meta.get(table), dict)
        else default
    )
    if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
        raise TaskError(
            f"{tpath}: field [{table}] timeout_sec must be a positive number, got {v!r}"
        )
    return float(v)


def _allow_internet(env: dict, tpath: Path) -> bool:
    """[environment] allow_internet, after checking the task needs no GPU (jobs get none)."""
    gpus = env.get("gpus", 0)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise TaskError(
            f"{tpath}: field [environment] gpus must be a non-negative integer, got {gpus!r}"
        )
    if gpus:
        raise TaskError(
            f"{tpath}: the task needs {gpus} GPU(s) ([environment] gpus); claw-sandbox jobs get no GPU"
        )
    allow_internet = env.get("allow_internet", True)
    if not isinstance(allow_internet, bool):
        raise TaskError(
            f"{tpath}: field [environment] allow_internet must be true or false, got {allow_internet!r}"
        )
    return allow_internet


def _solution(task_dir: Path, name: str) -> tuple[Script | None, dict[str, FileContent]]:
    """(solution/solve.sh, the whole solution/ folder: solve.sh and its siblings)."""
    solve = task_dir / "solution" / "solve.sh"
    if not solve.is_file():
        return None, {}
    script = Script(name="solve.sh", text=solve.read_text(encoding="utf-8"), interpreter="bash")
    return script, read_text_tree(task_dir / "solution", what=f"task {name}")


def _build_timeout(env: dict, tpath: Path) -> float | None:
    """[environment] build_timeout_sec (claw-bench images --build kills the build then)."""
    value = env.get("build_timeout_sec")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise TaskError(
            f"{tpath}: field [environment] build_timeout_sec must be a positive number, "
            f"got {value!r}"
        )
    return float(value)


def _envs(meta: dict, tpath: Path) -> dict[str, dict[str, str]]:
    """[environment.env] as ``env`` and [solution.env] as ``solution_env``, values as strings."""
    out = {}
    for table, key in (("environment", "env"), ("solution", "solution_env")):
        t = t if isinstance(t := meta.get(table), dict) else {}
        e = t.get("env", {})
        if not isinstance(e, dict) or not all(
            isinstance(v, str | int | float | bool) for v in e.values()
        ):
            raise TaskError(f"{tpath}: field [{table}.env] must be a table of strings")
        if e:
            out[key] = {
                str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in e.items()
            }
    return out


def _image(
    context: Path, name: str, image: str | None, task_meta: dict
) -> tuple[dict[str, FileContent], dict, str | None]:
    """(workspace, meta["harbor"] so far, image) from environment/Dockerfile: its WORKDIR, the
    files it copies in, its ENV and the RUN lines it skips; an image of its own
    (claw-harbor/<task>:<sha12>) unless [environment] docker_image names one. Notes the
    Dockerfile and build context in ``task_meta``."""
    if not (context / "Dockerfile").is_file():
        return {}, {"workdir": DEFAULT_WORKDIR, "image_run": []}, image
    task_meta["dockerfile"] = str(context / "Dockerfile")
    workdir, denv, workspace, skipped = read_dockerfile(context, f"task {name}")
    harbor: dict = {"workdir": workdir, "image_run": skipped}
    if denv:  # the job's image_env: set where no image runs; [environment.env] wins over it
        harbor["image_env"] = denv
    if image is None:
        image = context_tag(name, context)
        task_meta["docker_context"] = str(context)
    return workspace, harbor, image


def load_harbor_task(task_dir: str | Path) -> Task:
    """Load one Harbor / Terminal-Bench task directory into a Task (errors name the file)."""
    task_dir = Path(task_dir)
    tpath = task_dir / "task.toml"
    meta = _read_toml(tpath)
    multi = is_harbor_multistep(task_dir)
    instruction = _instruction(task_dir, meta, tpath, multi)
    name = _task_name(meta, task_dir)
    verify, hidden = _verifier(task_dir, name, multi)
    env = meta.get("environment", {}) if isinstance(meta.get("environment"), dict) else {}
    md = meta.get("metadata", {}) if isinstance(meta.get("metadata"), dict) else {}
    tags = md.get("tags", [])
    task_meta: dict = {"allow_internet": _allow_internet(env, tpath)}
    solution, solution_files = _solution(task_dir, name)
    difficulty = md.get("difficulty")
    image = env.get("docker_image") if isinstance(env.get("docker_image"), str) else None
    context = task_dir / "environment"
    build_timeout = _build_timeout(env, tpath)
    if build_timeout is not None:
        task_meta["build_timeout_s"] = build_timeout
    task_meta.update(_envs(meta, tpath))
    workspace, harbor, image = _image(context, name, image, task_meta)
    compose = read_compose(context, name)
    if compose is not None:  # plan: a not_scorable placeholder job; load_suite(strict): an error
        task_meta["compose"], task_meta["unsupported"] = compose
    artifacts = parse_artifacts(meta.get("artifacts"), f"{tpath}: field artifacts")
    if artifacts:
        harbor["artifacts"] = artifacts  # copied to /logs/artifacts after verify (plan)
    task_meta["harbor"] = harbor
    return Task(
        id=name,
        instruction=instruction.strip() + "\n",
        timeout_s=_timeout(meta, tpath, "agent", 600.0),
        tags=tuple(str(t) for t in tags) if isinstance(tags, list) else (),
        difficulty=difficulty if difficulty in ("easy", "medium", "hard") else None,
        workspace=workspace,
        verify=verify,
        hidden=hidden,
        verify_timeout_s=_timeout(meta, tpath, "verifier", 120.0),
        solution=solution,
        solution_files=solution_files,
        reward_file=harbor_reward_file(),
        image=image,
        source="harbor",
        path=str(task_dir),
        meta=task_meta,
    )


def parse_artifacts(value: object, where: str) -> list[dict]:
    """task.toml ``artifacts``: paths, or ``{source, destination, exclude}`` tables, as
    ``[{"source": abs path, "destination": relative path, "exclude": [patterns]}]``."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise TaskError(f"{where}: must be a list of paths or {{source, destination}} tables")
    out = []
    for i, a in enumerate(value):
        src, dest, exclude = (a, None, []) if isinstance(a, str) else (None, None, [])
        if isinstance(a, dict):
            src, dest, exclude = a.get("source"), a.get("destination"), a.get("exclude", [])
        if not isinstance(src, str) or not src.startswith("/") or ".." in src.split("/"):
            raise TaskError(f"{where}[{i}]: source must be an absolute path, got {src!r}")
        src = os.path.normpath(src)
        dest = dest if dest is not None else (os.path.basename(src) or "root")
        if not isinstance(dest, str) or dest.startswith("/") or ".." in dest.split("/") or not dest:
            raise TaskError(f"{where}[{i}]: destination must be a relative path, got {dest!r}")
        if not isinstance(exclude, list) or not all(isinstance(x, str) for x in exclude):
            raise TaskError(f"{where}[{i}]: exclude must be a list of patterns")
        out.append({"source": src, "destination": os.path.normpath(dest), "exclude": exclude})
    return out


def harbor_reward_file() -> str:
    """Where a Harbor task's verifier writes its reward (an absolute path in the job)."""
    return f"{LOGS_VERIFIER}/reward.txt"
