"""Harbor's per-trial job directory, from claw.run/v1 and claw.outcome/v1 records
(``claw-bench trials``).

One folder per trial (rollout) under the job directory, in Harbor's layout::

    <jobs_dir>/<task>__<id7>/
      agent/        what the job left in /logs/agent, and the command's stdout.txt / stderr.txt
                    (the tails the run record keeps)
      verifier/     what the verifier left in /logs/verifier (reward.txt, ...), and
                    test-stdout.txt: the verify step's output
      artifacts/    what the job left in /logs/artifacts (task.toml's artifacts)
      result.json   task_name, trial_name, trial_uri, agent_info, verifier_result.rewards,
                    exception_info, started_at / finished_at (ISO 8601, UTC), and claw's status,
                    passed and session
      run.json      the claw.run/v1 record as scored; outcome.json: the claw.outcome/v1 record

``<id7>`` is the first 7 hex digits of the SHA-256 of the session id, so a trial keeps its folder
when exported again. The outcome gets ``meta.trial_dir`` (the folder's absolute path), which
``claw-bench report --trials`` lists per trial. Files a claw task collects from its workspace go
to ``workspace/``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any

from claw_bench.errors import RecordError

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")
#: where a Harbor job's /logs folders land in the trial folder
_LOGS = {"/logs/agent/": "agent", "/logs/verifier/": "verifier", "/logs/artifacts/": "artifacts"}


def trial_name(outcome: dict[str, Any]) -> str:
    """``<task>__<7 hex digits of the session's SHA-256>``, as Harbor names trials."""
    task = _SAFE.sub("-", str(outcome["task"])).strip("-.")[:100] or "task"
    return f"{task}__{hashlib.sha256(str(outcome['session']).encode()).hexdigest()[:7]}"


def _iso(t: Any) -> str | None:
    if not isinstance(t, int | float):
        return None
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat()


def _exception(run: dict[str, Any], outcome: dict[str, Any]) -> dict[str, Any] | None:
    """Harbor's exception_info: why the trial did not end normally, else None."""
    status = run.get("status")
    if status == "ok" and outcome.get("status") != "infra_error":
        return None
    kind = {"timeout": "AgentTimeoutError", "infra_error": "EnvironmentError"}.get(
        str(status), "TrialError"
    )
    message = run.get("error") or outcome.get("error") or f"run status {status}"
    return {"exception_type": kind, "exception_message": str(message)}


def result_json(run: dict[str, Any], outcome: dict[str, Any], folder: Path) -> dict[str, Any]:
    """A trial's result.json, Harbor's fields first."""
    reward = outcome.get("reward")
    verify = run.get("verify") if isinstance(run.get("verify"), dict) else None
    return {
        "task_name": outcome["task"],
        "trial_name": folder.name,
        "trial_uri": folder.resolve().as_uri(),
        "agent_info": {
            "name": outcome.get("harness"),
            "model": (run.get("meta") or {}).get("model"),
        },
        "verifier_result": {"rewards": {"reward": reward}} if reward is not None else None,
        "exception_info": _exception(run, outcome),
        "started_at": _iso(run.get("started_at")),
        "finished_at": _iso(run.get("ended_at")),
        "duration_s": run.get("duration_s"),
        "status": outcome.get("status"),
        "passed": outcome.get("passed"),
        "session": outcome["session"],
        "job_id": run.get("job_id"),
        "verify_timed_out": bool(verify and verify.get("timed_out")),
    }


def _place(folder: Path, name: str) -> Path | None:
    """Where a collected file goes: /logs/<x>/... to <x>/..., a workspace path to workspace/;
    None for a path that would leave the folder."""
    for prefix, sub in _LOGS.items():
        if name.startswith(prefix):
            rel, base = name[len(prefix) :], folder / sub
            break
    else:
        rel, base = (
            name.lstrip("/"),
            folder / ("workspace" if not name.startswith("/") else "files"),
        )
    parts = PurePosixPath(rel).parts
    if not parts or ".." in parts:
        return None
    return base.joinpath(*parts)


def write_trial(jobs_dir: Path, run: dict[str, Any], outcome: dict[str, Any]) -> Path:
    """Write one trial's folder (see the module docstring) and return it."""
    folder = jobs_dir / trial_name(outcome)
    for sub in ("agent", "verifier", "artifacts"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    for name, text in (run.get("collected") or {}).items():
        dest = _place(folder, name)
        if dest is not None and isinstance(text, str):
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(text, encoding="utf-8")
    (folder / "agent" / "stdout.txt").write_text(run.get("stdout_tail") or "", encoding="utf-8")
    (folder / "agent" / "stderr.txt").write_text(run.get("stderr_tail") or "", encoding="utf-8")
    verify = v if isinstance(v := run.get("verify"), dict) else {}
    (folder / "verifier" / "test-stdout.txt").write_text(
        str(verify.get("output") or ""), encoding="utf-8"
    )
    for name, rec in (("run.json", run), ("outcome.json", outcome)):
        (folder / name).write_text(json.dumps(rec, indent=2) + "\n", encoding="utf-8")
    result = result_json(run, outcome, folder)
    (folder / "result.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return folder


def export_trials(
    outcomes: Iterable[dict[str, Any]], runs: list[dict[str, Any]], jobs_dir: Path
) -> Iterable[dict[str, Any]]:
    """Each outcome, after writing its trial folder under ``jobs_dir``, with ``meta.trial_dir``.
    The run of an outcome is the one with its ``job_id`` (else its session); RecordError names
    an outcome no run matches."""
    by_id = {r.get("job_id"): r for r in runs}
    by_session = {(r.get("meta") or {}).get("session"): r for r in runs}
    jobs_dir.mkdir(parents=True, exist_ok=True)
    for i, o in enumerate(outcomes, start=1):
        run = by_id.get(o.get("job_id")) or by_session.get(o.get("session"))
        if run is None:
            raise RecordError(
                f"outcome {i} (session {o.get('session')!r}): no run with job_id "
                f"{o.get('job_id')!r} or that session in the runs given (--runs)"
            )
        folder = write_trial(jobs_dir, run, o)
        yield {**o, "meta": {**(o.get("meta") or {}), "trial_dir": str(folder.resolve())}}


def trial_rows(outcomes: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per outcome that has a trial folder: task, harness, sample, reward, status, path."""
    return [
        {
            "task": o["task"],
            "harness": o["harness"],
            "sample": o.get("sample"),
            "reward": o.get("reward"),
            "status": o.get("status"),
            "trial_dir": o["meta"]["trial_dir"],
        }
        for o in outcomes
        if isinstance(o.get("meta"), dict) and isinstance(o["meta"].get("trial_dir"), str)
    ]


def render_trials(rows: list[dict[str, Any]]) -> str:
    """The trials as text lines: task, harness, sample, reward (or status), trial folder."""
    if not rows:
        return "trials: none of these outcomes has a trial folder (see claw-bench trials)\n"
    lines = ["trials:"]
    for r in rows:
        reward = f"{r['reward']:.3f}" if isinstance(r["reward"], int | float) else r["status"]
        lines.append(f"  {r['task']}  {r['harness']}  #{r['sample']}  {reward}  {r['trial_dir']}")
    return "\n".join(lines) + "\n"
