"""PinchBench tasks, as published: one Markdown file per task (``tasks/task_*.md``).

A task file: YAML front matter (``id, name, category, grading_type: automated | llm_judge |
hybrid, timeout_seconds, workspace_files: [{source, dest} | {path, content}]``, optional
``grading_weights: {automated, llm_judge}`` and ``sessions: [{id, prompt, new_session}]``: a
multi-session task, its prompts run one after another in the same workspace, graded at the end,
each ``timeout_seconds`` long), then the sections ``## Prompt``, ``## Expected
Behavior``, ``## Grading Criteria``, ``## Automated Checks`` (a fenced python block defining
``grade(transcript, workspace_path) -> dict``) and ``## LLM Judge Rubric``.

The automated score is the mean of grade()'s values; hybrid = weighted mean with the judge
(0.5 / 0.5 unless grading_weights says otherwise); llm_judge = the judge alone. A rubric written
as ``### Criterion N: Name (Weight: W%)`` sections, as PinchBench's are, is judged criterion by
criterion (claw_bench.loaders.rubric: one graded question each, weighted W); any other rubric
is judged whole (claw_bench.loaders.judge). grade() runs in
the verify step (hidden from the agent); it gets the session transcript when the verify step
finds one (``$CLAW_TRANSCRIPT_FILE`` or ``.claw_verify/transcript.json``), else ``[]``; the
runner snapshots the workspace so ``claw-bench regrade`` can re-run grade() with the transcript
built from claw-proxy's records afterwards.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from claw_bench.errors import TaskError
from claw_bench.loaders._common import (
    DETAILS_FILE,
    JUDGE_FILES,
    VERIFY_MARGIN_S,
    LoadOptions,
    judge_spec,
    runner_config,
    runner_script,
)
from claw_bench.loaders.rubric import pinchbench_criteria
from claw_bench.tasks import TASK_ID, FileContent, Task

GRADING_TYPES = ("automated", "llm_judge", "hybrid")
_SECTION = re.compile(r"^##\s+(.+?)\s*$", re.M)
_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.S)


def is_pinchbench_file(path: Path) -> bool:
    """True when ``path`` is a Markdown file that starts with YAML front matter."""
    if path.suffix != ".md" or not path.is_file():
        return False
    with path.open(encoding="utf-8", errors="replace") as fh:
        return fh.readline().strip() == "---"


def _split(text: str, where: str) -> tuple[dict[str, Any], dict[str, str]]:
    if not text.startswith("---"):
        raise TaskError(f"{where}: no YAML front matter (the file must start with ---)")
    end = text.find("\n---", 3)
    if end < 0:
        raise TaskError(f"{where}: front matter is not closed by a --- line")
    try:
        front = yaml.safe_load(text[3:end])
    except yaml.YAMLError as exc:
        raise TaskError(f"{where}: invalid YAML front matter: {exc}") from exc
    if not isinstance(front, dict):
        raise TaskError(f"{where}: front matter must be a mapping")
    body = text[end + 4 :]
    heads = list(_SECTION.finditer(body))
    sections = {
        m.group(1).strip().lower(): body[
            m.end() : (heads[i + 1].start() if i + 1 < len(heads) else len(body))
        ].strip()
        for i, m in enumerate(heads)
    }
    return front, sections


def _source_file(source: str, task_file: Path, opts: LoadOptions, where: str) -> FileContent:
    roots = (
        [Path(opts.assets_dir)]
        if opts.assets_dir
        else [task_file.parent.parent / "assets", task_file.parent]
    )
    for root in roots:
        p = root / source
        if p.is_file():
            data = p.read_bytes()
            try:
                return data.decode("utf-8")
            except UnicodeDecodeError:
                return data  # binary assets (.xlsx, .pdf, images) travel byte-exact
    raise TaskError(
        f"{where}: source {source!r} not found under {', '.join(str(r) for r in roots)}"
    )


def _workspace(
    front: dict[str, Any], task_file: Path, opts: LoadOptions, where: str
) -> dict[str, FileContent]:
    items = front.get("workspace_files") or []
    if not isinstance(items, list):
        raise TaskError(f"{where}: field 'workspace_files' must be a list")
    files: dict[str, FileContent] = {}
    for i, item in enumerate(items):
        fw = f"{where}: workspace_files[{i}]"
        if not isinstance(item, dict):
            raise TaskError(f"{fw}: expected {{source, dest}} or {{path, content}}")
        if "content" in item:
            dest, content = item.get("path") or item.get("dest"), item["content"]
            if not isinstance(content, str):
                raise TaskError(f"{fw}: 'content' must be a string")
        elif "source" in item:
            dest = item.get("dest") or item["source"]
            content = _source_file(str(item["source"]), task_file, opts, fw)
        else:
            raise TaskError(f"{fw}: needs 'source' (+ 'dest') or 'path' + 'content'")
        if (
            not isinstance(dest, str)
            or not dest
            or dest.startswith("/")
            or ".." in PurePosixPath(dest).parts
        ):
            raise TaskError(
                f"{fw}: destination {dest!r} must be a relative path inside the workspace"
            )
        files[PurePosixPath(dest).as_posix()] = content
    return files


def _task_id(front: dict[str, Any], task_file: Path, where: str) -> str:
    """The front matter's ``id`` (else the file's stem), made id-safe."""
    raw_id = front.get("id") or task_file.stem
    tid = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(raw_id)).strip("-.")
    if not TASK_ID.match(tid):
        raise TaskError(f"{where}: field 'id' {raw_id!r} is not a usable task id")
    return tid


def _prompt(sections: dict[str, str], sessions: list[dict[str, Any]], where: str) -> str:
    """The ``## Prompt`` section; a multi-session task's session prompts, numbered (the agent
    gets them one by one; the judge reads them all)."""
    prompt = sections.get("prompt")
    if sessions:
        prompt = "\n\n".join(
            f"Session {i + 1} ({s['id']}{', new session' if s['new_session'] else ''}):\n"
            f"{s['prompt'].strip()}"
            for i, s in enumerate(sessions)
        )
    if not prompt:
        raise TaskError(f"{where}: missing section '## Prompt'")
    return prompt


def _checker(grading: str, sections: dict[str, str], where: str) -> str | None:
    """The ``## Automated Checks`` python block (defining grade) of an automated or hybrid task."""
    if grading not in ("automated", "hybrid"):
        return None
    block = _FENCE.search(sections.get("automated checks", ""))
    if not block or "def grade" not in block.group(1):
        raise TaskError(
            f"{where}: missing checker: grading_type {grading} needs a '## Automated Checks' "
            "section with a python block defining grade(transcript, workspace_path)"
        )
    return block.group(1)


def _judge(
    front: dict[str, Any], grading: str, rubric: str | None, prompt: str, where: str
) -> dict[str, Any]:
    """The judge spec of an llm_judge or hybrid task: its rubric and the normalised weights of the
    automated checks and the judge (``grading_weights``; llm_judge alone is 0 / 1)."""
    weights = front.get("grading_weights") or {}
    if not isinstance(weights, dict):
        raise TaskError(
            f"{where}: field 'grading_weights' must be a mapping {{automated, llm_judge}}"
        )
    a, j = (
        (0.0, 1.0)
        if grading == "llm_judge"
        else (weights.get("automated", 0.5), weights.get("llm_judge", 0.5))
    )
    for name, w in (("automated", a), ("llm_judge", j)):
        if isinstance(w, bool) or not isinstance(w, int | float) or w < 0:
            raise TaskError(
                f"{where}: field 'grading_weights.{name}' must be a non-negative number, got {w!r}"
            )
    if a + j <= 0:
        raise TaskError(f"{where}: field 'grading_weights' must not be all zero")
    return judge_spec(
        rubric=str(rubric),
        instruction=prompt,
        automated=a / (a + j),
        llm_judge=j / (a + j),
        grading=grading,
        criteria=pinchbench_criteria(str(rubric)),
    )


def load_pinchbench_task(task_file: str | Path, opts: LoadOptions | None = None) -> Task:
    """One PinchBench task Markdown file as a Task (errors name the file and field)."""
    opts = opts or LoadOptions()
    task_file = Path(task_file)
    where = str(task_file)
    front, sections = _split(task_file.read_text(encoding="utf-8"), where)
    sessions = _sessions(front.get("sessions"), where)
    tid = _task_id(front, task_file, where)
    grading = front.get("grading_type", "automated")
    if grading not in GRADING_TYPES:
        raise TaskError(
            f"{where}: field 'grading_type' must be one of {GRADING_TYPES}, got {grading!r}"
        )
    prompt = _prompt(sections, sessions, where)
    code = _checker(grading, sections, where)
    rubric = sections.get("llm judge rubric")
    if grading in ("llm_judge", "hybrid") and not rubric:
        raise TaskError(f"{where}: grading_type {grading} needs a '## LLM Judge Rubric' section")
    timeout = front.get("timeout_seconds", 600)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise TaskError(
            f"{where}: field 'timeout_seconds' must be a positive number, got {timeout!r}"
        )
    checker_timeout = opts.checker_timeout_s or 120.0
    hidden: dict[str, str | bytes] = {
        "runner.json": runner_config(
            kind="pinchbench" if code else "none",
            timeout_s=checker_timeout,
            workspace_dir=opts.workspace_dir,
            threshold=opts.pass_threshold,
            judge_files=True,
        )
    }
    if code:
        hidden["grade.py"] = code
    # the workspace snapshot serves the judge and `claw-bench regrade` (grade() with the transcript)
    meta: dict[str, Any] = {
        "collect": [DETAILS_FILE, JUDGE_FILES],
        "pinchbench": {k: front[k] for k in ("name", "category") if k in front},
    }
    for key, name in (
        ("expected_behavior", "expected behavior"),
        ("grading_criteria", "grading criteria"),
    ):
        if sections.get(name):
            meta[key] = sections[name]
    if grading != "automated":
        meta["judge"] = _judge(front, grading, rubric, prompt, where)
    if sessions:
        meta["sessions"] = sessions  # run as successive prompts (claw_bench.plan)
    category = front.get("category")
    return Task(
        id=tid,
        instruction=prompt.strip() + "\n",
        timeout_s=float(timeout),
        tags=("pinchbench", *([str(category)] if category else [])),
        workspace=_workspace(front, task_file, opts, where),
        verify=runner_script(),
        hidden=hidden,
        verify_timeout_s=checker_timeout + VERIFY_MARGIN_S,
        pass_threshold=opts.pass_threshold,
        source="pinchbench",
        path=str(task_file),
        meta=meta,
    )


def _sessions(value: Any, where: str) -> list[dict[str, Any]]:
    """``sessions: [{id, prompt, new_session}]`` of a multi-session task: successive prompts in
    one workspace; ``new_session: true`` starts the harness afresh, else the prompt continues the
    session before it (where the harness adapter can; see claw_bench.plan)."""
    if not value:
        return []
    if not isinstance(value, list):
        raise TaskError(f"{where}: field 'sessions' must be a list of {{id, prompt}}")
    out, seen = [], set()
    for i, s in enumerate(value):
        if (
            not isinstance(s, dict)
            or not isinstance(s.get("prompt"), str)
            or not s["prompt"].strip()
        ):
            raise TaskError(f"{where}: field 'sessions[{i}].prompt' must be a non-empty string")
        sid = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(s.get("id") or f"session_{i + 1}")).strip("-.")
        if not sid or sid in seen:
            raise TaskError(
                f"{where}: field 'sessions[{i}].id' {s.get('id')!r} is empty or repeats"
            )
        seen.add(sid)
        new = s.get("new_session", False)
        if not isinstance(new, bool):
            raise TaskError(f"{where}: field 'sessions[{i}].new_session' must be true or false")
        out.append({"id": sid, "prompt": s["prompt"], "new_session": new})
    return out
