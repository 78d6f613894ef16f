"""Test helpers: a test-only job runner (plain subprocesses) and a scripted model server.

The runner is deliberately small: it executes one claw.job/v1 dict in a temp directory the way a
sandbox's process backend would (workspace files, setup, command with env, hidden verify files,
verifier, reward file) and returns a claw.run/v1 dict. The real sandbox is claw-sandbox's job.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from claw_bench.check import parse_reward
from claw_bench.token import verify_token

SECRET = b"test-secret"


def _argv(cmd: str | list[str]) -> list[str]:
    return ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)


def _write(path: Path, content: str | dict[str, str]) -> None:
    """A job file entry: text, or {"content_b64": ...} for exact bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else base64.b64decode(content["content_b64"]))


def run_job(job: dict[str, Any], root: Path) -> dict[str, Any]:
    """Execute a claw.job/v1 dict with plain subprocesses under ``root``; a claw.run/v1 dict."""
    started = time.time()
    ws = root / job["job_id"]
    ws.mkdir(parents=True)
    for rel, content in job.get("workspace", {}).get("files", {}).items():
        _write(ws / rel, content)
    env = {**os.environ, **job.get("env", {})}
    for cmd in job.get("setup", []):
        subprocess.run(_argv(cmd), cwd=ws, env=env, check=True, capture_output=True)
    status, exit_code, out, err = "ok", None, "", ""
    try:
        p = subprocess.run(_argv(job["command"]), cwd=ws, env=env, capture_output=True, text=True,
                           timeout=job.get("timeout_s", 600))
        exit_code, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        status = "timeout"
    verify = None
    if job.get("verify"):
        v = job["verify"]
        for rel, content in v.get("files", {}).items():
            _write(ws / rel, content)
        p = subprocess.run(_argv(v["command"]), cwd=ws, capture_output=True, text=True, timeout=v.get("timeout_s", 60))
        reward, details = None, {}
        rf = ws / v.get("reward_file", "")
        if v.get("reward_file") and rf.is_file():
            reward, details = parse_reward(rf.read_text())
        verify = {"exit_code": p.returncode, "passed": p.returncode == 0,
                  "reward": reward if reward is not None else float(p.returncode == 0), "details": details,
                  "output": p.stdout[-2000:], "timed_out": False}
    return {"schema": "claw.run/v1", "job_id": job["job_id"], "status": status, "exit_code": exit_code,
            "verify": verify, "stdout_tail": out[-2000:], "stderr_tail": err[-2000:], "backend": "test-process",
            "started_at": started, "ended_at": time.time(), "duration_s": time.time() - started,
            "meta": job.get("meta", {})}


Policy = Callable[[dict[str, str], int, dict[str, Any]], dict[str, Any]]


class ModelServer:
    """A scripted OpenAI-chat / Anthropic-messages endpoint on loopback that checks session tokens.

    ``policy(tags, turn, body)`` returns {"text": str, "tool_calls": [(name, args)]} for the
    session's ``turn``-th request (from 0); requests with a forged token get 401.
    """

    def __init__(self, policy: Policy):
        self.policy = policy
        self.turns: dict[str, int] = {}
        self.requests: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                key = self.headers.get("x-api-key") or self.headers.get("authorization", "").removeprefix("Bearer ")
                found = verify_token(key, SECRET)
                if found is None:
                    self._send(401, {"error": {"message": "bad token"}})
                    return
                session, tags = found
                turn = server.turns.get(session, 0)
                server.turns[session] = turn + 1
                server.requests.append({"path": self.path, "session": session, "tags": tags, "body": body})
                reply = server.policy(tags, turn, body)
                self._send(200, _chat(reply) if self.path.endswith("/chat/completions") else _anthropic(reply))

            def _send(self, code: int, obj: dict[str, Any]) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ModelServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _chat(reply: dict[str, Any]) -> dict[str, Any]:
    calls = [{"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
             for i, (n, a) in enumerate(reply.get("tool_calls", []))]
    msg = {"role": "assistant", "content": reply.get("text", "")}
    if calls:
        msg["tool_calls"] = calls
    return {"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": msg,
            "finish_reason": "tool_calls" if calls else "stop"}]}


def _anthropic(reply: dict[str, Any]) -> dict[str, Any]:
    content = [{"type": "text", "text": reply.get("text", "")}] if reply.get("text") else []
    content += [{"type": "tool_use", "id": f"toolu_{i}", "name": n, "input": a}
                for i, (n, a) in enumerate(reply.get("tool_calls", []))]
    return {"id": "m", "type": "message", "role": "assistant", "content": content,
            "stop_reason": "tool_use" if reply.get("tool_calls") else "end_turn"}


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    p = tmp_path / "secret.txt"
    p.write_text(SECRET.decode() + "\n")
    return p
