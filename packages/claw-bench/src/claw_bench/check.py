"""Checking tasks locally: run the verifier on the untouched workspace or after the reference solution.

This is how a task author proves a task is sound (`claw-bench check`): the untouched workspace
must fail and the reference solution must pass. Task scripts are untrusted (real ones run
`apt-get` and `curl | sh`), so they run in claw-sandbox, never on the host: the jobs are the ones
`plan` writes for the built-in `nothing` and `oracle` harnesses, run by `claw-sandbox run`.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from claw_bench._sandbox import sandbox_executable
from claw_bench.errors import TaskError
from claw_bench.harnesses import load_harness
from claw_bench.plan import plan_jobs
from claw_bench.tasks import FileContent, Task

MODES = ("untouched", "solution")


def write_files(root: Path, files: dict[str, FileContent]) -> None:
    """Write {relative path: text or bytes} under root, creating directories."""
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content.encode() if isinstance(content, str) else content)


#: how each mode runs: the built-in harness whose job it is
_HARNESS = {"untouched": "nothing", "solution": "oracle"}


def sandbox_command() -> list[str]:
    """The ``claw-sandbox`` command (on PATH, or next to this interpreter); TaskError without it."""
    exe = sandbox_executable()
    if exe is None:
        raise TaskError(
            "claw-bench check runs tasks in claw-sandbox, never on the host: install claw-sandbox "
            "(its `claw-sandbox` command is not on PATH)"
        )
    return [exe]


def check_tasks(
    tasks: list[Task],
    modes: tuple[str, ...] = MODES,
    *,
    backend: str = "auto",
    keep: Path | None = None,
    timeout_s: float | None = None,
) -> list[dict[str, Any]]:
    """Run every task in each of ``modes`` in the sandbox (``claw-sandbox run --backend``), never on
    the host: ``untouched`` is the ``nothing`` harness's job, ``solution`` the ``oracle``'s (the
    same jobs ``plan`` writes, network ``host`` unless a task says ``allow_internet = false``).

    One result dict per (task, mode), in that order: task, mode, passed, reward, scores, the
    verifier's exit code and output tail, and for ``solution`` the solution's exit code. A task
    without a reference solution has no ``solution`` result. ``keep`` keeps jobs.jsonl and
    runs.jsonl there.
    """
    from claw_bench.score import score_run  # score imports plan/harnesses; kept lazy

    for mode in modes:
        if mode not in MODES:
            raise TaskError(f"mode must be one of {MODES}, got {mode!r}")
    wanted = [(t, m) for t in tasks for m in modes if m != "solution" or t.solution is not None]
    jobs = []
    for t, m in wanted:
        (job,) = plan_jobs(
            [t], [load_harness(_HARNESS[m])], samples=1, network="host", run_id="check"
        )
        job["job_id"] = f"check-{m}-{t.id}"
        jobs.append(job)
    runs, stderr = _run_in_sandbox(jobs, backend, keep, timeout_s)
    results = []
    for (t, m), job in zip(wanted, jobs, strict=True):
        run = runs.get(job["job_id"])
        if run is None:
            raise TaskError(f"task {t.id}: claw-sandbox recorded no run for {m}: {stderr}")
        out = score_run(run)
        if out["status"] not in ("ok",):
            raise TaskError(
                f"task {t.id} ({m}): the sandbox run ended {out['status']}: {out.get('error')}"
            )
        results.append(_result(t, m, run, out))
    return results


def _run_in_sandbox(
    jobs: list[dict[str, Any]], backend: str, keep: Path | None, timeout_s: float | None
) -> tuple[dict[str, dict[str, Any]], str]:
    """({job id: run} of `claw-sandbox run --backend` over the jobs, the tail of its stderr);
    ``keep`` keeps jobs.jsonl and runs.jsonl there."""
    with tempfile.TemporaryDirectory(prefix="claw-check-") as tmp:
        root = Path(keep) if keep else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        jobs_path, runs_path = root / "jobs.jsonl", root / "runs.jsonl"
        jobs_path.write_text("".join(json.dumps(j) + "\n" for j in jobs))
        runs_path.unlink(missing_ok=True)
        argv = [
            *sandbox_command(),
            "run",
            str(jobs_path),
            "-o",
            str(runs_path),
            "--backend",
            backend,
        ]
        try:
            p = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout_s, errors="replace"
            )
        except subprocess.TimeoutExpired as exc:
            raise TaskError(f"claw-sandbox run did not finish within {timeout_s}s") from exc
        if not runs_path.is_file():
            raise TaskError(f"claw-sandbox run failed ({p.returncode}): {p.stderr.strip()[-500:]}")
        runs = {r["job_id"]: r for r in map(json.loads, runs_path.read_text().splitlines()) if r}
    return runs, p.stderr.strip()[-500:]


def _result(t: Task, m: str, run: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    """The result dict of one (task, mode) from its run and outcome (see :func:`check_tasks`)."""
    verify = run.get("verify") or {}
    r: dict[str, Any] = {
        "task": t.id,
        "mode": m,
        "passed": bool(out["passed"]),
        "reward": float(out["reward"]),
        "scores": {
            k: v
            for k, v in (verify.get("details") or {}).items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        },
        "verify_exit_code": verify.get("exit_code"),
        "output": (verify.get("output") or "")[-4000:],
        "backend": run.get("backend"),
    }
    if m == "solution":
        r["solution_exit_code"] = run.get("exit_code")
        if run.get("exit_code") != 0:
            r["solution_output"] = (run.get("stdout_tail", "") + run.get("stderr_tail", ""))[-4000:]
    return r


def check_task(
    task: Task, mode: str = "solution", *, backend: str = "auto", keep: Path | None = None
) -> dict[str, Any]:
    """Run ``task`` in the sandbox in ``mode`` (untouched | solution) and verify; a result dict
    (see :func:`check_tasks`)."""
    if mode == "solution" and task.solution is None:
        raise TaskError(f"task {task.id}: has no reference solution (solution.sh / solution.py)")
    return check_tasks([task], (mode,), backend=backend, keep=keep)[0]
