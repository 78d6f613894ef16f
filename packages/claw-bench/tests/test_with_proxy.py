"""claw-agent through the real claw-proxy CLI (scripted engine on the tiny fixture tokenizer), when installed.

Skipped unless `claw-proxy` is on PATH and the repository's tiny model fixture is present: the
packages never import each other, so this check shells out, like an integrator would. The real
harnesses (Claude Code, OpenClaw, Codex, mini-swe-agent) run only with CLAW_BENCH_REAL_HARNESSES=1
and when installed; each gets a scripted answer in its own tool vocabulary (data/harness-scripts).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from bench_testlib import SECRET, proxy_serve, run_job
from claw_bench import load_harness, load_suite, plan_jobs, score_runs

FIXTURE = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "tiny-qwen3"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.other_clis,
    pytest.mark.skipif(shutil.which("claw-proxy") is None, reason="claw-proxy CLI not on PATH"),
    pytest.mark.skipif(not FIXTURE.is_dir(), reason="tiny model fixture not in this checkout"),
]


SCRIPTS = Path(__file__).parent / "data" / "harness-scripts"
AGENT_SCRIPT = [
    '<tool_call>\n{"name": "bash", "arguments": {"command": "echo working"}}\n</tool_call>',
    "hello",
]


def test_claw_agent_through_the_proxy(tmp_path, secret_file):
    """Tool call parsed by the proxy, run by claw-agent; final answer scored by the toy verifier; calls recorded."""
    script = tmp_path / "script.jsonl"
    script.write_text("".join(json.dumps({"text": t}) + "\n" for t in AGENT_SCRIPT))
    with proxy_serve(tmp_path, script, secret_file, FIXTURE) as (url, calls):
        _agent_jobs(tmp_path, url, calls)


def _agent_jobs(tmp_path, url, calls):
    task = load_suite("claw-toy").get("toy-hello")
    jobs = plan_jobs(
        [task],
        [load_harness("claw-agent-chat"), load_harness("claw-agent-anthropic")],
        samples=1,
        proxy_url=url,
        secret=SECRET,
        run_id="px",
    )
    outcomes = score_runs([run_job(j, tmp_path / "sb") for j in jobs])
    assert [(o["status"], o["passed"], o["reward"]) for o in outcomes] == [("ok", True, 1.0)] * 2
    sessions = {json.loads(x)["session"] for x in calls.read_text().splitlines()}
    assert sessions == {j["meta"]["session"] for j in jobs}


@pytest.mark.skipif(
    os.environ.get("CLAW_BENCH_REAL_HARNESSES") != "1",
    reason="set CLAW_BENCH_REAL_HARNESSES=1 to run installed real harnesses (minutes)",
)
@pytest.mark.parametrize(
    "harness",
    [
        "claude-code",
        "openclaw-chat",
        "openclaw-anthropic",
        "openclaw-responses",
        "codex",
        "mini-swe-agent",
    ],
)
def test_real_harness_adapter_through_the_proxy(tmp_path, secret_file, harness):
    """A real harness, run by its adapter's command against the proxy, executes the scripted tool call."""
    h = load_harness(harness)
    if not h.installed():
        pytest.skip(f"{harness} is not installed (needs {', '.join(h.requires)} on PATH)")
    script = (
        SCRIPTS / f"{harness.split('-')[0] if harness.startswith('openclaw') else harness}.jsonl"
    )
    task = load_suite("claw-mini").get("csv-filter-region")
    with proxy_serve(tmp_path, script, secret_file, FIXTURE) as (url, calls):
        [job] = plan_jobs([task], [h], samples=1, proxy_url=url, secret=SECRET, run_id="real")
        (tmp_path / "home").mkdir()
        job["env"]["HOME"] = str(tmp_path / "home")
        run = run_job(job, tmp_path / "sb")
    [o] = score_runs([run])
    assert (o["status"], o["passed"], o["reward"]) == ("ok", True, 1.0), run["stderr_tail"]
    assert job["meta"]["session"] in {
        json.loads(x)["session"] for x in calls.read_text().splitlines()
    }
