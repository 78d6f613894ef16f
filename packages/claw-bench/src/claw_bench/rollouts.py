"""Rollouts: plan claw.job/v1 records, run them through a caller's runner, score the runs.

claw-bench never imports claw-sandbox: the jobs cross over as plain dicts. ``run`` is any
callable from a list of claw.job/v1 dicts to their claw.run/v1 dicts: in Python,
``functools.partial(claw_sandbox.run_jobs, backend="bwrap", out="runs.jsonl")`` (local, or
``claw_sandbox.run_on_ray``); with no Python import at all, :func:`sandbox_cli`, which drives
``claw-sandbox run`` over JSONL.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs

from claw_bench._sandbox import sandbox_executable
from claw_bench.errors import ClawError, RecordError
from claw_bench.harnesses import Harness
from claw_bench.loaders.judge import Judge
from claw_bench.plan import plan_jobs
from claw_bench.records import JOB, RUN, dumps, read_records
from claw_bench.score import score_runs
from claw_bench.tasks import Task

#: what runs jobs: claw.job/v1 dicts in, their claw.run/v1 dicts out (any order)
Runner = Callable[[list[dict[str, Any]]], Iterable[dict[str, Any]]]


def _key(record: dict[str, Any]) -> tuple[str, str, int]:
    """(task, harness, sample) of a job, run or outcome (its meta, or its own fields)."""
    meta = record.get("meta") if record.get("schema") in (JOB, RUN) else record
    meta = meta if isinstance(meta, dict) else {}
    sample = meta.get("sample")
    return (
        str(meta.get("task", "")),
        str(meta.get("harness", "")),
        sample if isinstance(sample, int) else -1,
    )


@attrs.frozen(kw_only=True)
class Rollouts:
    """One batch of rollouts: the jobs planned and run now, every run (``done`` ones first,
    then the new ones as the runner returned them), and one claw.outcome/v1 per run, sorted by
    (task, harness, sample) so concurrency does not decide their order."""

    jobs: list[dict[str, Any]]
    runs: list[dict[str, Any]]
    outcomes: list[dict[str, Any]]

    def summary(self) -> dict[str, Any]:
        """:func:`outcome_summary` of the outcomes."""
        return outcome_summary(self.outcomes)


def rollouts(
    tasks: list[Task],
    harnesses: list[Harness],
    run: Runner,
    *,
    samples: int,
    done: Iterable[dict[str, Any]] = (),
    threshold: float | None = None,
    judge: Judge | None = None,
    **plan: Any,
) -> Rollouts:
    """Plan, run and score ``samples`` rollouts of every (task, harness).

    The jobs are :func:`claw_bench.plan_jobs` (``plan``: its keyword arguments: ``proxy_url``,
    ``secret``, ``run_id``, ``group_by``, ``network``, ...). ``done`` holds claw.run/v1 dicts of
    rollouts already finished (a resumed step's runs file): their (task, harness, sample) is not
    planned again, and they are scored with the new runs. ``run`` gets only the jobs left, and is
    not called when none is; a run it returns for a job it was not given is an error (a runs
    file shared by two batches), and so is a job it returns no run for. ``threshold`` and
    ``judge`` are :func:`claw_bench.score_runs`'s.

    Example::

        import functools, claw_bench, claw_sandbox
        batch = claw_bench.rollouts(
            claw_bench.load_suite("claw-mini").tasks,
            [claw_bench.load_harness("oracle")],
            functools.partial(claw_sandbox.run_jobs, backend="bwrap"),
            samples=2,
        )
        print(batch.summary())
    """
    before = list(done)
    finished = {_key(r) for r in before}
    jobs = [
        j for j in plan_jobs(tasks, harnesses, samples=samples, **plan) if _key(j) not in finished
    ]
    new = list(run(jobs)) if jobs else []
    _check_runs(jobs, new)
    runs = before + new
    outcomes = sorted(score_runs(runs, threshold=threshold, judge=judge), key=_key)
    return Rollouts(jobs=jobs, runs=runs, outcomes=outcomes)


def _check_runs(jobs: list[dict[str, Any]], runs: list[dict[str, Any]]) -> None:
    """Every job has exactly one run, and every run is of one of the jobs."""
    want = {j["job_id"] for j in jobs}
    got: dict[str, int] = defaultdict(int)
    for r in runs:
        got[str(r.get("job_id") if isinstance(r, dict) else None)] += 1
    extra = sorted(set(got) - want)
    if extra:
        raise RecordError(f"the runner returned runs of jobs it was not given: {extra[:3]}")
    missing = sorted(want - set(got))
    if missing:
        raise RecordError(f"the runner returned no run for {len(missing)} jobs: {missing[:3]}")
    twice = sorted(k for k, n in got.items() if n > 1)
    if twice:
        raise RecordError(f"the runner returned more than one run for jobs {twice[:3]}")


def sandbox_cli(
    *,
    backend: str = "auto",
    parallel: int = 4,
    executor: str = "local",
    output: str | Path | None = None,
    args: Iterable[str] = (),
    program: str = "claw-sandbox",
) -> Runner:
    """A runner that pipes the jobs into ``claw-sandbox run`` (on PATH, or next to this
    interpreter) and reads back
    their runs. ``executor``: ``local`` or ``ray`` (``claw-sandbox run --executor``). ``output``
    keeps the runs file (appended to and resumed from, as ``claw-sandbox run -o``); without it
    a temporary one is used. ``args``: more ``claw-sandbox run`` options (``--ro-path DIR``, ...).
    The child's stderr (progress, warnings) goes to ours; a failed run of the command raises
    ClawError with its exit code.
    """
    extra = list(args)

    def run(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        exe = sandbox_executable(program)
        if exe is None:
            raise ClawError(
                f"{program} is not on PATH (nor next to {sys.executable}): install claw-sandbox, "
                "or pass a runner of your own"
            )
        with tempfile.TemporaryDirectory(prefix="claw-bench-rollouts-") as tmp:
            out = Path(output) if output is not None else Path(tmp) / "runs.jsonl"
            cmd = [exe, "run", "-", "-o", os.fspath(out), "--backend", backend]
            cmd += ["--parallel", str(parallel), "--executor", executor, *extra]
            lines = "".join(dumps(j) + "\n" for j in jobs)
            proc = subprocess.run(cmd, input=lines, text=True, check=False)
            if proc.returncode != 0:
                raise ClawError(f"{' '.join(cmd[1:])} exited with {proc.returncode}")
            ids = {j["job_id"] for j in jobs}
            return [r for r in read_records(out, RUN) if r.get("job_id") in ids]

    return run


def outcome_summary(outcomes: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Counts and per-harness means of claw.outcome/v1 dicts, the way claw-bench's report keeps
    them apart: ``infra_errors`` (the run failed) and ``not_scorable`` (nothing could judge it,
    e.g. an oracle without a solution or a rubric without a judge) are separate counts, and
    neither is a failure: ``reward`` and ``pass@1`` per harness are over its scored outcomes
    only (None when it has none)."""
    rows = list(outcomes)
    scored: dict[str, list[dict[str, Any]]] = defaultdict(list)
    harnesses = sorted({str(o.get("harness")) for o in rows})
    for o in rows:
        if o.get("status") == "ok":
            scored[str(o.get("harness"))].append(o)

    def mean(values: list[float]) -> float | None:
        return sum(values) / len(values) if values else None

    return {
        "rollouts": len(rows),
        "scored": sum(len(v) for v in scored.values()),
        "passed": sum(o.get("passed") is True for o in rows),
        "infra_errors": sum(o.get("status") == "infra_error" for o in rows),
        "not_scorable": sum(o.get("status") == "not_scorable" for o in rows),
        "reward": {h: mean([float(o["reward"]) for o in scored[h]]) for h in harnesses},
        "pass@1": {h: mean([float(o["passed"] is True) for o in scored[h]]) for h in harnesses},
    }
