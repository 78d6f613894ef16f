"""Jobs with `steps`: run in order in one sandbox, each with its files, mounts, setup, command and
verify; `min_reward` ends the steps early; the run records every step that ran."""

import pytest
from claw_sandbox import run_jobs
from claw_sandbox.errors import JobError
from claw_sandbox.records import Job
from sandbox_testlib import job

# the step's own verifier: reward 1 when /app/state holds the expected lines; /tests is there
TEST = (
    "cd / || exit 1\n"
    '[ "$(cat /app/state)" = "$(cat /tests/expected)" ] && echo 1 > /logs/verifier/reward.txt '
    "|| echo 0 > /logs/verifier/reward.txt\n"
)
# the agent of every step: appends what its /solution says, notes whether /tests exists
AGENT = (
    "cat /solution/line >> /app/state; "
    "if [ -e /tests ]; then echo present; else echo absent; fi >> /logs/agent/tests_seen"
)


def step(name: str, line: str, expected: str, **fields) -> dict:
    return {
        "name": name, "command": AGENT, "timeout_s": 30,
        "mounts": [{"target": "/solution", "files": {"line": line}}],
        "verify": {"command": "sh /tests/test.sh", "reward_file": "/logs/verifier/reward.txt",
                   "mounts": [{"target": "/tests", "files": {"test.sh": TEST,
                                                              "expected": expected}}]},
        **fields,
    }  # fmt: skip


def steps_job(job_id: str, *, second_line: str = "two\n", **fields) -> dict:
    """Three steps; the second gets a file in the workdir and a setup that checks it, and is gated
    at reward 1 (so a wrong second line stops the third)."""
    return job(
        job_id, profile="harbor", workdir="/app", command="true",
        mounts=[{"target": "/solution"}, {"target": "/logs/agent"}, {"target": "/logs/verifier"}],
        steps=[step("first", "one\n", "one"),
               step("second", second_line, "one\ntwo", files={"given.txt": "given\n"},
                    setup=["test -f /app/given.txt && ! test -e /tests"], min_reward=1.0),
               step("third", "three\n", "one\ntwo\nthree")],
        collect=["/logs/agent/**", "state"], **fields,
    )  # fmt: skip


def check_steps_run(run: dict) -> None:
    assert run["status"] == "ok", run
    assert [s["name"] for s in run["steps"]] == ["first", "second", "third"]
    assert [s["verify"]["reward"] for s in run["steps"]] == [1.0, 1.0, 1.0]
    assert run["steps"][1]["min_reward"] == {"threshold": 1.0, "met": True}
    assert run["verify"]["reward"] == 1.0  # the last step's, for readers without `steps`
    c = run["collected"]
    assert c["state"] == "one\ntwo\nthree\n"  # one environment: each step sees the last one's work
    assert c["/logs/agent/tests_seen"] == "absent\n" * 3  # /tests only ever at verify time


def check_gated_run(run: dict) -> None:
    assert run["status"] == "ok", run
    assert [s["name"] for s in run["steps"]] == ["first", "second"]  # third never ran
    assert run["steps"][1]["verify"]["reward"] == 0.0
    assert run["steps"][1]["min_reward"] == {"threshold": 1.0, "met": False}


def test_steps_on_bwrap(bwrap):
    """On bwrap: the steps share the workdir, /solution is refilled per step, /tests exists for
    each verify only, and a reward under min_reward ends the steps."""
    runs = {r["job_id"]: r for r in run_jobs(
        [steps_job("s3"), steps_job("gated", second_line="wrong\n")], backend=bwrap)}  # fmt: skip
    check_steps_run(runs["s3"])
    check_gated_run(runs["gated"])


def test_steps_without_verify_then_the_jobs_verify(process):
    """Steps without a verify of their own (successive sessions) run in order; the job's verify
    grades the end state; a failing step setup ends the job as an error naming the step."""
    j = job("sess", steps=[{"name": "a", "command": "echo a >> log"},
                           {"name": "b", "command": "echo b >> log; exit 3"}],
            verify={"command": "grep -qx b log && grep -qx a log"})  # fmt: skip
    bad = job("bad", steps=[{"name": "a", "command": "true", "setup": ["echo no >&2; exit 4"]},
                            {"name": "b", "command": "echo never > log"}])  # fmt: skip
    runs = {r["job_id"]: r for r in run_jobs([j, bad], backend=process)}
    assert runs["sess"]["status"] == "ok" and runs["sess"]["exit_code"] == 3
    assert runs["sess"]["verify"]["passed"] is True
    assert [(s["name"], s["exit_code"], s["verify"]) for s in runs["sess"]["steps"]] == [
        ("a", 0, None),
        ("b", 3, None),
    ]
    assert (
        runs["bad"]["status"] == "error"
        and "step 'a': setup 1 exited with 4: no" in (runs["bad"]["error"])
    )
    assert [s["name"] for s in runs["bad"]["steps"]] == ["a"]


def test_steps_fields_are_checked():
    """Step names are unique, a step mount names a job mount, min_reward is a number or an
    object of numbers; a job with steps round-trips through to_dict."""
    base = steps_job("x")
    assert Job.from_dict(Job.from_dict(base).to_dict()) == Job.from_dict(base)
    dup = {**base, "steps": [base["steps"][0], base["steps"][0]]}
    with pytest.raises(JobError, match="step names repeat"):
        Job.from_dict(dup)
    stray = {**base, "steps": [{**base["steps"][0], "mounts": [{"target": "/elsewhere"}]}]}
    with pytest.raises(JobError, match="steps/0/mounts/0/target"):
        Job.from_dict(stray)
    for bad in ("high", True, {"reward": "x"}):
        with pytest.raises(JobError, match="steps/0/min_reward"):
            Job.from_dict({**base, "steps": [{**base["steps"][0], "min_reward": bad}]})
    with pytest.raises(JobError, match="steps/0/verify/command"):
        Job.from_dict({**base, "steps": [{**base["steps"][0], "verify": {}}]})
    assert Job.from_dict(base).verify_only_targets() == {"/tests"}


def test_min_reward_gates_like_harbor():
    """A number gates the `reward` key; an object gates each key; a missing key is -inf."""
    from claw_sandbox.executor import gate_met

    assert gate_met(0.5, {"reward": 0.5}) and not gate_met(0.5, {"reward": 0.4})
    assert not gate_met(0.5, {"correct": 1.0})  # no `reward` key
    assert gate_met({"a": 1.0, "b": 0.5}, {"a": 1.0, "b": 0.7, "c": 0.0})
    assert not gate_met({"a": 1.0, "z": 0.0}, {"a": 1.0})
