"""The execution profile is chosen once per task, and a profile derives a new job from the plain
one (typed, frozen) instead of editing a job dict in place."""

from __future__ import annotations

from pathlib import Path

import attrs
import claw_bench.plan
import pytest
from claw_bench import load_harness, load_suite, plan_jobs
from claw_bench._job import JobSpec
from claw_bench._profiles import ClawProfile, HarborProfile, profile_for

HARBOR = Path(__file__).parent / "fixtures" / "public" / "harbor"


def _spec(**kw):
    base = {
        "job_id": "j",
        "workspace": {"a.txt": "x"},
        "setup": [],
        "command": "true",
        "env": {"CLAW_SOLUTION_DIR": ".claw_solution", "K": "v"},
        "timeout_s": 60.0,
        "network": {"policy": "none"},
        "collect": ["/elsewhere/x", "out.txt"],
        "meta": {"session": "j", "task": "t", "harness": "oracle"},
    }
    return JobSpec(**(base | kw))


def test_a_profile_per_task_kind():
    """A Harbor task gets Harbor's profile (with its harbor meta), any other task claw's."""
    harbor = load_suite(HARBOR).tasks[0]
    assert profile_for(harbor) == HarborProfile(harbor.meta["harbor"])
    assert isinstance(profile_for(load_suite("claw-mini").tasks[0]), ClawProfile)


def test_the_profile_is_chosen_once_per_task(monkeypatch):
    """2 tasks x 2 harnesses x 3 samples: the profile is looked up twice, not twelve times."""
    calls = []

    def counting(task):
        calls.append(task.id)
        return profile_for(task)

    monkeypatch.setattr(claw_bench.plan, "profile_for", counting)
    tasks = list(load_suite("claw-mini").tasks[:2])
    jobs = plan_jobs(tasks, [load_harness("oracle"), load_harness("nothing")], samples=3)
    assert len(jobs) == 12 and calls == [t.id for t in tasks]


def test_harbor_profile_derives_a_new_job_and_leaves_the_plain_one():
    """Harbor's profile on an oracle job: the solution moves to a /solution mount, the env loses
    CLAW_SOLUTION_DIR, collect keeps only paths in the job's places; the spec it was given (and
    the dicts in it) are as they were."""
    task = load_suite(HARBOR).tasks[0]
    assert task.solution is not None
    plain = _spec(verify={"command": "x"})
    before = attrs.asdict(plain)
    job = profile_for(task).job(plain, task, load_harness("oracle"), None).to_dict()
    assert attrs.asdict(plain) == before
    assert job["profile"] == "harbor" and job["workdir"] == task.meta["harbor"]["workdir"]
    assert job["env"] == {"K": "v"}
    sol = job["mounts"][-1]
    assert sol["target"] == "/solution" and sol["files"] and "/solution/" in job["command"]
    assert job["collect"][:1] == ["out.txt"] and "/elsewhere/x" not in job["collect"]
    assert job["verify"]["reset"] == ["/logs/verifier"]


def test_job_spec_writes_fields_in_record_order_and_leaves_out_none():
    """to_dict: the required fields first in claw.job/v1's order, optional ones only when set."""
    d = _spec(limits={"pids": 5}, image="img").to_dict()
    assert list(d) == [
        "schema",
        "job_id",
        "workspace",
        "setup",
        "command",
        "env",
        "timeout_s",
        "network",
        "collect",
        "meta",
        "image",
        "limits",
    ]
    assert d["schema"] == "claw.job/v1" and d["workspace"] == {"files": {"a.txt": "x"}}
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        _spec().command = "rm -rf /"  # type: ignore[misc]
