"""claw-agent through the real claw-proxy CLI (scripted engine on the tiny fixture tokenizer), when installed.

Skipped unless `claw-proxy` is on PATH and the repository's tiny model fixture is present: the
packages never import each other, so this check shells out, like an integrator would.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from claw_bench import load_harness, load_suite, plan_jobs, score_runs
from conftest import SECRET, run_job

FIXTURE = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "tiny-qwen3"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("claw-proxy") is None, reason="claw-proxy CLI not on PATH"),
    pytest.mark.skipif(not FIXTURE.is_dir(), reason="tiny model fixture not in this checkout"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def proxy(tmp_path, secret_file):
    script = tmp_path / "script.jsonl"
    script.write_text("\n".join(json.dumps({"text": t}) for t in [
        '<tool_call>\n{"name": "bash", "arguments": {"command": "echo working"}}\n</tool_call>', "hello"]) + "\n")
    port = _free_port()
    log = (tmp_path / "proxy.log").open("w")
    proc = subprocess.Popen(["claw-proxy", "serve", "--engine", f"scripted:{script}", "--tokenizer", str(FIXTURE),
                             "--secret-file", str(secret_file), "--port", str(port),
                             "--record", str(tmp_path / "calls.jsonl")],
                            stdout=subprocess.DEVNULL, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                httpx.get(f"{url}/v1/models", timeout=2)
                break
            except httpx.HTTPError:
                assert proc.poll() is None, (tmp_path / "proxy.log").read_text()
                time.sleep(0.5)
        yield url, tmp_path / "calls.jsonl"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_claw_agent_through_the_proxy(tmp_path, proxy):
    """Tool call parsed by the proxy, run by claw-agent; final answer scored by the toy verifier; calls recorded."""
    url, calls = proxy
    task = load_suite("claw-toy").get("toy-hello")
    jobs = plan_jobs([task], [load_harness("claw-agent-chat"), load_harness("claw-agent-anthropic")], samples=1,
                     proxy_url=url, secret=SECRET, run_id="px")
    outcomes = score_runs([run_job(j, tmp_path / "sb") for j in jobs])
    assert [(o["status"], o["passed"], o["reward"]) for o in outcomes] == [("ok", True, 1.0)] * 2
    sessions = {json.loads(x)["session"] for x in calls.read_text().splitlines()}
    assert sessions == {j["meta"]["session"] for j in jobs}
