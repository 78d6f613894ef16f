"""ClawGym-Bench / ClawGym training tasks, as published: task directories or the JSONL form.

A task directory::

    task_0001/
      data_entry.json     {"task_id", "user_query", "input_mount_dir" (absent without inputs),
                           "metadata": {"category", "grading_type", optional "rule", "rules"}}
      input_files/...     the mock workspace, copied as-is into the workspace
      reward/reward.sh    the verifier entry point; the LAST stdout line is the reward in [0, 1]
      reward/check.py     the checker (`python3 reward/check.py WORKSPACE`; one that only defines
                          PinchBench's grade(transcript, workspace_path) is called as grade([], WS))

The JSONL form holds one task a line: ``prompt``, ``hook_code`` (the verifier command, such as
``python3 reward/test.py /root/.openclaw/workspace``), ``input_files: [{file_path, content}]``
(the checker among them under ``reward/``), optional ``task_id``, ``rule``, ``rules``,
``origin_template``, ``input_mount_dir``.

The ``reward/`` folder becomes hidden verify files: placed only after the agent finished, so the
agent never sees it. The task's mount dir (default ``/root/.openclaw/workspace``) is remapped to
the real workspace (see LoadOptions.workspace_dir); in the instruction it becomes ``.`` (the
agent's working directory is the workspace) unless a fixed workspace dir is configured.
Hybrid tasks (``rules``: LLM-judge rubric items) score 0.7 x checker + 0.3 x judge.
"""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath
from typing import Any

from claw_bench.errors import TaskError
from claw_bench.loaders._common import (
    DEFAULT_CHECKER_TIMEOUT_S,
    DETAILS_FILE,
    JUDGE_FILES,
    VERIFY_MARGIN_S,
    LoadOptions,
    judge_spec,
    runner_config,
    runner_script,
)
from claw_bench.tasks import TASK_ID, Task, read_text_tree

DEFAULT_MOUNT = "/root/.openclaw/workspace"
HYBRID_WEIGHTS = (0.7, 0.3)
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def is_clawgym_task(path: Path) -> bool:
    """True when ``path`` is a ClawGym task directory (holds data_entry.json)."""
    return (path / "data_entry.json").is_file()


def _safe_id(raw: str, where: str) -> str:
    tid = _SAFE.sub("-", raw).strip("-.")
    if not tid or not TASK_ID.match(tid):
        raise TaskError(f"{where}: cannot make a task id of {raw!r}")
    return tid


def _rubric(rules: Any, where: str) -> str | None:
    """The judge rubric text of ClawGym ``rules`` ([{name, file_path, scores: {"0": ..., "1": ...}}])."""
    if rules in (None, []):
        return None
    if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
        raise TaskError(f"{where}: field 'rules' must be a list of objects")
    parts = []
    for i, r in enumerate(rules):
        name, scores = r.get("name"), r.get("scores")
        if not isinstance(name, str) or not isinstance(scores, dict) or not scores:
            raise TaskError(
                f"{where}: field 'rules[{i}]' needs a 'name' and a non-empty 'scores' object"
            )
        head = f"### {name}" + (
            f" (file: {r['file_path']})" if isinstance(r.get("file_path"), str) else ""
        )
        levels = "\n".join(
            f"- {k}: {v}" for k, v in sorted(scores.items(), key=lambda kv: float(kv[0]))
        )
        parts.append(f"{head}\n{levels}")
    return (
        "Score each criterion with one of its levels; the score is the mean of the criteria, "
        "in [0, 1].\n\n" + "\n\n".join(parts)
    )


def _build(
    *,
    tid: str,
    query: str,
    mount: str | None,
    command: str,
    grade_file: str | None = None,
    workspace: dict[str, str | bytes],
    reward_files: dict[str, str | bytes],
    meta: dict[str, Any],
    rules: Any,
    where: str,
    path: str,
    opts: LoadOptions,
) -> Task:
    if not isinstance(query, str) or not query.strip():
        raise TaskError(f"{where}: field 'user_query'/'prompt' must be a non-empty string")
    if not reward_files:
        raise TaskError(
            f"{where}: missing checker: no reward/ files (reward/reward.sh or reward/check.py)"
        )
    mount = mount or DEFAULT_MOUNT
    target = opts.workspace_dir or "."
    instruction = query.replace(
        mount.rstrip("/") + "/", "" if target == "." else target.rstrip("/") + "/"
    )
    instruction = instruction.replace(mount.rstrip("/"), target)
    timeout = opts.checker_timeout_s or DEFAULT_CHECKER_TIMEOUT_S
    rubric = _rubric(rules, where)
    hidden: dict[str, str | bytes] = {f"reward/{k}": v for k, v in reward_files.items()}
    hidden["runner.json"] = runner_config(
        kind="clawgym",
        command=command,
        grade_file=grade_file,
        mount_dir=mount,
        workspace_dir=opts.workspace_dir,
        timeout_s=timeout,
        threshold=opts.pass_threshold,
        judge_files=bool(rubric),
    )
    task_meta: dict[str, Any] = {"collect": [DETAILS_FILE], "clawgym": meta, "mount_dir": mount}
    if rubric:
        a, j = HYBRID_WEIGHTS
        task_meta["judge"] = judge_spec(
            rubric=rubric, instruction=instruction, automated=a, llm_judge=j, grading="hybrid"
        )
        task_meta["collect"] = [DETAILS_FILE, JUDGE_FILES]
    category = meta.get("category") if isinstance(meta, dict) else None
    return Task(
        id=tid,
        instruction=instruction.strip() + "\n",
        workspace=workspace,
        verify=runner_script(),
        hidden=hidden,
        verify_timeout_s=timeout + VERIFY_MARGIN_S,
        pass_threshold=opts.pass_threshold,
        tags=("clawgym", *([category] if isinstance(category, str) and category else [])),
        source="clawgym",
        path=path,
        meta=task_meta,
    )


def load_clawgym_task(task_dir: str | Path, opts: LoadOptions | None = None) -> Task:
    """One ClawGym task directory (data_entry.json, input_files/, reward/) as a Task."""
    opts = opts or LoadOptions()
    task_dir = Path(task_dir)
    entry_path = task_dir / "data_entry.json"
    if not entry_path.is_file():
        raise TaskError(f"{task_dir}: not a ClawGym task (no data_entry.json)")
    try:
        entry = json.loads(entry_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise TaskError(f"{entry_path}: invalid JSON: {exc.msg} (line {exc.lineno})") from exc
    if not isinstance(entry, dict):
        raise TaskError(f"{entry_path}: expected a JSON object")
    where = str(entry_path)
    tid = _safe_id(str(entry.get("task_id") or task_dir.name), where)
    mount = entry.get("input_mount_dir")
    if mount is not None and (not isinstance(mount, str) or not mount.startswith("/")):
        raise TaskError(f"{where}: field 'input_mount_dir' must be an absolute path, got {mount!r}")
    reward = read_text_tree(task_dir / "reward", what=f"task {tid}")
    grade_file = None
    if "reward.sh" in reward:
        command = "bash reward/reward.sh"
    elif "check.py" in reward:
        command = f"python3 reward/check.py {mount or DEFAULT_MOUNT}"
        text = reward["check.py"]
        if (
            isinstance(text, str)
            and "def grade(" in text
            and "__main__" not in text
            and "sys.argv" not in text
        ):
            grade_file = (
                "reward/check.py"  # PinchBench signature only: called as grade([], workspace)
            )
    else:
        raise TaskError(
            f"task {tid} ({task_dir}): missing checker: expected reward/reward.sh or reward/check.py"
        )
    meta = entry.get("metadata") or {}
    if not isinstance(meta, dict):
        raise TaskError(f"{where}: field 'metadata' must be an object")
    return _build(
        tid=tid,
        query=entry.get("user_query"),  # type: ignore[arg-type]
        mount=mount,
        command=command,
        grade_file=grade_file,
        workspace=read_text_tree(task_dir / "input_files", what=f"task {tid}"),
        reward_files=reward,
        meta=meta,
        rules=meta.get("rules", entry.get("rules")),
        where=where,
        path=str(task_dir),
        opts=opts,
    )


def _rel(file_path: Any, mount: str, where: str) -> str:
    if not isinstance(file_path, str) or not file_path:
        raise TaskError(f"{where}: 'file_path' must be a non-empty string")
    p = file_path
    if p.startswith(mount.rstrip("/") + "/"):
        p = p[len(mount.rstrip("/")) + 1 :]
    if p.startswith("/") or ".." in PurePosixPath(p).parts:
        raise TaskError(f"{where}: 'file_path' {file_path!r} is outside the workspace ({mount})")
    return PurePosixPath(p).as_posix()


def load_clawgym_jsonl(path: str | Path, opts: LoadOptions | None = None) -> list[Task]:
    """Every task of a ClawGym JSONL file (errors name the file and line)."""
    opts = opts or LoadOptions()
    path = Path(path)
    tasks = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TaskError(f"{where}: not JSON: {exc.msg} (column {exc.colno})") from exc
        if not isinstance(row, dict):
            raise TaskError(f"{where}: expected a JSON object")
        mount = row.get("input_mount_dir") or DEFAULT_MOUNT
        command = row.get("hook_code")
        if not isinstance(command, str) or not command.strip():
            raise TaskError(
                f"{where}: missing checker: field 'hook_code' must be the verifier command"
            )
        files = row.get("input_files") or []
        if not isinstance(files, list):
            raise TaskError(
                f"{where}: field 'input_files' must be a list of {{file_path, content}}"
            )
        workspace, reward = {}, {}
        for i, f in enumerate(files):
            fw = f"{where}: input_files[{i}]"
            if not isinstance(f, dict) or not isinstance(f.get("content"), str):
                raise TaskError(f"{fw}: needs 'file_path' and a string 'content'")
            rel = _rel(f.get("file_path"), mount, fw)
            if rel.startswith("reward/"):
                reward[rel[len("reward/") :]] = f["content"]
            else:
                workspace[rel] = f["content"]
        raw_id = row.get("task_id") or row.get("id") or f"{path.stem}-{lineno:04d}"
        meta = {k: row[k] for k in ("rule", "origin_template", "metadata") if k in row}
        tasks.append(
            _build(
                tid=_safe_id(str(raw_id), where),
                query=row.get("prompt"),  # type: ignore[arg-type]
                mount=mount,
                command=command,
                workspace=workspace,
                reward_files=reward,
                meta=meta,
                rules=row.get("rules"),
                where=where,
                path=f"{path}:{lineno}",
                opts=opts,
            )
        )
    if not tasks:
        raise TaskError(f"{path}: holds no tasks")
    return tasks
