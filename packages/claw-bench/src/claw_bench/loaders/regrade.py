"""Re-grading finished runs with the session transcript (PinchBench-style checkers that read it).

The harness's calls are recorded by claw-proxy on the host, so the sandbox's verify step cannot
see them. ``regrade_run`` re-runs a task's checker afterwards, on the host (plain subprocesses in
a temporary directory, like ``claw-bench check``): it rebuilds the final workspace from the run's
snapshot (``.claw_verify/judge_files.json``, written by the runner of PinchBench tasks and of
judge-graded ClawGym tasks), places the hidden checker files and the transcript built from the
session's ``claw.call/v1`` records, runs the verify command and replaces the run's verify result.
Only the agent's UTF-8 text files are in the snapshot (binary files are left out).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from claw_bench.check import write_files
from claw_bench.errors import TaskError
from claw_bench.loaders._common import DETAILS_FILE, JUDGE_FILES
from claw_bench.loaders.transcript import TRANSCRIPT_FILE, transcript_from_calls
from claw_bench.reward import parse_reward
from claw_bench.tasks import Task


def regrade_run(run: dict[str, Any], task: Task, calls: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """A copy of ``run`` whose verify result comes from re-running ``task``'s checker with the transcript.

    Runs without a verify result (infra errors) come back unchanged. TaskError when the run holds
    no workspace snapshot (the task's runner does not write one).
    """
    if not isinstance(run.get("verify"), dict):
        return run
    meta = run.get("meta") or {}
    snap = (run.get("collected") or {}).get(JUDGE_FILES)
    if not isinstance(snap, str):
        raise TaskError(
            f"run {run.get('job_id')}: task {task.id}: no {JUDGE_FILES} collected "
            "(only PinchBench and judge-graded ClawGym tasks snapshot the workspace)"
        )
    try:
        files = json.loads(snap)
    except json.JSONDecodeError as exc:
        raise TaskError(f"run {run.get('job_id')}: {JUDGE_FILES} is not JSON: {exc}") from exc
    files = {k: v for k, v in files.items() if isinstance(v, str) and not k.startswith("[")}
    transcript = transcript_from_calls(calls, meta.get("session"))
    with tempfile.TemporaryDirectory(prefix=f"claw-regrade-{task.id}-") as tmp:
        ws = Path(tmp)
        write_files(ws, files)
        write_files(ws, task.verify_files())
        write_files(ws, {TRANSCRIPT_FILE: json.dumps(transcript)})
        try:
            p = subprocess.run(
                ["bash", "-c", task.verify_command()],
                cwd=ws,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=task.verify_timeout_s,
            )
            code, out, timed_out = p.returncode, p.stdout + p.stderr, False
        except subprocess.TimeoutExpired:
            code, out, timed_out = None, f"timed out after {task.verify_timeout_s}s", True
        rf = ws / task.reward_file
        reward, subs = parse_reward(rf.read_text()) if rf.is_file() else (None, {})
        details_file = ws / DETAILS_FILE
        details_text = details_file.read_text() if details_file.is_file() else None
    new = dict(run)
    new["verify"] = {
        "exit_code": code,
        "passed": code == 0,
        "reward": reward if reward is not None else 0.0,
        "details": subs,
        "output": out[-2000:],
        "timed_out": timed_out,
    }
    new["collected"] = dict(run.get("collected") or {})
    if details_text is not None:
        new["collected"][DETAILS_FILE] = details_text
    new["meta"] = {**meta, "regraded": {"transcript_events": len(transcript)}}
    return new
