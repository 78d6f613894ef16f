"""Checking tasks locally: run the verifier on the untouched workspace or after the reference solution.

This is how a task author proves a task is sound (`claw-bench check`): the untouched workspace
must fail and the reference solution must pass. It runs plain subprocesses in a temporary
directory: no sandbox, no harness, no proxy.
"""

from __future__ import annotations

import json
import math
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from claw_bench.errors import TaskError
from claw_bench.tasks import FileContent, Task

MODES = ("untouched", "solution")


def parse_reward(text: str) -> tuple[float | None, dict[str, float]]:
    """A verifier reward file (docs/formats.md, Verifier reward file): a number in [0, 1], or a
    non-empty JSON object of named sub-scores in [0, 1] whose mean is the reward.

    Returns (reward, sub-scores), or (None, {}) for anything else (the caller falls back to the
    verifier's exit code). The same rules as claw-sandbox's parser, held to
    formats/conformance/reward-file.jsonl.
    """
    try:
        value = json.loads(text)
    except ValueError:
        return None, {}

    def unit(x: Any) -> bool:
        return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and 0 <= x <= 1

    if unit(value):
        return float(value), {}
    if isinstance(value, dict) and value and all(unit(v) for v in value.values()):
        subs = {k: float(v) for k, v in value.items()}
        return sum(subs.values()) / len(subs), subs
    return None, {}


def _run(cmd: list[str], cwd: Path, timeout: float) -> tuple[int | None, str]:
    try:
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, errors="replace")
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout}s"
    return p.returncode, (p.stdout + p.stderr)[-4000:]


def write_files(root: Path, files: dict[str, FileContent]) -> None:
    """Write {relative path: text or bytes} under root, creating directories."""
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content.encode() if isinstance(content, str) else content)


def check_task(task: Task, mode: str = "solution", *, keep: Path | None = None) -> dict[str, Any]:
    """Run ``task`` locally in ``mode`` (untouched | solution) and verify; a result dict.

    The result holds task, mode, passed, reward, scores and the verifier's output tail.
    """
    if mode not in MODES:
        raise TaskError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "solution" and task.solution is None:
        raise TaskError(f"task {task.id}: has no reference solution (solution.sh / solution.py)")
    with tempfile.TemporaryDirectory(prefix=f"claw-check-{task.id}-") as tmp:
        root = Path(keep) if keep else Path(tmp)
        ws, side = root / "workspace", root / "side"
        ws.mkdir(parents=True)
        side.mkdir()
        write_files(ws, task.workspace)
        result: dict[str, Any] = {"task": task.id, "mode": mode}
        if task.setup:
            write_files(side, {task.setup.name: task.setup.text})
            code, out = _run(["bash", "-c", task.setup.command(str(side / task.setup.name))], ws, task.timeout_s)
            if code != 0:
                raise TaskError(f"task {task.id}: setup failed ({code}): {out}")
        if mode == "solution":
            assert task.solution is not None
            write_files(side, {task.solution.name: task.solution.text})
            code, out = _run(["bash", "-c", task.solution.command(str(side / task.solution.name))], ws, task.timeout_s)
            result["solution_exit_code"] = code
            if code != 0:
                result["solution_output"] = out
        write_files(ws, task.verify_files())
        code, out = _run(["bash", "-c", task.verify_command()], ws, task.verify_timeout_s)
        reward_path = ws / task.reward_file
        reward, subs = parse_reward(reward_path.read_text()) if reward_path.is_file() else (None, {})
        if reward is None:
            reward = 1.0 if code == 0 else 0.0
        passed = reward >= task.pass_threshold if task.pass_threshold is not None else code == 0
        result.update({"passed": bool(passed), "reward": float(reward), "scores": subs,
                       "verify_exit_code": code, "output": out})
        return result
