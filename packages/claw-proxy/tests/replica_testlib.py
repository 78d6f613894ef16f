"""A fake vLLM server on a real loopback port, for engine-replica tests and bench/.

`FakeVLLM` answers vLLM's routes the proxy uses (``/v1/completions`` streamed with token ids and
logprobs, ``/v1/models``, ``/server_info``, ``/health``, the weight-reload routes, ``/metrics``).
Its "model" continues one fixed answer: the completion of a prompt is the part of `answer` not
already at the prompt's end, so a call continued elsewhere after k tokens still yields `answer`.
It keeps a block prefix cache like vLLM's (16-token blocks chained by hash, the request's
``cache_salt`` in the first block) and counts ``vllm:prefix_cache_queries`` / ``_hits`` in tokens.
Optional costs model an engine's capacity: `slots` sequences at once, `token_s` per sampled
token, `prefill_s` per prompt token not in the cache. `die_after_tokens` makes it die mid-answer:
the stream breaks, ``/health`` answers 503 and the server stops.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

BLOCK = 16


class FakeVLLM:
    """A fake vLLM OpenAI server in a background thread (see the module docstring)."""

    def __init__(
        self,
        answer: list[int],
        *,
        slots: int | None = None,
        token_s: float = 0.0,
        prefill_s: float = 0.0,
        die_after_tokens: int | None = None,
        fail_reload: bool = False,
    ) -> None:
        self.answer = list(answer)
        self.slots, self.token_s, self.prefill_s = slots, token_s, prefill_s
        self.die_after_tokens = die_after_tokens
        self.fail_reload = fail_reload
        self.dead = False
        self.completions: list[dict] = []  # request bodies
        self.admin: list[tuple[str, dict | None]] = []
        self.cache: set[int] = set()
        self.queries = self.hits = 0
        self.weights, self.version = "base", "0"
        self._sem: asyncio.Semaphore | None = None
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        cfg = uvicorn.Config(self._app(), log_level="critical", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(cfg)
        self._thread: threading.Thread | None = None

    # --- the model -------------------------------------------------------------------------

    def continuation(self, prompt: list[int]) -> list[int]:
        for j in range(min(len(prompt), len(self.answer)), 0, -1):
            if prompt[-j:] == self.answer[:j]:
                return self.answer[j:]
        return self.answer

    def _cached_tokens(self, prompt: list[int], salt: str | None) -> int:
        """Tokens of `prompt` found in the cache (whole leading blocks); adds its blocks."""
        h, hit, missed = hash(("salt", salt)), 0, False
        for k in range(len(prompt) // BLOCK):
            h = hash((h, tuple(prompt[k * BLOCK : (k + 1) * BLOCK])))
            if not missed and h in self.cache:
                hit += BLOCK
            else:
                missed = True
                self.cache.add(h)
        self.queries += len(prompt)
        self.hits += hit
        return hit

    # --- the server -----------------------------------------------------------------------------

    def _app(self) -> Starlette:
        async def models(request: Request) -> Response:
            return JSONResponse({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

        async def server_info(request: Request) -> Response:
            return JSONResponse(
                {"vllm_config": {"model_config": {"logprobs_mode": "raw_logprobs"}}}
            )

        async def health(request: Request) -> Response:
            return Response(status_code=503 if self.dead else 200)

        async def metrics(request: Request) -> Response:
            return PlainTextResponse(
                f'vllm:prefix_cache_queries_total{{model_name="tiny"}} {float(self.queries)}\n'
                f'vllm:prefix_cache_hits_total{{model_name="tiny"}} {float(self.hits)}\n'
            )

        async def completions(request: Request) -> Response:
            if self.dead:
                return JSONResponse({"error": "engine dead"}, status_code=500)
            body = await request.json()
            self.completions.append(body)
            if self._sem is None and self.slots:
                self._sem = asyncio.Semaphore(self.slots)
            prompt = body["prompt"]
            ids = self.continuation(prompt)[: body["max_tokens"]]

            async def sse():
                if self._sem is not None:
                    await self._sem.acquire()
                try:
                    uncached = len(prompt) - self._cached_tokens(prompt, body.get("cache_salt"))
                    if self.prefill_s:
                        await asyncio.sleep(self.prefill_s * uncached)
                    for k, i in enumerate(ids):
                        if self.die_after_tokens is not None and k == self.die_after_tokens:
                            self.die()
                            raise ConnectionAbortedError("fake vLLM died mid-answer")
                        if self.token_s:
                            await asyncio.sleep(self.token_s)
                        last = k == len(ids) - 1
                        choice = {
                            "index": 0,
                            "text": "x",
                            "token_ids": [i],
                            "logprobs": {"token_logprobs": [-0.25]},
                            "finish_reason": ("stop" if i == self.answer[-1] else "length")
                            if last
                            else None,
                        }
                        yield f"data: {json.dumps({'choices': [choice]})}\n\n"
                    yield "data: [DONE]\n\n"
                finally:
                    if self._sem is not None:
                        self._sem.release()

            return StreamingResponse(sse(), media_type="text/event-stream")

        async def admin(request: Request) -> Response:
            raw = await request.body()
            body = json.loads(raw) if raw else None
            self.admin.append((request.url.path, body))
            if request.url.path == "/collective_rpc":
                if self.fail_reload:
                    return JSONResponse({"error": "cannot load"}, status_code=500)
                self.weights = body["kwargs"]["weights_path"]
            elif request.url.path == "/reset_prefix_cache":
                self.cache.clear()
            elif request.url.path == "/update_weight_version":
                self.version = body["new_version"]
            return JSONResponse({})

        reload_routes = [
            Route(p, admin, methods=["POST"])
            for p in (
                "/pause",
                "/collective_rpc",
                "/reset_prefix_cache",
                "/update_weight_version",
                "/resume",
            )
        ]
        return Starlette(
            routes=[
                Route("/v1/models", models),
                Route("/server_info", server_info),
                Route("/health", health),
                Route("/metrics", metrics),
                Route("/v1/completions", completions, methods=["POST"]),
                *reload_routes,
            ]
        )

    def start(self) -> FakeVLLM:
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the fake vLLM did not start")
            time.sleep(0.01)
        return self

    def die(self) -> None:
        """Stop serving: /health answers 503 until the server is gone, then nothing answers."""
        self.dead = True
        self._server.should_exit = True

    def stop(self) -> None:
        self.die()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self._sock.close()

    def __enter__(self) -> FakeVLLM:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def scrape(url: str) -> dict[str, float]:
    """A vLLM ``/metrics`` page's prefix-cache counters: {"queries": n, "hits": n}."""
    import httpx

    out = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        for key in ("queries", "hits"):
            if line.startswith(f"vllm:prefix_cache_{key}_total"):
                out[key] = float(line.rsplit(" ", 1)[1])
    return out
