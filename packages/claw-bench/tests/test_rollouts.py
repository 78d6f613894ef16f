"""rollouts: plan -> the caller's runner -> score, in one call; the claw-sandbox CLI as a runner;
a summary that keeps not_scorable apart from infra errors."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
from _bench_schemas import validate
from bench_testlib import run_job
from claw_bench import (
    ClawError,
    RecordError,
    Rollouts,
    load_harness,
    load_suite,
    outcome_summary,
    read_records,
    rollouts,
    sandbox_cli,
)
from claw_bench._sandbox import sandbox_executable
from claw_bench.cli import main
from click.testing import CliRunner

TASKS = ["csv-to-json-people", "fix-fizzbuzz"]


def _tasks():
    return list(load_suite("claw-mini").select(TASKS).tasks)


def _harnesses():
    return [load_harness("oracle"), load_harness("nothing")]


def _runner(root: Path, seen: list[list[str]]):
    def run(jobs):
        seen.append([j["job_id"] for j in jobs])
        return [run_job(j, root) for j in reversed(jobs)]  # finishing order is not plan order

    return run


def test_plan_run_score_in_one_call(tmp_path):
    """2 tasks x (oracle, nothing) x 2 samples: every job runs once, the oracle passes, doing
    nothing fails, and the outcomes come back in (task, harness, sample) order."""
    seen: list[list[str]] = []
    batch = rollouts(
        _tasks(), _harnesses(), _runner(tmp_path, seen), samples=2, run_id="r", network="none"
    )
    assert isinstance(batch, Rollouts)
    assert len(seen) == 1 and len(seen[0]) == 8 == len(batch.jobs) == len(batch.runs)
    for o in batch.outcomes:
        validate(o, "outcome")
    keys = [(o["task"], o["harness"], o["sample"]) for o in batch.outcomes]
    assert keys == sorted(keys) and len(set(keys)) == 8
    assert {o["harness"]: o["passed"] for o in batch.outcomes} == {"oracle": True, "nothing": False}
    s = batch.summary()
    assert (s["rollouts"], s["scored"], s["passed"], s["infra_errors"], s["not_scorable"]) == (
        8,
        8,
        4,
        0,
        0,
    )
    assert s["pass@1"] == {"nothing": 0.0, "oracle": 1.0}


def test_done_runs_are_not_planned_again_and_are_scored(tmp_path):
    """A resumed batch: the runs already finished are not rerun (the runner gets only the rest,
    under the new run id) and are scored with the new ones."""
    seen: list[list[str]] = []
    first = rollouts(
        _tasks()[:1], _harnesses()[:1], _runner(tmp_path / "a", seen), samples=1, run_id="a0"
    )
    batch = rollouts(
        _tasks()[:1],
        _harnesses()[:1],
        _runner(tmp_path / "b", seen),
        samples=3,
        run_id="a1",
        done=first.runs,
    )
    assert seen[1] == [f"a1-{TASKS[0]}-oracle-1", f"a1-{TASKS[0]}-oracle-2"]
    assert [o["session"] for o in batch.outcomes] == [
        f"a0-{TASKS[0]}-oracle-0",
        f"a1-{TASKS[0]}-oracle-1",
        f"a1-{TASKS[0]}-oracle-2",
    ]
    called: list[list[str]] = []
    again = rollouts(
        _tasks()[:1], _harnesses()[:1], _runner(tmp_path / "c", called), samples=3, done=batch.runs
    )
    assert called == [] and again.jobs == [] and len(again.outcomes) == 3


@pytest.mark.parametrize(
    ("mangle", "match"),
    [
        (lambda runs: runs[:-1], "no run for 1 jobs"),
        (lambda runs: [*runs, {**runs[0], "job_id": "other"}], "not given"),
        (lambda runs: [*runs, runs[0]], "more than one run"),
    ],
    ids=["missing", "foreign", "twice"],
)
def test_a_runner_that_loses_or_adds_runs_is_an_error(tmp_path, mangle, match):
    """Runs are never silently dropped or mixed in: a job without a run, a run of a job not
    given, or two runs of one job raise RecordError."""

    def run(jobs):
        return mangle([run_job(j, tmp_path) for j in jobs])

    with pytest.raises(RecordError, match=match):
        rollouts(_tasks(), _harnesses()[:1], run, samples=1)


def test_summary_keeps_not_scorable_apart_from_infra_errors():
    """not_scorable and infra_error are separate counts, and neither enters reward or pass@1."""
    base = {"schema": "claw.outcome/v1", "session": "s", "task": "t", "group": "t"}
    outs = [
        {**base, "harness": "a", "status": "ok", "reward": 1.0, "passed": True},
        {**base, "harness": "a", "status": "ok", "reward": 0.5, "passed": False},
        {**base, "harness": "a", "status": "infra_error", "reward": None, "passed": None},
        {**base, "harness": "b", "status": "not_scorable", "reward": None, "passed": None},
        {**base, "harness": "b", "status": "not_scorable", "reward": None, "passed": None},
    ]
    assert outcome_summary(outs) == {
        "rollouts": 5,
        "scored": 2,
        "passed": 1,
        "infra_errors": 1,
        "not_scorable": 2,
        "reward": {"a": 0.75, "b": None},
        "pass@1": {"a": 0.5, "b": None},
    }


_FAKE_SANDBOX = """\
import json, sys
sys.path.insert(0, {testdir!r})
from pathlib import Path
from bench_testlib import run_job
argv = sys.argv[1:]
out = Path(argv[argv.index("-o") + 1])
Path({argv_log!r}).write_text(json.dumps(argv))
with out.open("a") as f:
    for line in sys.stdin:
        job = json.loads(line)
        f.write(json.dumps(run_job(job, out.parent / "jobs")) + "\\n")
"""


def _fake_sandbox(tmp_path: Path, monkeypatch) -> Path:
    """A `claw-sandbox` on PATH that runs the jobs with the test runner and logs its argv."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "claw-sandbox"
    argv_log = tmp_path / "argv.json"
    body = _FAKE_SANDBOX.format(testdir=str(Path(__file__).parent), argv_log=str(argv_log))
    exe.write_text(f"#!{sys.executable}\n{body}")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return argv_log


def test_sandbox_cli_pipes_jobs_through_claw_sandbox_run(tmp_path, monkeypatch):
    """sandbox_cli runs `claw-sandbox run - -o FILE` with the backend, parallelism and executor
    asked for, and returns only the runs of the jobs it was given from a kept runs file."""
    argv_log = _fake_sandbox(tmp_path, monkeypatch)
    runs_file = tmp_path / "runs.jsonl"
    old = {"schema": "claw.run/v1", "job_id": "older-batch", "status": "ok"}
    runs_file.write_text(json.dumps(old) + "\n")
    run = sandbox_cli(backend="process", parallel=3, executor="ray", output=runs_file)
    batch = rollouts(_tasks(), _harnesses()[:1], run, samples=1, run_id="cli")
    assert [o["passed"] for o in batch.outcomes] == [True, True]
    argv = json.loads(argv_log.read_text())
    assert argv == [
        "run",
        "-",
        "-o",
        str(runs_file),
        "--backend",
        "process",
        "--parallel",
        "3",
        "--executor",
        "ray",
    ]
    assert len(runs_file.read_text().splitlines()) == 3  # the file is appended to


def test_sandbox_cli_without_claw_sandbox_says_so(tmp_path, monkeypatch):
    """No such program on PATH or next to the interpreter: a ClawError that says what to
    install, before anything runs."""
    monkeypatch.setenv("PATH", str(tmp_path))
    run = sandbox_cli(program="claw-sandbox-not-here")
    with pytest.raises(
        ClawError, match="claw-sandbox-not-here is not on PATH .*install claw-sandbox"
    ):
        rollouts(_tasks(), _harnesses()[:1], run, samples=1)


def _cli_rollouts(tmp_path, extra):
    out = tmp_path / "outcomes.jsonl"
    args = ["rollouts", "-s", "claw-mini", "-H", "oracle", "-H", "nothing", "-n", "2"]
    args += [a for t in TASKS for a in ("--task", t)]
    args += ["--run-id", "cli", "-o", str(out), *extra]
    r = CliRunner().invoke(main, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r, read_records(out, "claw.outcome/v1")


def test_cli_rollouts_chains_plan_run_score(tmp_path, monkeypatch):
    """`claw-bench rollouts` plans, runs the jobs through `claw-sandbox run` (its options passed
    on), writes the jobs, the runs and the outcomes, and counts them apart on stderr."""
    argv_log = _fake_sandbox(tmp_path, monkeypatch)
    jobs, runs = tmp_path / "jobs.jsonl", tmp_path / "runs.jsonl"
    extra = ["--jobs", str(jobs), "--runs", str(runs), "-b", "process", "-p", "2"]
    r, outcomes = _cli_rollouts(tmp_path, [*extra, "--sandbox-arg=--retries", "--sandbox-arg=0"])
    assert json.loads(argv_log.read_text())[4:] == [
        "--backend",
        "process",
        "--parallel",
        "2",
        "--executor",
        "local",
        "--retries",
        "0",
    ]
    assert len(read_records(jobs, "claw.job/v1")) == len(read_records(runs, "claw.run/v1")) == 8
    assert [(o["harness"], o["passed"]) for o in outcomes[:4]] == [
        ("nothing", False),
        ("nothing", False),
        ("oracle", True),
        ("oracle", True),
    ]
    assert "scored 8 rollouts: 4 passed, 8 scored, 0 infra errors, 0 not scorable" in r.stderr


@pytest.mark.other_clis
@pytest.mark.skipif(sandbox_executable() is None, reason="claw-sandbox CLI not installed")
def test_cli_rollouts_through_real_claw_sandbox(tmp_path):
    """The same through the real claw-sandbox CLI (process backend)."""
    r, outcomes = _cli_rollouts(tmp_path, ["-b", "process"])
    assert {o["harness"]: o["passed"] for o in outcomes} == {"oracle": True, "nothing": False}
    assert all(o["status"] == "ok" for o in outcomes) and len(outcomes) == 8
