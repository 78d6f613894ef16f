"""plan --verify-network through claw-sandbox: a Harbor task whose test.sh needs the network
(as one that installs its tools does) passes its oracle only when its verify step gets it."""

import functools
import http.server
import shutil
import threading

import pytest
from claw_bench import load_harbor_task, load_harness, plan_jobs, score_run
from claw_sandbox import run_jobs

TEST_SH = """#!/bin/bash
mkdir -p /logs/verifier
if python3 -c "import urllib.request; urllib.request.urlopen('{url}', timeout=5)"; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""


@pytest.fixture
def server(tmp_path):
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "tool.txt").write_text("a tool\n")
    handler = functools.partial(
        http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "www")
    )
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/tool.txt"
    srv.shutdown()
    srv.server_close()


def _task(root, url, allow_internet: bool):
    d = root / f"net-{str(allow_internet).lower()}"
    (d / "tests").mkdir(parents=True)
    (d / "solution").mkdir()
    (d / "instruction.md").write_text("Nothing to do.\n")
    (d / "task.toml").write_text(f"[environment]\nallow_internet = {str(allow_internet).lower()}\n")
    (d / "tests" / "test.sh").write_text(TEST_SH.format(url=url))
    (d / "solution" / "solve.sh").write_text("true\n")
    return load_harbor_task(d)


def test_verify_network_gives_the_verifier_the_network_on_bwrap(tmp_path, server):
    """The oracle's job (network none): its verifier reaches the host only with --verify-network,
    and never for a task with allow_internet = false."""
    if shutil.which("bwrap") is None:
        pytest.skip("bwrap is not installed")
    open_task, closed_task = _task(tmp_path, server, True), _task(tmp_path, server, False)
    oracle = load_harness("oracle")
    jobs = plan_jobs([open_task, closed_task], [oracle], samples=1, verify_network=True)
    jobs += plan_jobs([open_task], [oracle], samples=1, run_id="plain")
    runs = run_jobs(jobs, backend="bwrap")  # its default job directories: reachable by the job uid
    rewards = {
        (r["meta"]["task"], r["meta"]["run_id"] == "plain"): score_run(r)["reward"] for r in runs
    }
    assert rewards == {
        ("net-true", False): 1.0,  # --verify-network, allow_internet = true
        ("net-false", False): 0.0,  # allow_internet = false: no network at verify time
        ("net-true", True): 0.0,  # without --verify-network: the job's network (none)
    }, [(r["job_id"], r.get("error"), r.get("stderr_tail")) for r in runs]
