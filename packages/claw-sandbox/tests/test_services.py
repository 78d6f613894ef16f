"""claw.job/v1 `services` (sidecar containers): checked fields, a round trip, and the backends
that cannot start them refuse the job with the reason (the docker side is in test_docker.py)."""

import pytest
from claw_sandbox import run_jobs
from claw_sandbox.errors import JobError
from claw_sandbox.records import Job
from sandbox_testlib import job

WEB = {
    "name": "web",
    "image": "srv:1",
    "env": {"PORT": "8080"},
    "command": ["serve", "--port", "8080"],
    "healthcheck": {"command": "test -e /tmp/ready", "interval_s": 0.5, "retries": 3},
}


def test_services_round_trip():
    """A job's services come back from to_dict as given (healthcheck defaults filled in)."""
    j = Job.from_dict(job("s", services=[WEB, {"name": "db", "image": "db:2"}]))
    assert [s.name for s in j.services] == ["web", "db"]
    out = j.to_dict()["services"]
    assert out[1] == {"name": "db", "image": "db:2"}
    assert out[0]["healthcheck"] == {
        "command": "test -e /tmp/ready", "interval_s": 0.5, "timeout_s": 30.0, "retries": 3,
        "start_period_s": 0.0,
    }  # fmt: skip
    assert Job.from_dict(j.to_dict()) == j


@pytest.mark.parametrize(
    ("services", "msg"),
    [
        ({"name": "web"}, "services: expected a list"),
        ([{"name": "Web!", "image": "x"}], "services/0/name"),
        ([{"name": "web"}], "services/0/image"),
        ([{"name": "web", "image": "x", "env": {"A": 1}}], "services/0/env/A"),
        ([{"name": "web", "image": "x", "healthcheck": {}}], "services/0/healthcheck/command"),
        ([{**WEB, "healthcheck": {"command": "true", "retries": 0}}], "healthcheck/retries"),
        ([WEB, {**WEB}], "service names repeat"),
    ],
)
def test_bad_services_are_named(services, msg):
    """A malformed service is a JobError naming the field."""
    with pytest.raises(JobError, match=msg):
        Job.from_dict(job("s", services=services))


def test_backends_without_containers_refuse_services(process):
    """The process backend (and bwrap, same check) cannot start sidecars: the job errors with the
    services named and where to run it, and its command never runs."""
    (run,) = run_jobs([job("s", command="echo ran", services=[WEB])], backend=process)
    assert run["status"] == "error" and run["stdout_tail"] == "", run
    assert "the process backend cannot start sidecar containers (web)" in run["error"]
    assert "docker backend" in run["error"]
