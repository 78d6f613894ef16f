"""examples/rl_step.sh: one RL step through the five CLIs only, on a task and a harness adapter
written only for this test (tests/fixtures/rl-step/) and the tiny model."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "rl_step.sh"
FIXTURES = ROOT / "tests" / "fixtures" / "rl-step"
TINY = ROOT / "tests" / "fixtures" / "tiny-qwen3"


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _env() -> dict:
    """The CLIs of this Python's environment first on PATH, as a user's activated venv."""
    bin_dir = str(Path(sys.executable).parent)
    return dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _script(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_usage_errors_name_the_option(tmp_path):
    """--help prints the options; a missing --model or an unknown option is a usage error (exit 2)
    that says what was wrong, before any proxy starts."""
    r = _script("--help")
    assert r.returncode == 0 and "--harness H" in r.stdout and "proxy up" in r.stdout
    r = _script("--run-dir", str(tmp_path / "r"))
    assert r.returncode == 2 and "--model DIR is required" in r.stderr
    r = _script("--model", str(TINY), "--bogus", "1")
    assert r.returncode == 2 and "unknown option --bogus" in r.stderr
    r = _script("--model", str(tmp_path))
    assert r.returncode == 2 and "no config.json there" in r.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_one_rl_step_through_the_clis_with_a_harness_and_task_of_our_own(tmp_path):
    """The script brings the proxy up on the tiny model, plans 3 rollouts of the test-only task for
    the test-only script harness, runs and scores them, builds samples, trains one GRPO step and
    reloads the proxy: every record is there, the new policy's weights moved, and the proxy
    serves version 1 after the reload."""
    run = tmp_path / "step"
    r = _script(
        *("--suite", str(FIXTURES / "tasks"), "--harness", str(FIXTURES / "one-shot-chat.toml")),
        *("--model", str(TINY), "--run-dir", str(run), "--rollouts", "3"),
        *("--max-new-tokens", "16", "--port", str(_free_port())),
    )
    assert r.returncode == 0, r.stderr[-4000:]

    jobs = _rows(run / "jobs.jsonl")
    assert len(jobs) == 3 and {j["meta"]["harness"] for j in jobs} == {"one-shot-chat"}
    runs = _rows(run / "runs.jsonl")
    assert sorted(x["status"] for x in runs) == ["ok"] * 3
    outcomes = _rows(run / "outcomes.jsonl")
    assert [o["schema"] for o in outcomes] == ["claw.outcome/v1"] * 3
    assert all(o["task"] == "say-ok" and o["status"] == "ok" for o in outcomes)
    # the shaped verifier gives the random model's answers different rewards: a learning signal
    assert len({o["reward"] for o in outcomes}) > 1, outcomes

    calls = _rows(run / "calls.jsonl")
    assert {c["session"] for c in calls} == {o["session"] for o in outcomes}
    assert all(c["api"] == "openai.chat" and c["policy"]["version"] == 0 for c in calls), calls
    samples = _rows(run / "samples.jsonl")
    assert samples and {s["schema"] for s in samples} == {"claw.sample/v1"}
    assert {x for s in samples for x in s["sessions"]} == {o["session"] for o in outcomes}

    (policy,) = _rows(run / "policy.jsonl")
    assert policy["schema"] == "claw.policy/v1" and policy["version"] == 1
    new = Path(policy["path"]) / "model.safetensors"
    assert new.read_bytes() != (TINY / "model.safetensors").read_bytes()  # the step moved weights
    assert [p["version"] for p in _rows(run / "rl" / "policies.jsonl")] == [1]

    reload = json.loads((run / "reload.json").read_text())
    assert reload["ok"] and reload["policy"] == {"name": "policy", "version": 1}
    stats = json.loads((run / "stats.json").read_text())
    assert stats["policy"] == {"name": "policy", "version": 1}
    assert stats["calls_recorded"] == 3
