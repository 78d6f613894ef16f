"""Planning: one claw.job/v1 per (task, harness, sample), pointed at the proxy with a session token."""

from __future__ import annotations

import hashlib
import re
import secrets
import sys
from typing import Any
from urllib.parse import urlsplit

from claw_bench.errors import PlanError
from claw_bench.harnesses import Harness
from claw_bench.records import JOB
from claw_bench.tasks import Task
from claw_bench.token import mint_token

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
GROUP_BY = ("task", "task-harness")


def proxy_port(proxy_url: str) -> int:
    """The port of the proxy URL (explicit, or 80/443 from the scheme); PlanError when malformed."""
    parts = urlsplit(proxy_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PlanError(f"--proxy {proxy_url!r}: expected an http(s) URL such as http://127.0.0.1:8000")
    try:
        port = parts.port
    except ValueError as exc:
        raise PlanError(f"--proxy {proxy_url!r}: bad port") from exc
    return port or (443 if parts.scheme == "https" else 80)


def session_id(run_id: str, task: str, harness: str, sample: int) -> str:
    """A readable session id, ``<run>-<task>-<harness>-<sample>``, kept within 128 safe chars."""
    raw = _UNSAFE.sub("_", f"{run_id}-{task}-{harness}-{sample}")
    if len(raw) <= 128:
        return raw
    digest = hashlib.sha256(raw.encode()).hexdigest()[:16]
    return f"{raw[:111]}-{digest}"


def plan_jobs(
    tasks: list[Task], harnesses: list[Harness], *, samples: int, proxy_url: str, secret: bytes,
    run_id: str | None = None, model: str | None = None, install: bool = False,
    group_by: str = "task", python: str | None = None, limits: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """claw.job/v1 dicts, one per (task, harness, sample), in task-major order.

    Each job's env points the harness at the proxy through the sandbox's loopback port (the
    proxy URL's port) with a session token minted from ``secret`` and tagged {task, harness};
    the verifier and hidden files travel in ``verify.files``. ``install`` runs the harness's
    install commands as job setup. ``group_by`` picks the group key: the task (GRPO over all
    harnesses) or task+harness.
    """
    if samples < 1:
        raise PlanError(f"-n must be at least 1, got {samples}")
    if not tasks:
        raise PlanError("no tasks selected")
    if not harnesses:
        raise PlanError("no harness given (use --harness NAME)")
    if group_by not in GROUP_BY:
        raise PlanError(f"--group-by must be one of {GROUP_BY}, got {group_by!r}")
    port = proxy_port(proxy_url)
    run_id = _UNSAFE.sub("_", run_id) if run_id else secrets.token_hex(4)
    python = python or sys.executable
    jobs = []
    for task in tasks:
        for h in harnesses:
            for k in range(samples):
                session = session_id(run_id, task.id, h.name, k)
                tags = {"task": task.id, "harness": h.name}
                token = mint_token(session, secret, tags)
                values = {"base_url": f"http://127.0.0.1:{port}", "port": str(port), "token": token,
                          "model": model or h.model, "instruction": task.instruction,
                          "instruction_file": ".claw_harness/instruction.md", "python": python,
                          "session": session, "task": task.id, "harness": h.name}
                command, env, harness_files = h.render(values)
                files = dict(task.workspace)
                clash = set(files) & set(harness_files)
                if clash:
                    raise PlanError(f"task {task.id}: workspace files {sorted(clash)} clash with harness {h.name}'s files")
                files.update(harness_files)
                setup = [*(h.install if install else ()), *([f"{task.setup.command(f'.claw_setup/{task.setup.name}')} && rm -rf .claw_setup"] if task.setup else [])]
                if task.setup:
                    files[f".claw_setup/{task.setup.name}"] = task.setup.text
                group = task.id if group_by == "task" else f"{task.id}:{h.name}"
                meta = {"session": session, "task": task.id, "harness": h.name, "sample": k, "group": group,
                        "run_id": run_id, "api": h.api}
                if task.pass_threshold is not None:
                    meta["pass_threshold"] = task.pass_threshold
                if isinstance(task.meta.get("judge"), dict):
                    meta["judge"] = task.meta["judge"]  # the rubric, for claw-bench score's judge step
                job: dict[str, Any] = {
                    "schema": JOB, "job_id": session, "workspace": {"files": files}, "setup": setup,
                    "command": command, "env": env, "timeout_s": task.timeout_s,
                    "network": {"policy": "proxy", "proxy_url": proxy_url.rstrip("/"), "port": port},
                    "verify": {"command": task.verify_command(), "timeout_s": task.verify_timeout_s,
                               "files": task.verify_files(), "reward_file": task.reward_file},
                    "collect": [task.reward_file, *task.meta.get("collect", [])], "meta": meta,
                }
                if task.image:
                    job["image"] = task.image
                task_limits = task.meta.get("limits") if isinstance(task.meta.get("limits"), dict) else {}
                if limits or task_limits:
                    job["limits"] = {**task_limits, **(limits or {})}  # plan's flags override the task's
                jobs.append(job)
    return jobs
