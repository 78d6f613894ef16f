"""`claw-sandbox doctor PROGRAM...`: whether each program runs inside a sandbox as a job's
command would find it (apart from :mod:`claw_sandbox._hostpaths`, which the backends import:
this module runs jobs through the scheduler)."""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil

from claw_sandbox.records import JOB_SCHEMA, Job
from claw_sandbox.scheduler import Scheduler

# `claw-sandbox doctor PROGRAM`: the program as a harness job would find it, inside the sandbox
_CHECK = r"""p=$(command -v {name}) || {{ echo "not found on PATH inside the sandbox"; exit 1; }}
f=$(readlink -f "$p")
[ -r "$f" ] && [ -x "$f" ] || {{ echo "$f is not readable and executable inside"; exit 1; }}
IFS= read -r line < "$f" 2>/dev/null
case "$line" in '#!'*)
  set -- ${{line#??}}
  if [ "${{1##*/}}" = env ]; then
    shift; while [ "${{1#-}}" != "$1" ]; do shift; done
    i=$(command -v "$1") || {{ echo "its interpreter $1 ($f) is not on PATH inside"; exit 1; }}
  else i=$1; fi
  [ -x "$(readlink -f "$i")" ] || {{ echo "its interpreter $i ($f) is missing inside"; exit 1; }};;
esac
echo "$p"
"""


def check_programs(backend, names: list[str]) -> list[dict]:
    """For each program name: whether it is on PATH here and runs in a `backend` sandbox, as a
    job's command would find it (found on PATH inside, its real file and its ``#!`` interpreter
    there). One doctor row per name: name, kind "program", works, why."""
    rows: dict[str, str | None] = {}
    jobs: list[Job] = []
    for name in names:
        host = shutil.which(name)
        if host is None:
            rows[name] = f"not on PATH here ({os.environ.get('PATH', '')})"
            continue
        row = {"schema": JOB_SCHEMA, "job_id": f"doctor-{len(jobs)}", "timeout_s": 60.0,
               "command": _CHECK.format(name=shlex.quote(name)), "meta": {"program": name}}  # fmt: skip
        jobs.append(Job.from_dict(row, "doctor"))
    sched = Scheduler(backend, 4, 0, None, lambda msg: None)

    async def run() -> list[dict]:
        return [r async for r in sched.stream(jobs)]

    for run_row in asyncio.run(run()) if jobs else []:
        name = run_row["meta"]["program"]
        host = shutil.which(name) or name
        inside = (run_row["stdout_tail"] or run_row["error"] or "").strip().splitlines()
        if run_row["status"] == "ok" and run_row["exit_code"] == 0:
            rows[name] = None
        else:
            why = inside[-1] if inside else f"status {run_row['status']}"
            rows[name] = (
                f"{host} is on PATH here but does not run in the {backend.name} sandbox: {why} "
                f"(show its installation with --ro-path DIR or CLAW_SANDBOX_RO_PATHS)"
            )
    return [
        {
            "name": name,
            "kind": "program",
            "works": rows[name] is None,
            "why": rows[name] or f"{shutil.which(name)} runs in the {backend.name} sandbox",
        }
        for name in names
    ]
