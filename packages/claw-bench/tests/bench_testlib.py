"""Test helpers: a test-only job runner (plain subprocesses) and a scripted model server.

The runner is deliberately small: it executes one claw.job/v1 dict in a temp directory the way a
sandbox's process backend would (workspace files, setup, command with env, hidden verify files,
verifier, reward file) and returns a claw.run/v1 dict. The real sandbox is claw-sandbox's job."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from claw_bench.reward import parse_reward
from claw_bench.token import verify_token

SECRET = b"test-secret"


def _argv(cmd: str | list[str]) -> list[str]:
    return ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)


def _write(path: Path, content: str | dict[str, str]) -> None:
    """A job file entry: text, or {"content_b64": ...} for exact bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        content.encode() if isinstance(content, str) else base64.b64decode(content["content_b64"])
    )


def _harbor_argv(
    job: dict[str, Any], ws: Path, verifying: bool
) -> Callable[[str | list[str]], list[str]]:
    """For a ``profile: "harbor"`` job: run a step in bwrap with the host's root read-only, the
    workspace at ``workdir`` (the cwd), the mounts at their targets (verify mounts only for the
    verify step) and uid 0 in a user namespace: the places Harbor task scripts use."""
    bwrap = shutil.which("bwrap")
    if not bwrap:
        pytest.skip(
            "bwrap is needed to run a Harbor-profile job in tests (apt-get install bubblewrap)"
        )
    mounts = [*job.get("mounts", []), *(job.get("verify") or {}).get("mounts", [])]
    n_job = len(job.get("mounts", []))
    places = [(str(ws), job["workdir"])] + [
        (str(ws.parent / f"{ws.name}.mnt{i}"), m["target"])
        for i, m in enumerate(mounts)
        if i < n_job or verifying
    ]
    tops = {p.split("/")[1] for _, p in places}
    args = [
        bwrap,
        "--die-with-parent",
        "--unshare-user",
        "--uid",
        "0",
        "--gid",
        "0",
        "--unshare-pid",
        "--tmpfs",
        "/",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
    ]
    for name in sorted(os.listdir("/")):
        path = f"/{name}"
        if name in ("proc", "dev", "tmp") or name in tops:
            continue
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for src, dest in places:
        args += ["--bind", src, dest]
    args += ["--chdir", job["workdir"], "--"]
    return lambda cmd: [*args, *_argv(cmd)]


def _host_path(job: dict[str, Any], ws: Path, path: str) -> Path:
    """The host file of a job path (relative: the workspace; absolute: workdir or a mount)."""
    if not path.startswith("/"):
        return ws / path
    if path.startswith(job["workdir"].rstrip("/") + "/"):
        return ws / path[len(job["workdir"]) :].lstrip("/")
    mounts = [*job.get("mounts", []), *(job.get("verify") or {}).get("mounts", [])]
    for i, m in enumerate(mounts):
        if path.startswith(m["target"] + "/"):
            return ws.parent / f"{ws.name}.mnt{i}" / path[len(m["target"]) :].lstrip("/")
    raise AssertionError(f"{path} is in no place of job {job['job_id']}")


def run_job(job: dict[str, Any], root: Path, *, collect: bool = False) -> dict[str, Any]:
    """Execute a claw.job/v1 dict with plain subprocesses under ``root``; a claw.run/v1 dict.

    A ``profile: "harbor"`` job runs each step in bwrap (see ``_harbor_argv``), skipping without it.
    Its ``collect`` files come back for Harbor jobs, and for any job with ``collect=True``."""
    started = time.time()
    ws = root / job["job_id"]
    ws.mkdir(parents=True)
    for rel, content in job.get("workspace", {}).get("files", {}).items():
        _write(ws / rel, content)
    harbor = job.get("profile") == "harbor"
    argv = _harbor_argv(job, ws, False) if harbor else _argv
    if harbor:
        mounts = [*job.get("mounts", []), *(job.get("verify") or {}).get("mounts", [])]
        for i, m in enumerate(mounts):
            (root / f"{ws.name}.mnt{i}").mkdir()
            for rel, content in (
                m.get("files", {}) if i < len(job.get("mounts", [])) else {}
            ).items():
                _write(root / f"{ws.name}.mnt{i}" / rel, content)
    # no image runs here: the image's ENV (image_env) is set, under the job's env
    env = {**os.environ, **job.get("image_env", {}), **job.get("env", {})}
    for cmd in job.get("setup", []):
        subprocess.run(argv(cmd), cwd=ws, env=env, check=True, capture_output=True)
    status, exit_code, out, err = "ok", None, "", ""
    try:
        p = subprocess.run(
            argv(job["command"]),
            cwd=ws,
            env=env,
            capture_output=True,
            text=True,
            timeout=job.get("timeout_s", 600),
        )
        exit_code, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        status = "timeout"
    verify = None
    if job.get("verify"):
        v = job["verify"]
        for rel, content in v.get("files", {}).items():
            _write(ws / rel, content)
        n_job = len(job.get("mounts", []))
        for i, m in enumerate(v.get("mounts", [])):
            for rel, content in m.get("files", {}).items():
                _write(root / f"{ws.name}.mnt{n_job + i}" / rel, content)
        vargv = _harbor_argv(job, ws, True) if harbor else _argv
        p = subprocess.run(
            vargv(v["command"]),
            cwd=ws,
            capture_output=True,
            text=True,
            timeout=v.get("timeout_s", 60),
        )
        reward, details = None, {}
        rf = (
            _host_path(job, ws, v["reward_file"])
            if harbor and v.get("reward_file")
            else ws / v.get("reward_file", "")
        )
        if v.get("reward_file") and rf.is_file():
            reward, details = parse_reward(rf.read_text())
        verify = {
            "exit_code": p.returncode,
            "passed": p.returncode == 0,
            "reward": reward if reward is not None else float(p.returncode == 0),
            "details": details,
            "output": p.stdout[-2000:],
            "timed_out": False,
        }
    return {
        "schema": "claw.run/v1",
        "job_id": job["job_id"],
        "status": status,
        "exit_code": exit_code,
        "verify": verify,
        "stdout_tail": out[-2000:],
        "stderr_tail": err[-2000:],
        "backend": "test-process",
        "started_at": started,
        "ended_at": time.time(),
        "duration_s": time.time() - started,
        "meta": job.get("meta", {}),
        "collected": _collect(job, ws) if harbor or collect else {},
    }


def check_task(task: Any, mode: str) -> dict[str, Any]:
    """What claw_bench.check_task reports, with the job run by this test runner instead of
    claw-sandbox (so the task tests run where claw-sandbox is not installed)."""
    import tempfile

    from claw_bench import load_harness, plan_jobs, score_run

    (job,) = plan_jobs(
        [task],
        [load_harness({"untouched": "nothing", "solution": "oracle"}[mode])],
        samples=1,
        network="none",
        run_id="check",
    )
    with tempfile.TemporaryDirectory(prefix="claw-bench-test-check-") as tmp:
        run = run_job(job, Path(tmp))
    out, verify = score_run(run), run["verify"] or {}
    r = {
        "task": task.id,
        "mode": mode,
        "passed": bool(out["passed"]),
        "reward": out["reward"],
        "scores": verify.get("details") or {},
        "verify_exit_code": verify.get("exit_code"),
        "output": verify.get("output", ""),
    }
    if mode == "solution":
        r["solution_exit_code"] = run["exit_code"]
        r["solution_output"] = run["stdout_tail"] + run["stderr_tail"]
    return r


def _collect(job: dict[str, Any], ws: Path) -> dict[str, str]:
    """A Harbor-profile job's collected files: exact paths and ``DIR/**`` globs."""
    out = {}
    for g in job.get("collect", []):
        if g.endswith("/**"):
            d = _host_path(job, ws, g[:-3] + "/x").parent
            out.update(
                {
                    f"{g[:-3]}/{p.relative_to(d).as_posix()}": p.read_text(errors="replace")
                    for p in sorted(d.rglob("*"))
                    if p.is_file()
                }
            )
        elif _host_path(job, ws, g).is_file():
            out[g] = _host_path(job, ws, g).read_text(errors="replace")
    return out


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
                key = self.headers.get("x-api-key") or self.headers.get(
                    "authorization", ""
                ).removeprefix("Bearer ")
                found = verify_token(key, SECRET)
                if found is None:
                    self._send(401, {"error": {"message": "bad token"}})
                    return
                session, tags = found
                turn = server.turns.get(session, 0)
                server.turns[session] = turn + 1
                server.requests.append(
                    {"path": self.path, "session": session, "tags": tags, "body": body}
                )
                reply = server.policy(tags, turn, body)
                self._send(
                    200,
                    _chat(reply) if self.path.endswith("/chat/completions") else _anthropic(reply),
                )

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
    calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
        for i, (n, a) in enumerate(reply.get("tool_calls", []))
    ]
    msg = {"role": "assistant", "content": reply.get("text", "")}
    if calls:
        msg["tool_calls"] = calls
    return {
        "id": "x",
        "object": "chat.completion",
        "choices": [
            {"index": 0, "message": msg, "finish_reason": "tool_calls" if calls else "stop"}
        ],
    }


def _anthropic(reply: dict[str, Any]) -> dict[str, Any]:
    content = [{"type": "text", "text": reply.get("text", "")}] if reply.get("text") else []
    content += [
        {"type": "tool_use", "id": f"toolu_{i}", "name": n, "input": a}
        for i, (n, a) in enumerate(reply.get("tool_calls", []))
    ]
    return {
        "id": "m",
        "type": "message",
        "role": "assistant",
        "content": content,
        "stop_reason": "tool_use" if reply.get("tool_calls") else "end_turn",
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def proxy_serve(
    tmp_path: Path, script: Path, secret_file: Path, tokenizer: Path, *extra: str
) -> Iterator[tuple[str, Path]]:
    """Run the real `claw-proxy serve` CLI with a scripted engine (and ``extra`` options);
    yield (url, calls file)."""
    port = _free_port()
    log = (tmp_path / "proxy.log").open("w")
    args = ["--engine", f"scripted:{script}", "--tokenizer", str(tokenizer), "--port", str(port)]
    args += ["--secret-file", str(secret_file), "--record", str(tmp_path / "calls.jsonl"), *extra]
    proc = subprocess.Popen(["claw-proxy", "serve", *args], stdout=subprocess.DEVNULL, stderr=log)
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
