"""Suites: built-in task collections shipped in the package, or any directory of tasks."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import attrs
import yaml

from claw_bench.errors import TaskError
from claw_bench.families import is_family_dir, load_family
from claw_bench.harbor import (
    is_harbor_multistep,
    is_harbor_task,
    load_harbor_task,
    unsupported_reason,
)
from claw_bench.loaders import LoadOptions, detect_layout, load_harbor_tb_task, load_public
from claw_bench.tasks import Task, load_task


@attrs.frozen(kw_only=True)
class Suite:
    """A named, ordered collection of tasks with unique ids."""

    name: str
    tasks: tuple[Task, ...]
    #: (path, reason) of each task of the collection that did not load (see load_suite)
    skipped: tuple[tuple[str, str], ...] = ()

    def get(self, task_id: str) -> Task:
        """The task with this id (TaskError naming the suite when absent)."""
        for t in self.tasks:
            if t.id == task_id:
                return t
        raise TaskError(f"suite {self.name}: no task {task_id!r}")

    def select(self, ids: list[str] | None = None, tags: list[str] | None = None) -> Suite:
        """A sub-suite: tasks whose id is in ``ids`` (if given) and that carry all ``tags``."""
        tasks = [self.get(i) for i in ids] if ids else list(self.tasks)
        if tags:
            tasks = [t for t in tasks if set(tags) <= set(t.tags)]
        return Suite(name=self.name, tasks=tuple(tasks), skipped=self.skipped)


def _builtin_root() -> Path:
    return Path(str(resources.files("claw_bench") / "suites"))


def builtin_suites() -> list[str]:
    """Names of the suites shipped inside the package."""
    root = _builtin_root()
    return sorted(
        p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))
    )


def load_any_task(path: str | Path) -> Task:
    """Load a claw task directory (task.toml + verifier) or a Harbor / Terminal-Bench one."""
    path = Path(path)
    if is_harbor_multistep(path):
        return load_harbor_tb_task(path)  # its steps need the verify runner of every step
    if (path / "task.toml").is_file() and not is_harbor_task(path):
        return load_task(path)
    if is_harbor_task(path):
        return load_harbor_task(path)
    raise TaskError(
        f"{path}: not a task directory (need task.toml + verify script, or instruction.md + tests/)"
    )


def _load_entry(path: Path, options: LoadOptions | None) -> list[Task]:
    """A claw task directory, or a public-layout task path (ClawGym, PinchBench, Harbor; see loaders)."""
    if is_family_dir(path):
        return load_family(path)
    if (
        path.is_dir()
        and (path / "task.toml").is_file()
        and not is_harbor_task(path)
        and not is_harbor_multistep(path)
    ):
        return [load_task(path)]
    if detect_layout(path):
        return load_public(path, options)
    return [load_any_task(path)]


def pinchbench_task_files(tasks_dir: Path) -> tuple[list[Path], list[tuple[str, str]]]:
    """A PinchBench ``tasks/`` folder's task files, and the entries that name no file.

    The list in ``tasks/manifest.yaml`` (``tasks: [task id, ...]``, each the name of a ``.md``
    file here) when present, in its order; else every ``task_*.md`` by name. Other Markdown here
    (``TASK_TEMPLATE.md``, READMEs) is not a task.
    """
    manifest = tasks_dir / "manifest.yaml"
    if not manifest.is_file():
        return sorted(tasks_dir.glob("task_*.md")), []
    try:
        data = yaml.safe_load(manifest.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise TaskError(f"{manifest}: invalid YAML: {exc}") from exc
    ids = data.get("tasks") if isinstance(data, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
        raise TaskError(
            f"{manifest}: field 'tasks' must be a list of task ids (file names without .md)"
        )
    files, missing = [], []
    for i, tid in enumerate(ids):
        p = tasks_dir / f"{tid.removesuffix('.md')}.md"
        if p.is_file() and p.resolve().parent == tasks_dir.resolve():
            files.append(p)
        else:
            missing.append(
                (f"{manifest}: tasks[{i}]", f"{tid!r} names no file {p.name} in {tasks_dir}")
            )
    return files, missing


def _is_pinchbench_tasks_dir(path: Path) -> bool:
    """A folder of PinchBench task files only (with manifest.yaml, or task_*.md and no task folders)."""
    if not path.is_dir():
        return False
    if (path / "manifest.yaml").is_file():
        return True
    return any(path.glob("task_*.md")) and not any(
        p.is_dir() and ((p / "task.toml").is_file() or detect_layout(p)) for p in path.iterdir()
    )


def _collect(
    entries: list[Path],
    options: LoadOptions | None,
    strict: bool,
    skipped: list[tuple[str, str]],
) -> list[Task]:
    """The tasks of a collection's entries; one that does not load is added to ``skipped`` with
    the reason (``strict``: a TaskError)."""
    tasks: list[Task] = []
    for p in entries:
        try:
            tasks.extend(_load_entry(p, options))
        except (TaskError, OSError, ValueError) as exc:
            if strict:
                raise TaskError(
                    f"{p}: {exc}" if not isinstance(exc, TaskError) else str(exc)
                ) from exc
            skipped.append(
                (
                    str(p),
                    str(exc) if isinstance(exc, TaskError) else f"{type(exc).__name__}: {exc}",
                )
            )
    return tasks


def _is_one_task(path: Path) -> bool:
    """A directory that is one task (claw, task family, Harbor, multi-step Harbor, ClawGym)."""
    return (
        (path / "task.toml").is_file()
        or is_family_dir(path)
        or is_harbor_task(path)
        or bool(detect_layout(path))
        or is_harbor_multistep(path)
    )


def _check_suite(
    s: str,
    path: Path,
    tasks: list[Task],
    skipped: list[tuple[str, str]],
    strict: bool,
    backend: str | None = None,
) -> None:
    """TaskError for a suite without tasks, with a duplicate id, or (``strict``) with a task that
    cannot run."""
    if not tasks:
        why = "".join(f"\n  skipped {p}: {r}" for p, r in skipped[:5])
        raise TaskError(
            f"suite {s}: {path} holds no loadable tasks"
            + (f" ({len(skipped)} skipped){why}" if skipped else "")
        )
    for t in tasks if strict else ():
        reason = unsupported_reason(t.meta, backend)  # planned as not_scorable without strict
        if reason is not None:
            raise TaskError(f"{t.path}: task {t.id} cannot run: {reason}")
    seen: dict[str, str] = {}
    for t in tasks:
        if t.id in seen:
            raise TaskError(f"suite {s}: duplicate task id {t.id!r} in {seen[t.id]} and {t.path}")
        seen[t.id] = str(t.path)


def load_suite(
    name_or_path: str | Path,
    options: LoadOptions | None = None,
    *,
    strict: bool = False,
    backend: str | None = None,
) -> Suite:
    """Load a built-in suite by name (``claw-mini``, ``claw-toy``) or a directory of tasks.

    A directory is either one task or holds one task per sub-directory (claw, Harbor or ClawGym
    layout, mixed freely; a task-family directory, with ``family.toml``, gives all its generated
    instances, see claw_bench.families) and PinchBench ``.md`` / ClawGym ``.jsonl`` files; a path may also be
    one such file. A PinchBench checkout (its ``tasks/`` next to ``assets/``, whatever else sits
    at its root) or its ``tasks/`` folder loads ``tasks/manifest.yaml``'s list, else the
    ``task_*.md`` files. ``options`` tune the public layouts (threshold, workspace remap,
    checker timeout).

    A task of a collection that does not load is skipped and named with the reason in
    ``Suite.skipped`` (``strict``: the first such task is a TaskError, as is a task that loads
    but cannot run on ``backend``, e.g. a Harbor task with compose sidecars off docker: see
    claw_bench.harbor.unsupported_reason). A path
    that is one task must load. Task ids must be unique; every task is validated.
    """
    s = str(name_or_path)
    path = Path(s)
    if s in builtin_suites() and not path.exists():
        path = _builtin_root() / s
    skipped: list[tuple[str, str]] = []
    tasks: list[Task]
    if path.is_file() and detect_layout(path):
        tasks = load_public(path, options)
    elif not path.is_dir():
        raise TaskError(f"unknown suite {s!r}: not a directory and not one of {builtin_suites()}")
    elif _is_one_task(path):
        tasks = _load_entry(path, options)
    elif _is_pinchbench_tasks_dir(path / "tasks") or _is_pinchbench_tasks_dir(path):
        tdir = path / "tasks" if _is_pinchbench_tasks_dir(path / "tasks") else path
        files, missing = pinchbench_task_files(
            tdir
        )  # a PinchBench checkout: tasks/*.md next to assets/
        if missing and strict:
            raise TaskError(f"{missing[0][0]}: {missing[0][1]}")
        skipped.extend(missing)
        tasks = _collect(files, options, strict, skipped)
    else:
        tasks = _collect(
            [
                p
                for p in sorted(path.iterdir())
                if not p.name.startswith(("_", ".")) and (p.is_dir() or detect_layout(p))
            ],
            options,
            strict,
            skipped,
        )
    _check_suite(s, path, tasks, skipped, strict, backend)
    return Suite(name=path.name, tasks=tuple(tasks), skipped=tuple(skipped))
