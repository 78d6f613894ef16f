"""`claw-proxy serve` as a real process: every answered call survives kill -9."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from claw_proxy import read_calls
from proxy_testlib import SECRET, TINY, token, write_script


@pytest.mark.slow
def test_kill_9_loses_no_answered_call(tmp_path):
    """Calls answered before SIGKILL are all in the records, and no line is half-written."""
    (tmp_path / "secret").write_text(SECRET + "\n")
    script = write_script(tmp_path / "s.jsonl", ["a fairly long answer " * 5])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    record = tmp_path / "calls.jsonl"
    cli = [sys.executable, "-c", "from claw_proxy.cli import main; main()"]
    proc = subprocess.Popen(
        [
            *cli,
            "serve",
            "--engine",
            f"scripted:{script}",
            "--tokenizer",
            str(TINY),
            "--port",
            str(port),
            "--secret-file",
            str(tmp_path / "secret"),
            "--record",
            str(record),
        ],
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        answered = 0
        with httpx.Client(base_url=url, timeout=30) as h:
            for i in range(20):
                body = {
                    "model": "m",
                    "messages": [{"role": "user", "content": f"q{i}"}],
                    "stream": i % 2 == 0,
                }
                r = h.post(
                    "/v1/chat/completions",
                    json=body,
                    headers={"authorization": f"Bearer {token(f'k{i}')}"},
                )
                assert r.status_code == 200
                answered += 1
            # one more streamed request, killed while the answer is being read
            with h.stream(
                "POST",
                "/v1/chat/completions",
                headers={"authorization": f"Bearer {token('last')}"},
                json={"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True},
            ) as s:
                next(s.iter_lines())
                os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    calls = list(read_calls(record))
    assert record.read_bytes().endswith(b"\n")
    assert len(calls) >= answered and {c.session for c in calls} >= {f"k{i}" for i in range(20)}
    assert all(json.dumps(c.to_dict()) for c in calls)
