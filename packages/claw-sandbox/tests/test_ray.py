"""`--executor ray` runs the same jobs as Ray tasks on a local Ray instance."""

import json

import pytest
from sandbox_testlib import job

pytestmark = pytest.mark.slow


def test_ray_executor_runs_jobs_and_resumes(tmp_path):
    """Jobs run as Ray tasks with the node's backend; a rerun skips what the file records."""
    pytest.importorskip("ray", reason="ray is not installed (pip install 'claw-sandbox[ray]')")
    from claw_sandbox.ray_executor import run_on_ray

    out = tmp_path / "runs.jsonl"
    jobs = [
        job("r1", command="echo one", verify={"command": "true"}),
        job("r2", command="echo two > f.txt", collect=["f.txt"]),
        {"schema": "claw.job/v1", "job_id": "bad"},
    ]
    rows = run_on_ray(jobs, backend="process", out=out, parallel=2)
    by_id = {r["job_id"]: r for r in rows}
    assert by_id["r1"]["stdout_tail"] == "one\n" and by_id["r1"]["verify"]["passed"]
    assert by_id["r2"]["collected"] == {"f.txt": "two\n"} and by_id["r2"]["backend"] == "process"
    assert by_id["bad"]["status"] == "error"
    again = run_on_ray([*jobs, job("r3", command="true")], backend="process", out=out)
    assert [r["job_id"] for r in again] == ["r3"]
    ids = sorted(json.loads(line)["job_id"] for line in out.read_text().splitlines())
    assert ids == ["bad", "r1", "r2", "r3"]
