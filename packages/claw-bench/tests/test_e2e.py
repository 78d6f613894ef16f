"""Plan -> run -> score -> report, end to end through JSONL files.

The "model" is a scripted loopback server that checks each request's session token: the
reference policy answers the first request with one bash tool call running the task's reference
solution (so claw-agent, the real harness command, executes it in the workspace) and then stops;
the do-nothing policy stops at once. Jobs run in the test-only process runner of bench_testlib.py, or
in claw-sandbox's process backend when its CLI is on PATH.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from _bench_schemas import validate
from bench_testlib import ModelServer, run_job
from claw_bench import load_suite, read_records, write_records
from claw_bench.cli import main
from click.testing import CliRunner

TASKS = ["csv-to-json-people", "fix-fizzbuzz", "dotenv-update"]
SUITE = load_suite("claw-mini")


def _solution_command(task_id: str) -> str:
    sol = SUITE.get(task_id).solution
    runner = "python3 -" if sol.interpreter == "python3" else "bash -s"
    return f"{runner} <<'CLAW_SOLUTION_EOF'\n{sol.text}CLAW_SOLUTION_EOF\n"


def reference_policy(tags, turn, body):
    if turn == 0:
        return {
            "text": "running the fix",
            "tool_calls": [("bash", {"command": _solution_command(tags["task"])})],
        }
    return {"text": "done"}


def do_nothing_policy(tags, turn, body):
    return {"text": "I did nothing."}


def _cli(args):
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def _pipeline(tmp_path, secret_file, policy, harnesses, runner):
    jobs_path, runs_path, outs_path = (
        tmp_path / "jobs.jsonl",
        tmp_path / "runs.jsonl",
        tmp_path / "outcomes.jsonl",
    )
    with ModelServer(policy) as srv:
        args = [
            "plan",
            "--suite",
            "claw-mini",
            "-n",
            "1",
            "--proxy",
            srv.url,
            "--proxy-secret-file",
            str(secret_file),
            "--run-id",
            "e2e",
            "-o",
            str(jobs_path),
        ]
        for h in harnesses:
            args += ["--harness", h]
        for t in TASKS:
            args += ["--task", t]
        _cli(args)
        jobs = read_records(jobs_path, "claw.job/v1")
        runner(jobs_path, runs_path, jobs, tmp_path)
    for r in read_records(runs_path, "claw.run/v1"):
        validate(r, "run")
    _cli(["score", str(runs_path), "-o", str(outs_path)])
    outcomes = read_records(outs_path, "claw.outcome/v1")
    for o in outcomes:
        validate(o, "outcome")
    return jobs, outcomes, srv


def _test_runner(jobs_path, runs_path, jobs, tmp_path):
    write_records(runs_path, [run_job(j, tmp_path / "sandbox") for j in jobs])


def _sandbox_runner(jobs_path, runs_path, jobs, tmp_path):
    subprocess.run(
        ["claw-sandbox", "run", str(jobs_path), "-o", str(runs_path), "--backend", "process"],
        check=True,
        timeout=600,
    )


def _check(jobs, outcomes, srv, want_pass):
    assert len(outcomes) == len(jobs) == len(TASKS) * len({j["meta"]["harness"] for j in jobs})
    assert all(o["status"] == "ok" for o in outcomes), outcomes
    assert [o["passed"] for o in outcomes] == [want_pass] * len(outcomes), outcomes
    assert all(
        o["reward"] == (1.0 if want_pass else o["reward"]) and (want_pass or o["reward"] < 1.0)
        for o in outcomes
    )
    # every job talked to the model under its own session, with {task, harness, sample} tags
    sessions = {r["session"]: r["tags"] for r in srv.requests}
    assert sessions == {
        j["meta"]["session"]: {
            "task": j["meta"]["task"],
            "harness": j["meta"]["harness"],
            "sample": str(j["meta"]["sample"]),
        }
        for j in jobs
    }


@pytest.mark.parametrize(
    ("policy", "want"),
    [(reference_policy, True), (do_nothing_policy, False)],
    ids=["reference-passes", "do-nothing-fails"],
)
def test_plan_run_score_chat(tmp_path, secret_file, policy, want):
    """Through claw-agent over OpenAI chat: the reference agent passes every task, doing nothing fails all."""
    jobs, outcomes, srv = _pipeline(
        tmp_path, secret_file, policy, ["claw-agent-chat"], _test_runner
    )
    _check(jobs, outcomes, srv, want)
    rep = json.loads(_cli(["report", str(tmp_path / "outcomes.jsonl"), "--json"]).output)
    assert rep["harnesses"][0]["pass@1"]["value"] == (1.0 if want else 0.0)


@pytest.mark.slow
def test_plan_run_score_two_harness_kinds(tmp_path, secret_file):
    """Mix-harness: chat and Anthropic claw-agent in one plan; the reference passes through both."""
    jobs, outcomes, srv = _pipeline(
        tmp_path,
        secret_file,
        reference_policy,
        ["claw-agent-chat", "claw-agent-anthropic"],
        _test_runner,
    )
    _check(jobs, outcomes, srv, True)
    assert {r["path"] for r in srv.requests} == {"/v1/chat/completions", "/v1/messages"}


@pytest.mark.slow
@pytest.mark.other_clis
@pytest.mark.skipif(shutil.which("claw-sandbox") is None, reason="claw-sandbox CLI not on PATH")
def test_plan_run_score_through_claw_sandbox(tmp_path, secret_file):
    """The same pipeline through the real claw-sandbox CLI (process backend), when installed."""
    jobs, outcomes, srv = _pipeline(
        tmp_path, secret_file, reference_policy, ["claw-agent-chat"], _sandbox_runner
    )
    _check(jobs, outcomes, srv, True)
