"""What a Terminal-Bench user has in Harbor: datasets by name from a registry (cached), the
timeout multiplier, the verifier's network by the task's allow_internet."""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from claw_bench import TaskError, load_harbor_task, load_suite
from claw_bench.cli import main
from claw_bench.datasets import resolve_dataset
from claw_bench.harnesses import load_harness
from claw_bench.plan import plan_jobs
from click.testing import CliRunner

FIXTURE = Path(__file__).parent / "data" / "harbor" / "hello-harbor"


def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str, str]:
    """A git repository with tasks/hello-harbor: (repo, first commit, second commit), the second
    changing the instruction."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    r = tmp_path / "tasks-repo"
    shutil.copytree(FIXTURE, r / "tasks" / "hello-harbor")
    subprocess.run(["git", "init", "-q", str(r)], check=True)
    _git(r, "add", "-A")
    _git(r, "commit", "-qm", "one")
    first = _git(r, "rev-parse", "HEAD")
    (r / "tasks" / "hello-harbor" / "instruction.md").write_text("changed later\n")
    _git(r, "commit", "-qam", "two")
    return r, first, _git(r, "rev-parse", "HEAD")


def _registry(path: Path, repo: Path, commit: str | None) -> Path:
    entry = {"name": "hello-harbor", "git_url": str(repo), "git_commit_id": commit}
    path.write_text(
        json.dumps(
            [
                {
                    "name": "tb",
                    "version": "1.0",
                    "tasks": [{**entry, "path": "tasks/hello-harbor"}],
                },
                {
                    "name": "tb",
                    "version": "2.0",
                    "tasks": [{**entry, "path": "tasks/hello-harbor"}],
                },
            ]
        )
    )
    return path


def test_dataset_resolves_at_its_commit_and_is_cached(tmp_path, repo):
    """-d NAME@VERSION: the task folder at the registry's commit (not the branch's head); a
    second resolve is served from the cache with the repository gone."""
    r, first, _second = repo
    reg = _registry(tmp_path / "registry.json", r, first)
    suite = resolve_dataset("tb@1.0", str(reg), tmp_path / "cache")
    (task,) = load_suite(suite).tasks
    assert task.id == "hello-harbor"
    assert task.instruction == load_harbor_task(FIXTURE).instruction  # the first commit's
    shutil.rmtree(r)
    assert resolve_dataset("tb@1.0", str(reg), tmp_path / "cache") == suite


def test_dataset_head_commit_and_errors(tmp_path, repo):
    """A null commit is the remote's HEAD; an unknown version or dataset names what there is."""
    r, _first, second = repo
    reg = _registry(tmp_path / "registry.json", r, None)
    suite = resolve_dataset("tb@2.0", str(reg), tmp_path / "cache")
    assert load_suite(suite).tasks[0].instruction == "changed later\n"
    assert any(p.name.endswith(second) for p in (tmp_path / "cache" / "git").iterdir())
    with pytest.raises(TaskError, match=r"no version '3.0'.*1.0"):
        resolve_dataset("tb@3.0", str(reg), tmp_path / "cache")
    with pytest.raises(TaskError, match="give a version"):
        resolve_dataset("tb", str(reg), tmp_path / "cache")
    with pytest.raises(TaskError, match="no dataset 'nope'"):
        resolve_dataset("nope@1", str(reg), tmp_path / "cache")
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps(
            [
                {
                    "name": "x",
                    "version": "1",
                    "tasks": [{"name": "t", "git_url": str(r), "path": "../etc"}],
                }
            ]
        )
    )
    with pytest.raises(TaskError, match="leaves the repository"):
        resolve_dataset("x@1", str(bad), tmp_path / "cache")
    twice = [{"name": "t", "git_url": str(r), "path": "tasks/hello-harbor"}] * 2
    bad.write_text(json.dumps([{"name": "x", "version": "1", "tasks": twice}]))
    with pytest.raises(TaskError, match="'t' appears more than once"):
        resolve_dataset("x@1", str(bad), tmp_path / "cache")


def test_plan_dataset_from_a_registry_url(tmp_path, repo, monkeypatch):
    """claw-bench plan -d NAME@VERSION --registry http://...: jobs for the dataset's tasks, with
    local tasks (no git_url) relative to a local registry file."""
    r, first, _ = repo
    _registry(tmp_path / "registry.json", r, first)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("CLAW_BENCH_CACHE", str(tmp_path / "cache"))
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/registry.json"
        res = CliRunner().invoke(main, ["plan", "-d", "tb@1.0", "--registry", url, "-H", "oracle"])
    finally:
        server.shutdown()
        server.server_close()
    assert res.exit_code == 0, res.output
    (job,) = [json.loads(line) for line in res.stdout.splitlines()]
    assert job["meta"]["task"] == "hello-harbor" and job["profile"] == "harbor"
    local = tmp_path / "local.json"
    local.write_text(
        json.dumps(
            [
                {
                    "name": "loc",
                    "version": "1",
                    "tasks": [
                        {"name": "h", "git_url": None, "path": "tasks-repo/tasks/hello-harbor"}
                    ],
                }
            ]
        )
    )
    res = CliRunner().invoke(
        main, ["plan", "-d", "loc@1", "--registry", str(local), "-H", "oracle"]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["meta"]["task"] == "h"  # the registry's name (the link)
    res = CliRunner().invoke(main, ["plan", "-d", "loc@1", "-s", "claw-mini", "-H", "oracle"])
    assert res.exit_code != 0 and "one of --suite and -d" in res.output


def _plan(**kw):
    return plan_jobs([load_harbor_task(FIXTURE)], [load_harness("oracle")], samples=1, **kw)


def test_timeout_multiplier_scales_agent_and_verifier_timeouts():
    """--timeout-multiplier 2.5: the agent's and the verifier's timeouts (task.toml's 120 s and
    30 s) times 2.5, recorded in meta; 1 leaves the job as it was."""
    (plain,) = _plan()
    (scaled,) = _plan(timeout_multiplier=2.5)
    assert (plain["timeout_s"], plain["verify"]["timeout_s"]) == (120.0, 30.0)
    assert (scaled["timeout_s"], scaled["verify"]["timeout_s"]) == (300.0, 75.0)
    assert scaled["meta"]["timeout_multiplier"] == 2.5 and "timeout_multiplier" not in plain["meta"]
    res = CliRunner().invoke(
        main, ["plan", "-s", str(FIXTURE), "-H", "oracle", "--timeout-multiplier", "0.5"]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["timeout_s"] == 60.0


def test_timeout_multiplier_scales_every_step(tmp_path):
    """A multi-step job: each step's timeout and each step's verify timeout are scaled too."""
    from claw_bench._job import JobSpec
    from claw_bench.plan import scale_timeouts

    steps = [
        {
            "name": "a",
            "command": "true",
            "timeout_s": 10.0,
            "verify": {"command": "true", "timeout_s": 4.0},
        }
    ]
    spec = JobSpec(job_id="j", workspace={}, setup=[], command="true", env={}, timeout_s=8.0,
                   network={"policy": "none"}, collect=[], meta={}, steps=steps)  # fmt: skip
    out = scale_timeouts(spec, 3).to_dict()
    assert out["timeout_s"] == 24.0
    assert out["steps"][0]["timeout_s"] == 30.0 and out["steps"][0]["verify"]["timeout_s"] == 12.0


def test_verify_network_follows_allow_internet(tmp_path):
    """--verify-network: the verify step of a task with allow_internet = true gets the host's
    network while the oracle's command keeps none; a task with allow_internet = false does not;
    without the flag no verify step gets it."""
    (job,) = _plan(verify_network=True)
    assert job["network"] == {"policy": "none"}
    assert job["verify"]["network"] == {"policy": "host"}
    (off,) = _plan()
    assert "network" not in off["verify"]
    closed = tmp_path / "closed"
    shutil.copytree(FIXTURE, closed)
    toml = closed / "task.toml"
    toml.write_text(
        toml.read_text().replace("[environment]", "[environment]\nallow_internet = false")
    )
    task = load_harbor_task(closed)
    assert task.meta["allow_internet"] is False
    (job,) = plan_jobs([task], [load_harness("oracle")], samples=1, verify_network=True)
    assert "network" not in job["verify"]


def test_trials_write_harbors_job_directory_and_report_lists_them(tmp_path):
    """claw-bench trials: one folder per trial (agent/, verifier/ with reward.txt and
    test-stdout.txt, result.json with Harbor's fields); the outcomes gain meta.trial_dir and
    claw-bench report --trials prints each trial's folder. An infra error's result.json carries
    exception_info."""
    from bench_testlib import run_job
    from claw_bench import score_run

    (job,) = _plan()
    run = run_job(job, tmp_path / "work")
    broken = {**run, "job_id": "broken", "status": "infra_error", "verify": None,
              "error": "bwrap: no user namespaces", "meta": {**run["meta"], "session": "s-broken"}}  # fmt: skip
    runs = tmp_path / "runs.jsonl"
    runs.write_text("".join(json.dumps(r) + "\n" for r in (run, broken)))
    outcomes = "".join(json.dumps(score_run(r)) + "\n" for r in (run, broken))
    jobs_dir = tmp_path / "jobs"
    args = ["trials", "--runs", str(runs), "--jobs-dir", str(jobs_dir)]
    res = CliRunner().invoke(main, args, input=outcomes)
    assert res.exit_code == 0, res.output
    ok, bad = [json.loads(line) for line in res.stdout.splitlines()]
    trial = Path(ok["meta"]["trial_dir"])
    assert trial.parent == jobs_dir.resolve() and trial.name.startswith("hello-harbor__")
    assert (trial / "verifier" / "reward.txt").read_text().strip() == "1"
    assert (trial / "verifier" / "test-stdout.txt").is_file() and (trial / "agent").is_dir()
    result = json.loads((trial / "result.json").read_text())
    assert result["task_name"] == "hello-harbor" and result["trial_name"] == trial.name
    assert result["verifier_result"] == {"rewards": {"reward": 1.0}}
    assert result["exception_info"] is None and result["agent_info"]["name"] == "oracle"
    err = json.loads((Path(bad["meta"]["trial_dir"]) / "result.json").read_text())
    assert err["exception_info"]["exception_message"] == "bwrap: no user namespaces"
    assert err["verifier_result"] is None
    out = tmp_path / "outcomes.jsonl"
    out.write_text(res.stdout)
    rep = CliRunner().invoke(main, ["report", str(out), "--trials"])
    assert rep.exit_code == 0, rep.output
    assert str(trial) in rep.stdout and bad["meta"]["trial_dir"] in rep.stdout
    stray = json.dumps({**ok, "job_id": "nope", "session": "nope"}) + "\n"
    res = CliRunner().invoke(main, args, input=stray)
    assert res.exit_code != 0 and "no run with job_id 'nope'" in res.output
