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


# the job's shell walks up to its Ray worker process (proctitle ray::...) and SIGKILLs it
_KILL_MY_WORKER = (
    "p=$$; while [ \"$p\" -gt 1 ]; do case \"$(tr '\\0' ' ' < /proc/$p/cmdline)\" in "
    "ray::*) kill -9 $p; exit 0;; esac; p=$(cut -d' ' -f4 /proc/$p/stat); done; exit 3"
)


def test_ray_executor_names_the_node_and_leaves_lost_jobs_unrecorded(tmp_path):
    """Each run names the Ray node it ran on; a job whose worker process dies under it is an
    infra_error run, recorded by default, and with record_lost=False returned but not written,
    so the next run over the same file runs it again."""
    pytest.importorskip("ray", reason="ray is not installed (pip install 'claw-sandbox[ray]')")
    import ray
    from claw_sandbox.ray_executor import connected, run_on_ray

    jobs = [job("fine", command="true"), job("lost", command=_KILL_MY_WORKER)]
    with connected():  # one local Ray for the three calls
        node = ray.get_runtime_context().get_node_id()
        kept, dropped = tmp_path / "kept.jsonl", tmp_path / "dropped.jsonl"
        by_id = {r["job_id"]: r for r in run_on_ray(jobs, backend="process", out=kept)}
        assert by_id["fine"]["status"] == "ok" and by_id["fine"]["node"] == node
        assert by_id["lost"]["status"] == "infra_error"
        assert by_id["lost"]["error"].startswith("ray task lost with its node or worker")
        assert sorted(json.loads(x)["job_id"] for x in kept.read_text().splitlines()) == [
            "fine",
            "lost",
        ]
        rows = run_on_ray(jobs, backend="process", out=dropped, record_lost=False)
        assert sorted((r["job_id"], r["status"]) for r in rows) == [
            ("fine", "ok"),
            ("lost", "infra_error"),
        ]
        assert [json.loads(x)["job_id"] for x in dropped.read_text().splitlines()] == ["fine"]
        again = run_on_ray(jobs[:1] + [job("lost", command="true")], backend="process",
                           out=dropped, record_lost=False)  # fmt: skip
        assert [(r["job_id"], r["status"]) for r in again] == [("lost", "ok")]
        assert ray.is_initialized()  # run_on_ray left the connection it found
    assert not ray.is_initialized()
