"""Routes beside the model APIs: health, model list, token counting, and the admin API."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from claw_proxy import api_anthropic
from claw_proxy._jsonbody import loads, read_limited
from claw_proxy._replicas import ReplicaSet
from claw_proxy._responses import error_response
from claw_proxy.errors import ClawError, EngineError, NotFoundError, RecordError, RequestError
from claw_proxy.records import Policy
from claw_proxy.tokens import is_session_id


def _err(e: ClawError) -> JSONResponse:
    status = 400 if isinstance(e, RecordError) else getattr(e, "status", 500)
    return JSONResponse(
        {"error": {"type": getattr(e, "kind", "invalid_request_error"), "message": str(e)}},
        status_code=status,
    )


async def _json(request: Request, limit: int = 1 << 20) -> dict:
    body = loads(await read_limited(request, limit, 60.0))
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    return body


def routes(proxy) -> list[Route]:
    """The routes of `proxy` beside the model APIs."""
    r = _Routes(proxy)
    return [
        Route("/healthz", r.healthz, methods=["GET"]),
        Route("/v1/models", r.models, methods=["GET"]),
        Route("/v1/models/{model:path}", r.model, methods=["GET"]),
        Route("/v1/messages/count_tokens", r.count_tokens, methods=["POST"]),
        Route("/admin/policy", r.policy, methods=["POST"]),
        Route("/admin/rotate", r.rotate, methods=["POST"]),
        Route("/admin/sleep", r.sleep, methods=["POST"]),
        Route("/admin/wake", r.wake, methods=["POST"]),
        Route("/admin/sessions/{session}/close", r.close, methods=["POST"]),
        Route("/admin/sessions/{session}", r.session, methods=["GET", "POST"]),
        Route("/admin/stats", r.stats, methods=["GET"]),
    ]


class _Routes:
    """The endpoints, bound to one proxy. Each admin endpoint checks the admin token first and
    answers a `ClawError` as `{"error": {"type", "message"}}` with its status."""

    def __init__(self, proxy) -> None:
        self.proxy = proxy

    async def healthz(self, request: Request) -> JSONResponse:
        """`status`: ok; with replicas, degraded while one is down and down (503) when all are."""
        engine = self.proxy.policy_engine
        body = {"ok": True, "status": "ok", "policy": engine.policy, "engine": engine.spec}
        if isinstance(engine, ReplicaSet):
            body.update(engine.health())
            body["ok"] = body["status"] != "down"
        return JSONResponse(body, status_code=200 if body["ok"] else 503)

    async def models(self, request: Request) -> JSONResponse:
        config = self.proxy.config
        names = [config.policy_name] + [glob for glob, _ in config.routes]
        data = [
            {"id": n, "object": "model", "created": 0, "owned_by": "claw-proxy"}
            for n in dict.fromkeys(names)
        ]
        return JSONResponse({"object": "list", "data": data})

    async def model(self, request: Request) -> JSONResponse:
        """Any name is served (unmatched names go to the policy), so any name exists."""
        name = request.path_params["model"]
        return JSONResponse(
            {
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": "claw-proxy",
                "type": "model",
                "display_name": name,
            }
        )

    async def count_tokens(self, request: Request) -> JSONResponse:
        """Anthropic token counting: the prompt rendered in full (not a model call, not
        recorded), under the limits of a call: a slot of the session's --session-concurrency
        and --max-prompt-tokens (413, from the text alone when it proves the prompt over)."""
        proxy = self.proxy
        try:
            session, state = proxy.authenticate(request)
            proxy.take_slot(session, state)
        except ClawError as e:
            return error_response(api_anthropic, e)
        try:
            return JSONResponse({"input_tokens": await self._count(request)})
        except ClawError as e:
            return error_response(api_anthropic, e)
        finally:
            state.in_flight -= 1

    async def _count(self, request: Request) -> int:
        proxy = self.proxy
        body = await proxy._body(request)
        body.setdefault("max_tokens", 1)
        req = await proxy.offload(api_anthropic.parse, body)
        engine = proxy.route(req.model)
        if engine.tokenizer_dir is None:
            raise RequestError("token counting is not available for a passthrough model", "model")
        await proxy.check_prompt_bound(req, engine.tokenizer_dir)
        proxy.thinking(req, engine.tokenizer_dir)  # counted as the call would be rendered
        n = len(await proxy.offload(proxy.renderers[engine.tokenizer_dir].render_full, req))
        proxy.check_prompt_tokens(n)
        return n

    async def _admin(self, request: Request, answer) -> JSONResponse:
        """`answer(request)`'s body, after the admin token check; a `ClawError` as its error."""
        try:
            self.proxy._check_admin(request)
            return JSONResponse(await answer(request))
        except ClawError as e:
            return _err(e)

    async def policy(self, request: Request) -> JSONResponse:
        """POST a claw.policy/v1 body: serve it (the engine loads its weights first; with
        ``transfer``, over the learner's process group: answered once every engine serves it)."""
        return await self._admin(request, self._policy)

    async def _policy(self, request: Request) -> dict:
        # a policy with `transfer` lists every weight's name and shape: 18K for a 30B-A3B MoE
        p = Policy.from_dict(await _json(request, 64 << 20), "POST /admin/policy body")
        t0 = time.monotonic()
        engine = self.proxy.policy_engine
        if getattr(engine, "sleeping", None) is not None:  # asleep: wake with these weights
            await engine.wake(p)
            now = dict(engine.policy)
        else:
            now = await self.proxy.load_policy(p)
        return {"ok": True, "policy": now, "load_seconds": round(time.monotonic() - t0, 3)}

    async def sleep(self, request: Request) -> JSONResponse:
        """POST {"level": 1 | 2}: the policy's vLLM engines free the GPU (vLLM sleep mode) for
        a learner on the same GPU; calls wait until /admin/wake or /admin/policy wakes them."""
        return await self._admin(request, self._sleep)

    async def _sleep(self, request: Request) -> dict:
        level = (await _json(request)).get("level", 1)
        if level not in (1, 2) or isinstance(level, bool):
            raise RequestError("expected 1 (weights offloaded) or 2 (weights freed)", "level")
        engine = self.proxy.policy_engine
        if not hasattr(engine, "sleep"):
            raise EngineError(f"engine {engine.spec} cannot sleep (only vllm: engines)", status=501)
        t0 = time.monotonic()
        await engine.sleep(level)
        return {"ok": True, "sleeping": level, "sleep_seconds": round(time.monotonic() - t0, 3)}

    async def wake(self, request: Request) -> JSONResponse:
        """Wake the sleeping engines with the weights they had (level 1 only; new weights
        come with POST /admin/policy, which wakes them too)."""
        return await self._admin(request, self._wake)

    async def _wake(self, request: Request) -> dict:
        engine = self.proxy.policy_engine
        if getattr(engine, "sleeping", None) is None:
            raise EngineError("the policy's engines are not asleep: nothing to wake", status=409)
        t0 = time.monotonic()
        await engine.wake()
        return {
            "ok": True,
            "policy": dict(engine.policy),
            "wake_seconds": round(time.monotonic() - t0, 3),
        }

    async def rotate(self, request: Request) -> JSONResponse:
        """Close the open record shard: {"closed": [paths], "lines": n, "next": path}."""
        return await self._admin(request, self._rotate)

    async def _rotate(self, request: Request) -> dict:
        if self.proxy.writer is None:
            raise RequestError("this proxy records nothing (start it with --record FILE)")
        return {"ok": True, **self.proxy.writer.rotate()}

    async def close(self, request: Request) -> JSONResponse:
        """Close a session: its later calls get 401, its caches are freed."""
        return await self._admin(request, self._close)

    async def _close(self, request: Request) -> dict:
        proxy = self.proxy
        sid = request.path_params["session"]
        s = proxy.sessions.get(sid)
        if s is None:
            raise NotFoundError(f"unknown session {sid!r}")
        s.closed = True
        for cache in proxy.caches.values():
            cache.forget(sid)
        proxy.parse_memo.forget(sid)
        if isinstance(proxy.policy_engine, ReplicaSet):
            proxy.policy_engine.forget(sid)
        return {"ok": True, "session": sid, "calls": s.calls}

    async def session(self, request: Request) -> JSONResponse:
        """POST {"tags": {...}}: set (merge) a session's tags; GET: the session's state."""
        return await self._admin(request, self._session)

    async def _session(self, request: Request) -> dict:
        sid = request.path_params["session"]
        if not is_session_id(sid):
            raise RequestError("session ids are 1-128 characters of [A-Za-z0-9_-]", "session")
        s = self.proxy.sessions.get(sid) or self.proxy.new_session(sid)
        if request.method == "POST":
            tags = (await _json(request)).get("tags")
            if not isinstance(tags, dict):
                raise RequestError("expected an object", "tags")
            s.tags.update(tags)
        return {
            "session": sid,
            "tags": s.tags,
            "calls": s.calls,
            "in_flight": s.in_flight,
            "closed": s.closed,
        }

    async def stats(self, request: Request) -> JSONResponse:
        """The proxy's counters (see the README, Admin API)."""
        return await self._admin(request, self._stats)

    async def _stats(self, request: Request) -> dict:
        return _stats(self.proxy)


def _stats(proxy) -> dict:
    engines = {}
    for spec, eng in proxy.engines.items():
        d = {"policy": eng.policy, "trainable": eng.trainable}
        if hasattr(eng, "batches"):
            d.update(batches=eng.batches, batched_rows=eng.batched_rows)
        engines[spec] = d
    sessions = proxy.sessions.values()
    replicas = proxy.policy_engine if isinstance(proxy.policy_engine, ReplicaSet) else None
    return {
        **proxy.stats,
        "sessions": len(proxy.sessions),
        "open_sessions": sum(1 for s in sessions if not s.closed),
        "in_flight": sum(s.in_flight for s in sessions),
        "policy": proxy.policy_engine.policy,
        "engines": engines,
        **({"replicas": replicas.health()} if replicas is not None else {}),
        "records": proxy.writer.written if proxy.writer else 0,
        "prefix_cache": {d: c.stats() for d, c in proxy.caches.items()},
        "parse_memo": proxy.parse_memo.stats(),
    }
