"""Loaders of public task suites, as published, into claw-bench's Task model.

- ClawGym-Bench / ClawGym training tasks: directories with ``data_entry.json`` or a JSONL file
  (:mod:`claw_bench.loaders.clawgym`),
- PinchBench task Markdown files (:mod:`claw_bench.loaders.pinchbench`),
- Harbor / Terminal-Bench 2 task directories (:mod:`claw_bench.loaders.harbor_tb`),
- OfficeQA's questions CSV, scored as its ``reward.py`` scores (:mod:`claw_bench.loaders.officeqa`),

plus the optional LLM judge (:mod:`claw_bench.loaders.judge`) and transcripts for checkers built
from claw-proxy's call records (:mod:`claw_bench.loaders.transcript`).
"""

from __future__ import annotations

import json
from pathlib import Path

from claw_bench.errors import TaskError
from claw_bench.harbor import is_harbor_multistep, is_harbor_task
from claw_bench.loaders._common import LoadOptions
from claw_bench.loaders._judge_cache import JudgeCache
from claw_bench.loaders.clawgym import is_clawgym_task, load_clawgym_jsonl, load_clawgym_task
from claw_bench.loaders.harbor_tb import load_harbor_tb_task
from claw_bench.loaders.judge import Judge, JudgeError, apply_judge
from claw_bench.loaders.officeqa import is_officeqa_csv, load_officeqa_csv
from claw_bench.loaders.pinchbench import is_pinchbench_file, load_pinchbench_task
from claw_bench.loaders.rubric import RubricError, apply_rubric_chain
from claw_bench.tasks import Task

LAYOUTS = ("clawgym", "clawgym-jsonl", "pinchbench", "harbor", "officeqa")


def detect_layout(path: str | Path) -> str | None:
    """The public layout of one task path (see LAYOUTS), or None when it is none of them."""
    path = Path(path)
    if path.is_file():
        if path.suffix == ".jsonl":
            return "clawgym-jsonl" if _looks_like_clawgym_jsonl(path) else None
        if is_officeqa_csv(path):
            return "officeqa"
        return "pinchbench" if is_pinchbench_file(path) else None
    if is_clawgym_task(path):
        return "clawgym"
    if is_harbor_task(path) or is_harbor_multistep(path):
        return "harbor"
    return None


def _looks_like_clawgym_jsonl(path: Path) -> bool:
    """False only when the first line is a JSON object of another kind (e.g. claw records)."""
    with path.open(encoding="utf-8", errors="replace") as fh:
        first = next((ln for ln in fh if ln.strip()), "")
    try:
        row = json.loads(first)
    except json.JSONDecodeError:
        return True  # let the loader name the bad line
    return not isinstance(row, dict) or "schema" not in row or "prompt" in row or "hook_code" in row


def load_public(path: str | Path, opts: LoadOptions | None = None) -> list[Task]:
    """The tasks of one public-layout path: a task directory, a PinchBench .md or a ClawGym .jsonl."""
    layout = detect_layout(path)
    if layout == "clawgym":
        return [load_clawgym_task(path, opts)]
    if layout == "clawgym-jsonl":
        return load_clawgym_jsonl(path, opts)
    if layout == "pinchbench":
        return [load_pinchbench_task(path, opts)]
    if layout == "harbor":
        return [load_harbor_tb_task(path, opts)]
    if layout == "officeqa":
        return load_officeqa_csv(path, opts)
    raise TaskError(
        f"{path}: not a public task (expected data_entry.json, instruction.md + tests/, "
        "a PinchBench .md with front matter, a ClawGym .jsonl or an OfficeQA .csv)"
    )


def load_public_dir(path: str | Path, opts: LoadOptions | None = None) -> list[Task]:
    """Every public task under a directory: the directory itself, its entries, or its ``tasks/``."""
    path = Path(path)
    if detect_layout(path):
        return load_public(path, opts)
    root = (
        path / "tasks"
        if (path / "tasks").is_dir() and not any(detect_layout(p) for p in path.iterdir())
        else path
    )
    entries = [
        p for p in sorted(root.iterdir()) if not p.name.startswith(("_", ".")) and detect_layout(p)
    ]
    return [t for p in entries for t in load_public(p, opts)]


__all__ = [
    "LAYOUTS",
    "Judge",
    "JudgeCache",
    "JudgeError",
    "LoadOptions",
    "RubricError",
    "apply_judge",
    "apply_rubric_chain",
    "detect_layout",
    "load_clawgym_jsonl",
    "load_clawgym_task",
    "load_harbor_tb_task",
    "load_officeqa_csv",
    "load_pinchbench_task",
    "load_public",
    "load_public_dir",
]
