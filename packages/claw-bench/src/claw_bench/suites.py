"""Suites: built-in task collections shipped in the package, or any directory of tasks."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import attrs

from claw_bench.errors import TaskError
from claw_bench.harbor import is_harbor_task, load_harbor_task
from claw_bench.loaders import LoadOptions, detect_layout, load_public, load_public_dir
from claw_bench.tasks import Task, load_task


@attrs.frozen(kw_only=True)
class Suite:
    """A named, ordered collection of tasks with unique ids."""

    name: str
    tasks: tuple[Task, ...]

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
        return Suite(name=self.name, tasks=tuple(tasks))


def _builtin_root() -> Path:
    return Path(str(resources.files("claw_bench") / "suites"))


def builtin_suites() -> list[str]:
    """Names of the suites shipped inside the package."""
    root = _builtin_root()
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))


def load_any_task(path: str | Path) -> Task:
    """Load a claw task directory (task.toml + verifier) or a Harbor / Terminal-Bench one."""
    path = Path(path)
    if (path / "task.toml").is_file() and not is_harbor_task(path):
        return load_task(path)
    if is_harbor_task(path):
        return load_harbor_task(path)
    raise TaskError(f"{path}: not a task directory (need task.toml + verify script, or instruction.md + tests/)")


def _load_entry(path: Path, options: LoadOptions | None) -> list[Task]:
    """A claw task directory, or a public-layout task path (ClawGym, PinchBench, Harbor; see loaders)."""
    if path.is_dir() and (path / "task.toml").is_file() and not is_harbor_task(path):
        return [load_task(path)]
    if detect_layout(path):
        return load_public(path, options)
    return [load_any_task(path)]


def load_suite(name_or_path: str | Path, options: LoadOptions | None = None) -> Suite:
    """Load a built-in suite by name (``claw-mini``, ``claw-toy``) or a directory of tasks.

    A directory is either one task or holds one task per sub-directory (claw, Harbor or ClawGym
    layout, mixed freely) and PinchBench ``.md`` / ClawGym ``.jsonl`` files; a path may also be
    one such file. ``options`` tune the public layouts (threshold, workspace remap, checker
    timeout). Task ids must be unique; every task is validated.
    """
    s = str(name_or_path)
    path = Path(s)
    if s in builtin_suites() and not path.exists():
        path = _builtin_root() / s
    if path.is_file() and detect_layout(path):
        tasks = load_public(path, options)
    elif not path.is_dir():
        raise TaskError(f"unknown suite {s!r}: not a directory and not one of {builtin_suites()}")
    elif (path / "task.toml").is_file() or is_harbor_task(path) or detect_layout(path):
        tasks = _load_entry(path, options)
    elif (path / "tasks").is_dir() and any(detect_layout(p) == "pinchbench" for p in (path / "tasks").iterdir()):
        tasks = load_public_dir(path, options)  # a PinchBench checkout: tasks/*.md next to assets/
    else:
        entries = [p for p in sorted(path.iterdir()) if not p.name.startswith(("_", "."))
                   and (p.is_dir() or detect_layout(p))]
        tasks = [t for p in entries for t in _load_entry(p, options)]
    if not tasks:
        raise TaskError(f"suite {s}: {path} holds no task directories")
    seen: dict[str, str] = {}
    for t in tasks:
        if t.id in seen:
            raise TaskError(f"suite {s}: duplicate task id {t.id!r} in {seen[t.id]} and {t.path}")
        seen[t.id] = str(t.path)
    return Suite(name=path.name, tasks=tuple(tasks))
