"""Servers the harness tests run: claw-proxy (a subprocess), a counting tap in front of it, vLLM.

The tap is a small HTTP reverse proxy in a thread of the test process. Every request a
harness makes goes through it, so the tests know how many requests there were (method, path,
status) independently of what claw-proxy recorded.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the venv holding the claw CLIs
TINY = ROOT / "tests" / "fixtures" / "tiny-qwen3"
HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(
    url: str, proc: subprocess.Popen | None, timeout_s: float, log: Path | None = None
) -> float:
    """Poll `url` until it answers (any status); seconds waited. Fails early if `proc` died."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            raise RuntimeError(
                f"{url}: the server exited with {proc.returncode} before answering\n{tail}"
            )
        try:
            httpx.get(url, timeout=2.0)
            return time.monotonic() - t0
        except httpx.TransportError:
            time.sleep(0.3)
    raise RuntimeError(f"{url}: no answer within {timeout_s:.0f} s")


def stop(proc: subprocess.Popen) -> None:
    """Terminate a server we started, then kill it if it lingers."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def claw_proxy(engine: str, workdir: Path, *, tokenizer: Path = TINY, extra: tuple[str, ...] = ()):
    """Run `claw-proxy serve` on a free port; yields (base_url, secret_file, calls_file)."""
    secret = workdir / "secret.txt"
    secret.write_text("harness-conformance-secret-" + os.urandom(8).hex() + "\n")
    calls = workdir / "calls.jsonl"
    port = free_port()
    log = workdir / "proxy.log"
    argv = [
        str(BIN / "claw-proxy"),
        "serve",
        "--engine",
        engine,
        "--tokenizer",
        str(tokenizer),
        "--secret-file",
        str(secret),
        "--record",
        str(calls),
        "--port",
        str(port),
        # re-render every prompt so the drift study covers whole harness prompts (~25k tokens)
        "--drift-check",
        "full",
        "--drift-check-tokens",
        "200000",
        "--log-level",
        "info",
        *extra,
    ]
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=workdir)
    try:
        wait_http(f"http://127.0.0.1:{port}/v1/models", proc, 120, log)
        yield f"http://127.0.0.1:{port}", secret, calls
    finally:
        stop(proc)


class Tap:
    """A reverse proxy that forwards everything to `upstream` and logs each request."""

    def __init__(self, upstream: str) -> None:
        import uvicorn

        self.upstream = upstream.rstrip("/")
        self.requests: list[dict] = []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="off",
            ws="none",
            interface="asgi3",
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Tap:
        self.thread.start()
        t0 = time.monotonic()
        while not self.server.started:
            if time.monotonic() - t0 > 30 or not self.thread.is_alive():
                raise RuntimeError("the tap did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    async def app(self, scope, receive, send) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        path = scope["path"] + (
            ("?" + scope["query_string"].decode()) if scope["query_string"] else ""
        )
        entry = {
            "method": scope["method"],
            "path": path,
            "status": None,
            "bytes": 0,
            "t": time.time(),
        }
        self.requests.append(entry)
        headers = [
            (k.decode(), v.decode()) for k, v in scope["headers"] if k.decode().lower() not in HOP
        ]
        async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
            try:
                req = client.build_request(
                    scope["method"], self.upstream + path, headers=headers, content=body
                )
                r = await client.send(req, stream=True)
            except httpx.HTTPError as e:
                entry["status"] = 502
                msg = f"tap: upstream failed: {e}".encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 502,
                        "headers": [
                            (b"content-type", b"text/plain"),
                            (b"content-length", str(len(msg)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": msg})
                return
            entry["status"] = r.status_code
            entry["content_type"] = r.headers.get("content-type", "")
            out_headers = [
                (k.encode(), v.encode()) for k, v in r.headers.items() if k.lower() not in HOP
            ]
            await send(
                {"type": "http.response.start", "status": r.status_code, "headers": out_headers}
            )
            try:
                async for chunk in r.aiter_raw():
                    entry["bytes"] += len(chunk)
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            finally:
                await r.aclose()
            await send({"type": "http.response.body", "body": b""})

    def api_requests(self) -> list[dict]:
        """The model-API requests (POST to /v1/...), in arrival order."""
        return [r for r in self.requests if r["method"] == "POST" and r["path"].startswith("/v1/")]
