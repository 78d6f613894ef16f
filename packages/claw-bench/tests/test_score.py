"""Scoring runs into outcomes: infra errors are never zero rewards; rewards and thresholds are honoured."""

from __future__ import annotations

import pytest
from _bench_schemas import validate
from claw_bench import RecordError, score_run, score_runs

META = {"session": "s1", "task": "t", "harness": "h", "sample": 2, "group": "t"}


def _run(status="ok", verify=None, **kw):
    return {
        "schema": "claw.run/v1",
        "job_id": "j",
        "status": status,
        "exit_code": 0,
        "verify": verify,
        "started_at": 1.0,
        "ended_at": 2.0,
        "meta": dict(META),
    } | kw


def test_infra_errors_are_not_zero_rewards():
    """infra_error, error and a missing verify result give status infra_error with reward null."""
    for run in (_run("infra_error", error="bwrap failed"), _run("error"), _run("ok", verify=None)):
        o = score_run(run)
        validate(o, "outcome")
        assert (
            o["status"] == "infra_error"
            and o["reward"] is None
            and o["passed"] is None
            and o["error"]
        )


@pytest.mark.parametrize("code", [126, 127, 1, 139])
def test_a_failed_agent_command_is_a_failed_rollout(code):
    """Any exit code of the agent's command, 126 / 127 included (an agent can exit so, or make its
    shell exit so through ptrace, with "command not found" on stderr), is a failed rollout its
    verifier scores: reward 0.0, never infra_error with reward null. Only the sandbox's own
    `error` (its lookup found no program before the agent ran) is an infra error."""
    run = _run(
        exit_code=code,
        stderr_tail="claw-bench: harness h could not start: x is not installed\nbash: claude: command not found\n",
        verify={"exit_code": 1, "passed": False, "reward": 0.0, "details": {}},
    )
    o = score_run(run)
    validate(o, "outcome")
    assert (o["status"], o["reward"], o["passed"]) == ("ok", 0.0, False), o
    assert o["meta"]["exit_code"] == code
    steps = _run(
        exit_code=code,
        steps=[
            {
                "name": "a",
                "exit_code": code,
                "verify": {"exit_code": 1, "passed": False, "reward": 0.0},
            }
        ],
        verify={"exit_code": 1, "passed": False, "reward": 0.0},
        meta={**META, "multi_step_reward_strategy": "mean"},
    )
    assert (score_run(steps)["status"], score_run(steps)["reward"]) == ("ok", 0.0)
    missing = _run(
        "error",
        exit_code=None,
        error="job 'j': command: 'x' was not found in the job's environment",
    )
    o = score_run(missing)
    assert (
        o["status"] == "infra_error" and o["reward"] is None and "'x' was not found" in o["error"]
    )


def test_reward_sources_in_order():
    """Verifier reward first, then mean of sub-scores, then the collected reward file, then the exit code."""
    assert (
        score_run(
            _run(verify={"exit_code": 1, "passed": False, "reward": 0.25, "details": {"a": 0.25}})
        )["reward"]
        == 0.25
    )
    assert (
        score_run(_run(verify={"exit_code": 1, "passed": False, "details": {"a": 1, "b": 0}}))[
            "reward"
        ]
        == 0.5
    )
    o = score_run(
        _run(
            verify={"exit_code": 0, "passed": True},
            collected={".claw_verify/reward.json": '{"x": 1, "y": 0.5}'},
        )
    )
    assert o["reward"] == 0.75 and o["details"]["x"] == 1.0 and o["passed"] is True
    assert score_run(_run(verify={"exit_code": 0, "passed": True}))["reward"] == 1.0
    assert score_run(_run(verify={"exit_code": 3, "passed": False}))["reward"] == 0.0


def test_timeouts_and_thresholds():
    """A timed-out verifier scores 0; an agent timeout is still scored; thresholds decide passed."""
    o = score_run(
        _run(verify={"exit_code": None, "passed": False, "timed_out": True, "reward": None})
    )
    assert o["status"] == "ok" and o["reward"] == 0.0 and o["passed"] is False
    o = score_run(_run("timeout", verify={"exit_code": 0, "passed": True, "reward": 1.0}))
    assert o["passed"] is True and o["details"]["agent_timed_out"] is True
    run = _run(verify={"exit_code": 1, "passed": False, "reward": 0.6})
    assert score_run(run)["passed"] is False
    assert score_run(run, threshold=0.5)["passed"] is True
    run["meta"]["pass_threshold"] = 0.5
    assert score_run(run)["passed"] is True and score_run(run, threshold=0.7)["passed"] is False


def test_a_verifier_without_reward_never_passes_and_no_file_is_read():
    """Reward null with the sandbox's reason (a killed or timed-out verifier, places not cleared):
    status ok, reward 0, not passed at any threshold, the reason in the details; a reward file
    the sandbox collected (the job's own, planted) is not read in its place."""
    planted = {".claw_verify/reward.json": "1", "/logs/verifier/reward.txt": "1"}
    for verify in (
        {"exit_code": 137, "passed": False, "reward": None, "timed_out": False,
         "details": {"no_reward": "the verifier was killed (exit 137): no reward file is read"}},
        {"exit_code": None, "passed": False, "reward": None, "timed_out": True,
         "details": {"no_reward": "the verifier timed out after 1s: no reward file is read"}},
    ):  # fmt: skip
        run = _run(verify=verify, collected=planted)
        for threshold in (None, 0.0):
            o = score_run(run, threshold=threshold)
            validate(o, "outcome")
            assert o["status"] == "ok" and o["reward"] == 0.0 and o["passed"] is False, o
            assert o["details"]["no_reward"] == verify["details"]["no_reward"]


def test_outcome_fields_and_validation():
    """Outcomes carry session, task, harness, group, sample and job id, and validate against the schema."""
    [o] = score_runs(
        [_run(verify={"exit_code": 0, "passed": True, "reward": 1.0, "output": "PASS x\n"})]
    )
    validate(o, "outcome")
    assert (o["session"], o["task"], o["harness"], o["group"], o["sample"], o["job_id"]) == (
        "s1",
        "t",
        "h",
        "t",
        2,
        "j",
    )
    assert o["details"]["verify_output"] == "PASS x\n"


def test_bad_runs_name_the_record():
    """A run without claw-bench meta, or with an unknown status or a reward outside [0, 1], is named."""
    with pytest.raises(RecordError, match=r"run #1 \(j\): field 'meta.session'"):
        score_runs([_run(meta={})])
    with pytest.raises(RecordError, match="status"):
        score_run(_run("weird"))
    with pytest.raises(
        RecordError, match=r"run: field 'verify.reward' must be a number in \[0, 1\]"
    ):
        score_run(_run(verify={"exit_code": 0, "passed": True, "reward": 7}))
