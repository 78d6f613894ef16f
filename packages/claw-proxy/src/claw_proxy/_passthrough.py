"""Forwarding to a real OpenAI/Anthropic-compatible endpoint (`passthrough:URL`).

The request goes upstream as it came (with the upstream key, never the session token); the
answer comes back as it was, streamed or not. The call is recorded with the request, the
answer and no token ids, `trainable: false`: for evaluation and SFT data.
"""

from __future__ import annotations

import json
import time
import uuid

import httpx
from starlette.responses import JSONResponse, StreamingResponse

from claw_proxy import api_anthropic, api_chat
from claw_proxy.errors import EngineError
from claw_proxy.messages import sampling_from
from claw_proxy.records import Call, sampling_record

_PATHS = {
    "openai.chat": "/v1/chat/completions",
    "openai.responses": "/v1/responses",
    "anthropic.messages": "/v1/messages",
}


def _finish(api, answer: dict | None) -> str:
    if answer is None:
        return "stop"
    try:
        if api is api_anthropic:
            return {"tool_use": "tool_calls", "max_tokens": "length"}.get(
                answer["stop_reason"], "stop"
            )
        if api is api_chat:
            return {"tool_calls": "tool_calls", "length": "length"}.get(
                answer["choices"][0]["finish_reason"], "stop"
            )
    except (KeyError, IndexError, TypeError):
        pass
    return "stop"


def _sampling(body: dict) -> dict:
    """What the request asked the upstream for (the proxy forwards it unchanged, whatever
    `--sampling` says: `forced` is false); settings it did not send are recorded at the APIs'
    documented defaults (temperature 1, top_p 1, no top_k). The upstream's own logprobs are not
    recorded (passthrough calls carry no ids)."""
    s = sampling_from(body, (), None)  # the same checks as a request to a proxy engine
    return sampling_record(
        1.0 if s.temperature is None else s.temperature,
        1.0 if s.top_p is None else s.top_p,
        s.top_k or 0,
        False,
        seed=s.seed,
    )


def _record(proxy, api, engine, body, session, state, seq, started, response: dict) -> None:
    call = Call(
        call_id=f"call-{uuid.uuid4().hex}",
        session=session,
        seq=seq,
        api=api.NAME,
        model=str(body.get("model", "")),
        policy=dict(engine.policy),
        engine=engine.spec,
        trainable=False,
        prompt_ids=[],
        completion_ids=[],
        completion_logprobs=[],
        prefix={},
        finish_reason=_finish(api, response),
        sampling=_sampling(body),
        usage={},
        started_at=started,
        ended_at=time.time(),
        tags=dict(state.tags),
        request=body,
        response=response,
    )
    if proxy.writer:
        proxy.writer.write(call)
    proxy.stats["calls_recorded"] += 1
    state.calls += 1


async def forward(proxy, api, engine, request, body: dict, session: str, state):
    started = time.time()
    _sampling(body)  # a bad temperature / top_p / top_k is refused before going upstream
    seq, state.seq = state.seq, state.seq + 1
    path = _PATHS[api.NAME]
    headers = engine.headers(api.NAME, request.headers)
    if not body.get("stream"):
        try:
            r = await engine.client.post(path, json=body, headers=headers)
        except httpx.HTTPError as e:
            raise EngineError(f"upstream {engine.url} failed: {e}") from e
        try:
            answer = r.json()
        except ValueError:
            raise EngineError(
                f"upstream {engine.url} answered {r.status_code} with non-JSON"
            ) from None
        if r.status_code < 400:
            _record(proxy, api, engine, body, session, state, seq, started, answer)
        return JSONResponse(answer, status_code=r.status_code)

    req = engine.client.build_request("POST", path, json=body, headers=headers)
    try:
        upstream = await engine.client.send(req, stream=True)
    except httpx.HTTPError as e:
        raise EngineError(f"upstream {engine.url} failed: {e}") from e
    if upstream.status_code >= 400:
        data = await upstream.aread()
        await upstream.aclose()
        return JSONResponse(json.loads(data or b"{}"), status_code=upstream.status_code)

    async def pipe():
        sse, held = [], None
        try:
            async for chunk in upstream.aiter_raw():
                if held is not None:
                    yield held
                held = chunk
                sse.append(chunk)
            # the record is written before the last bytes of the answer go out
            _record(
                proxy,
                api,
                engine,
                body,
                session,
                state,
                seq,
                started,
                {"sse": b"".join(sse).decode("utf-8", "replace")},
            )
            if held is not None:
                yield held
        finally:
            await upstream.aclose()

    return StreamingResponse(pipe(), media_type="text/event-stream")
