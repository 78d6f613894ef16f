"""Harbor multi-step tasks (steps/), task.toml artifacts and PinchBench multi-session tasks: loaded,
planned as claw.job/v1 `steps`, run in one environment, scored by Harbor's rules."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from _bench_schemas import validate
from bench_testlib import SECRET, run_job
from claw_bench import load_harness, load_suite, plan_jobs, score_run
from claw_bench.cli import main
from claw_bench.harnesses import INSTRUCTION_FILE
from claw_bench.score import aggregate_steps
from click.testing import CliRunner

FIX = Path(__file__).parent / "fixtures" / "issue16"
STEPS = FIX / "harbor-steps"
MEAN, FINAL = "claw-fixtures-steps-mean", "hb-steps-final"


def test_multistep_suite_loads_steps_in_order_and_skips_the_broken_one():
    """Each [[steps]] entry becomes a step with its instruction, the task's tests/ under its own
    (its own test.sh wins, else the task's), its WORKDIR uploads, timeouts, env and gate."""
    s = load_suite(STEPS)
    assert sorted(t.id for t in s.tasks) == [MEAN, FINAL]
    ((path, reason),) = s.skipped
    assert path.endswith("hb-steps-broken") and "needs [[steps]] entries" in reason
    mean = s.get(MEAN)
    steps = mean.meta["harbor_steps"]
    assert [st["name"] for st in steps] == ["create", "extend", "describe"]
    assert mean.meta["multi_step_reward_strategy"] == "mean"
    assert steps[0]["instruction"].startswith("Write a bash script /app/tool.sh")
    assert all(sorted(st["tests"]) == ["common.sh", "test.sh"] for st in steps)
    assert steps[1]["tests"]["test.sh"] != steps[2]["tests"]["test.sh"]
    assert sorted(steps[1]["workdir_files"]) == ["numbers.txt", "setup.sh"]
    assert [st["timeout_s"] for st in steps] == [30.0, 60.0, 60.0]  # [steps.agent] else [agent]
    assert "export WANT_SUM=15" in steps[1]["runner"] and "WANT_SUM" not in steps[0]["runner"]
    assert "timeout -s KILL 30 " in steps[1]["runner"]  # [steps.verifier] timeout_sec
    assert steps[0]["min_reward"] == 1.0 and steps[1]["healthcheck"]["command"]
    assert steps[2]["artifacts"] == [
        {"source": "/app/docs", "destination": "documentation", "exclude": []}
    ]
    final = s.get(FINAL)
    first, second = final.meta["harbor_steps"]
    assert final.meta["multi_step_reward_strategy"] == "final"
    assert "fallback" in first["tests"]["test.sh"] and "fallback" not in second["tests"]["test.sh"]
    assert first["min_reward"] == {"exists": 1.0}


def test_multistep_jobs_carry_every_step():
    """oracle: each step runs its solve.sh at /solution; a model harness gets each step's
    instruction; nothing does nothing; /tests only in the steps' verify; no job-level verify."""
    mean = load_suite(STEPS).get(MEAN)
    chat = load_harness("claw-agent-chat")
    jobs = plan_jobs(
        [mean],
        [load_harness("oracle"), load_harness("nothing"), chat],
        samples=1,
        proxy_url="http://127.0.0.1:8000",
        secret=SECRET,
    )
    for j in jobs:
        validate(j, "job")
        assert "verify" not in j and [s["name"] for s in j["steps"]] == [
            "create",
            "extend",
            "describe",
        ]
        assert j["meta"]["multi_step_reward_strategy"] == "mean"
        assert all(s["verify"]["mounts"][0]["target"] == "/tests" for s in j["steps"])
        assert all(s["verify"]["reset"] == ["/logs/verifier"] for s in j["steps"])
        assert j["steps"][0]["min_reward"] == 1.0
        assert j["steps"][1]["setup"][0] == "bash ./setup.sh"  # the WORKDIR upload's hook
        assert "test -f /app/tool.sh" in j["steps"][1]["setup"][1]  # the healthcheck
        assert "/tests" not in [m["target"] for m in j["mounts"]]
    oracle, nothing, model = jobs
    assert all(s["command"] == "bash /solution/solve.sh" for s in oracle["steps"])
    assert [m["target"] for m in oracle["steps"][2]["mounts"]] == ["/solution"]
    assert "mkdir -p /app/docs" in oracle["steps"][2]["mounts"][0]["files"]["solve.sh"]
    assert all(s["command"] == "true" for s in nothing["steps"])
    files = [s["files"][INSTRUCTION_FILE] for s in model["steps"]]
    assert files[1].startswith("/app/numbers.txt holds") and files[2].startswith("Document")
    assert "claw_bench.agent" in model["steps"][1]["command"]


def test_harbor_reward_rules_mean_and_final():
    """mean: per-key mean over the verified steps, a key a step lacks counting 0; final: the last
    step's, as it is."""
    rs = [{"reward": 1.0}, {"reward": 0.5, "style": 1.0}]
    assert aggregate_steps(rs, "mean") == {"reward": 0.75, "style": 0.5}
    assert aggregate_steps(rs, "final") == {"reward": 0.5, "style": 1.0}
    assert aggregate_steps([], "mean") == {}


def _steps_run(strategy: str, steps: list[dict]) -> dict:
    return {
        "schema": "claw.run/v1", "job_id": "j", "status": "ok", "exit_code": 0,
        "verify": steps[-1].get("verify"), "steps": steps, "started_at": 0.0, "ended_at": 1.0,
        "meta": {"session": "s", "task": "t", "harness": "h", "pass_threshold": 1.0,
                 "multi_step_reward_strategy": strategy},
    }  # fmt: skip


def _step(name: str, reward: float, details: dict | None = None, met: bool | None = None) -> dict:
    rec = {"name": name, "status": "ok", "exit_code": 0,
           "verify": {"exit_code": 0, "passed": True, "reward": reward, "details": details or {},
                      "output": "", "timed_out": False}}  # fmt: skip
    if met is not None:
        rec["min_reward"] = {"threshold": 1.0, "met": met}
    return rec


def test_score_of_multistep_runs():
    """score applies the strategy, lists each step's rewards, names a gate that stopped the steps,
    and takes a multi-key aggregate's mean as the reward."""
    out = score_run(_steps_run("mean", [_step("a", 1.0), _step("b", 0.5)]))
    validate(out, "outcome")
    assert out["reward"] == 0.75 and out["passed"] is False
    assert [s["name"] for s in out["details"]["steps"]] == ["a", "b"]
    out = score_run(_steps_run("final", [_step("a", 0.0, met=False)]))
    assert out["reward"] == 0.0 and out["details"]["stopped_after"] == "a"
    keys = [_step("a", 0.5, {"x": 1.0, "y": 0.0}), _step("b", 1.0, {"x": 1.0, "y": 1.0})]
    out = score_run(_steps_run("mean", keys))
    assert out["details"]["x"] == 1.0 and out["details"]["y"] == 0.5 and out["reward"] == 0.75
    none = _steps_run("mean", [{"name": "a", "status": "ok", "exit_code": 0, "verify": None}])
    assert score_run(none)["status"] == "infra_error"


def test_artifacts_are_copied_after_verify_and_collected(tmp_path):
    """task.toml artifacts (a file, a folder under another name) land in /logs/artifacts after
    the verifier and come back in the run's collected files; the verifier's result is kept."""
    t = load_suite(FIX / "harbor").get("hb-workdir-app")
    assert t.meta["harbor"]["artifacts"][1] == {
        "source": "/app/input",
        "destination": "inputs",
        "exclude": ["*.tmp"],
    }
    (job,) = plan_jobs([t], [load_harness("oracle")], samples=1, network="none")
    validate(job, "job")
    assert "/logs/artifacts/**" in job["collect"]
    run = run_job(job, tmp_path)
    out = score_run(run)
    assert out["reward"] == 1.0
    assert run["collected"]["/logs/artifacts/total.txt"] == "81\n"  # what the oracle wrote
    assert "/logs/artifacts/inputs/numbers.txt" in run["collected"]


def _sessions_suite(root: Path) -> Path:
    (root / "tasks").mkdir(parents=True)
    (root / "tasks" / "task_sessions.md").write_text(
        "---\nid: task_sessions\nname: sessions\ngrading_type: automated\ntimeout_seconds: 30\n"
        "sessions:\n  - id: remember\n    prompt: first prompt\n"
        "  - id: follow_up\n    prompt: second prompt\n"
        "  - id: fresh\n    new_session: true\n    prompt: third prompt\n---\n"
        "## Prompt\nA multi-session task.\n\n## Automated Checks\n```python\n"
        "def grade(transcript, workspace_path):\n"
        "    import pathlib\n"
        "    seen = (pathlib.Path(workspace_path) / 'seen.log').read_text().splitlines()\n"
        "    want = ['new first prompt', 'cont second prompt', 'new third prompt']\n"
        "    return {'order': 1.0 if seen == want else 0.0}\n```\n"
    )
    return root


def _adapter(tmp_path: Path, with_continue: bool) -> Path:
    p = tmp_path / ("cont.toml" if with_continue else "plain.toml")
    text = 'api = "chat"\ninstruction = "arg"\ncommand = "echo new {{instruction}} >> seen.log"\n'
    if with_continue:
        text += 'continue_command = "echo cont {{instruction}} >> seen.log"\n'
    p.write_text(text)
    return p


def test_sessions_plan_as_steps_continuing_where_the_adapter_can(tmp_path):
    """Each prompt is a step in order; a prompt that continues the session runs the adapter's
    continue_command, or, without one, a new session named in meta.sessions_not_continued."""
    t = load_suite(_sessions_suite(tmp_path / "pb")).get("task_sessions")
    jobs = plan_jobs(
        [t],
        [load_harness(str(_adapter(tmp_path, True))), load_harness(str(_adapter(tmp_path, False)))],
        samples=1,
        proxy_url="http://127.0.0.1:9",
        secret=SECRET,
    )
    cont, plain = jobs
    for j in jobs:
        validate(j, "job")
        assert [s["name"] for s in j["steps"]] == ["remember", "follow_up", "fresh"]
        assert j["verify"]["command"]  # graded once, at the end
    assert [s["command"].split()[1] for s in cont["steps"]] == ["new", "cont", "new"]
    assert "sessions_not_continued" not in cont["meta"]
    assert [s["command"].split()[1] for s in plain["steps"]] == ["new", "new", "new"]
    assert plain["meta"]["sessions_not_continued"] == ["follow_up"]


def test_continue_command_is_checked_and_claude_code_has_one(tmp_path):
    """An adapter's continue_command needs the instruction placeholder its mode uses; Claude Code
    continues with `claude -c`."""
    from claw_bench.errors import HarnessError

    bad = tmp_path / "bad.toml"
    bad.write_text(
        'api = "chat"\ncommand = "x {{instruction}}"\ncontinue_command = "x --continue"\n'
    )
    with pytest.raises(HarnessError, match="continue_command.*instruction"):
        load_harness(str(bad))
    cc = load_harness("claude-code")
    assert cc.continue_command is not None and cc.continue_command.startswith("claude -c -p ")


def _sandbox(jobs: Path, runs: Path, backend: str, *extra: str) -> None:
    doctor = subprocess.run(
        ["claw-sandbox", "doctor"], capture_output=True, text=True
    ).stdout.splitlines()
    if not any(line.split()[:2] == ["ok", backend] for line in doctor):
        pytest.skip(f"{backend} backend unavailable here (claw-sandbox doctor)")
    p = subprocess.run(
        ["claw-sandbox", "run", str(jobs), "-o", str(runs), "--backend", backend, *extra],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr


def _steps_flow(tmp_path: Path, backend: str, *extra: str) -> dict:
    """plan oracle + nothing --network none -> claw-sandbox run -> score, on the steps suite."""
    jobs, runs, outs = tmp_path / "jobs.jsonl", tmp_path / "runs.jsonl", tmp_path / "out.jsonl"
    r = CliRunner().invoke(
        main,
        ["plan", "-s", str(STEPS), "-H", "oracle", "-H", "nothing", "--network", "none",
         "-o", str(jobs)],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    _sandbox(jobs, runs, backend, *extra)
    r = CliRunner().invoke(main, ["score", str(runs), "-o", str(outs)])
    assert r.exit_code == 0, r.output
    return {
        "runs": {json.loads(x)["meta"]["task"] + "/" + json.loads(x)["meta"]["harness"]: json.loads(x)
                 for x in runs.read_text().splitlines()},
        "outcomes": {(o["task"], o["harness"]): (o["status"], o["reward"], o["passed"])
                     for o in map(json.loads, outs.read_text().splitlines())},
    }  # fmt: skip


def _check_steps_flow(flow: dict) -> None:
    assert flow["outcomes"] == {
        (MEAN, "oracle"): ("ok", 1.0, True),
        (MEAN, "nothing"): ("ok", 0.0, False),
        (FINAL, "oracle"): ("ok", 1.0, True),
        (FINAL, "nothing"): ("ok", 0.0, False),
    }
    run = flow["runs"][f"{MEAN}/oracle"]
    assert [s["verify"]["reward"] for s in run["steps"]] == [1.0, 1.0, 1.0]
    c = run["collected"]  # task artifacts after every step, the step's own after its own
    assert c["/logs/artifacts/steps/create/tool.sh"] == "#!/bin/bash\necho ready\n"
    assert "awk" in c["/logs/artifacts/steps/describe/tool.sh"]
    assert c["/logs/artifacts/steps/describe/documentation/tool.md"].startswith("# tool")
    assert [s["name"] for s in flow["runs"][f"{MEAN}/nothing"]["steps"]] == ["create"]  # gated
    final = flow["runs"][f"{FINAL}/oracle"]["steps"]
    assert [s["verify"]["details"] for s in final] == [
        {"exists": 1.0, "correct": 0.0},
        {"exists": 1.0, "correct": 1.0},
    ]


@pytest.mark.other_clis
@pytest.mark.skipif(shutil.which("claw-sandbox") is None, reason="claw-sandbox CLI not on PATH")
def test_multistep_flow_on_bwrap(tmp_path):
    """On bwrap: every step's oracle in one environment gives 1.0 (mean and final); nothing is
    stopped by the first gate and scores 0; artifacts come back per step."""
    _check_steps_flow(_steps_flow(tmp_path, "bwrap"))


@pytest.mark.slow
@pytest.mark.other_clis
@pytest.mark.skipif(shutil.which("claw-sandbox") is None, reason="claw-sandbox CLI not on PATH")
def test_multistep_flow_on_docker(tmp_path):
    """The same on docker: one trial container for all steps, its image built from environment/
    on a locally imported base image."""
    from _fixture_image import BASE_IMAGE, ensure_base_image

    why = ensure_base_image()
    if why:
        pytest.skip(f"no local base image for the fixtures: {why}")
    r = CliRunner().invoke(main, ["images", "--suite", str(STEPS), "--build"])
    assert r.exit_code == 0, r.output
    _check_steps_flow(_steps_flow(tmp_path, "docker", "--image", BASE_IMAGE))


@pytest.mark.other_clis
@pytest.mark.skipif(shutil.which("claw-sandbox") is None, reason="claw-sandbox CLI not on PATH")
def test_sessions_run_in_order_in_one_workspace(tmp_path):
    """A multi-session task runs its prompts one after another in the same workspace (a
    continuing prompt through continue_command) and is graded once, at the end."""
    t = load_suite(_sessions_suite(tmp_path / "pb")).get("task_sessions")
    (job,) = plan_jobs(
        [t],
        [load_harness(str(_adapter(tmp_path, True)))],
        samples=1,
        proxy_url="http://127.0.0.1:9",
        secret=SECRET,
        network="host",  # the stand-in harness calls no model: no proxy needs to listen
    )
    jobs, runs = tmp_path / "jobs.jsonl", tmp_path / "runs.jsonl"
    jobs.write_text(json.dumps(job) + "\n")
    _sandbox(jobs, runs, "bwrap")
    (run,) = [json.loads(x) for x in runs.read_text().splitlines()]
    assert [s["name"] for s in run["steps"]] == ["remember", "follow_up", "fresh"]
    out = score_run(run)
    assert out["reward"] == 1.0 and out["passed"] is True, out
