"""Forwarding to a real OpenAI/Anthropic-compatible endpoint (`passthrough:URL`).

The request goes upstream as it came (with the upstream key, never the session token); the
answer comes back as it was, streamed or not. The call is recorded with the request, the
answer and no token ids, `trainable: false`: for evaluation.

With ``student_ids`` (``claw-proxy serve --student-ids``; the student's HF directory given as
``--tokenizer``) the teacher's call is recorded in the student's tokenization instead, so it
trains the student (SFT): ``prompt_ids`` are the request as the student's chat template renders
it (with the same per-session prefix reuse as the proxy's own engines), ``completion_ids`` the
teacher's answer (text and tool calls) as that template writes the turn, eos included (left out
when the teacher stopped at its length limit). Such calls carry ``trainable: true`` and
``teacher: "passthrough"``; their ``completion_logprobs`` are 0.0 placeholders, not the
student's (nor the teacher's: its tokens are not the student's). An answer the proxy cannot read
(a shape it does not know) is recorded as without ``student_ids``.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from starlette.responses import Response

from claw_proxy import api_anthropic, api_chat, api_responses
from claw_proxy.errors import EngineError, RequestError
from claw_proxy.messages import Answer, ToolCall, parse_arguments, sampling_from
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
        ignore_eos=s.ignore_eos,
    )


def _calls(raw: list) -> tuple[ToolCall, ...]:
    for c in raw:
        if not isinstance(c.get("name"), str) or not isinstance(c.get("arguments"), dict):
            raise TypeError(f"a tool call without a name or an arguments object: {c!r:.200}")
    return tuple(
        ToolCall(id=str(c.get("id") or f"call_{i}"), name=c["name"], arguments=c["arguments"])
        for i, c in enumerate(raw)
    )


def _sse_events(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
            event = json.loads(line[5:])
            if isinstance(event, dict):
                out.append(event)
    return out


def _sse_answer(api, sse: str) -> dict:
    """A streamed upstream answer put back together in the API's non-streamed shape (the parts
    `answer_parts` reads)."""
    events = _sse_events(sse)
    if api is api_responses:
        return [e["response"] for e in events if e.get("type") == "response.completed"][-1]
    if api is api_chat:
        pieces: list[str] = []
        calls: dict = {}
        finish = "stop"
        for e in events:
            for ch in e.get("choices") or []:
                delta = ch.get("delta") or {}
                pieces.append(delta.get("content") or "")
                for tc in delta.get("tool_calls") or []:
                    c = calls.setdefault(tc.get("index", 0), {"args": []})
                    c["id"] = tc.get("id") or c.get("id")
                    fn = tc.get("function") or {}
                    c["name"] = fn.get("name") or c.get("name")
                    c["args"].append(fn.get("arguments") or "")
                finish = ch.get("finish_reason") or finish
        message = {
            "content": "".join(pieces),
            "tool_calls": [
                {
                    "id": c.get("id"),
                    "function": {"name": c.get("name"), "arguments": "".join(c["args"])},
                }
                for _, c in sorted(calls.items())
            ],
        }
        return {"choices": [{"message": message, "finish_reason": finish}]}
    blocks: dict = {}
    stop = "end_turn"
    for e in events:
        if e.get("type") == "content_block_start":
            blocks[e["index"]] = {**e["content_block"], "_json": []}
        elif e.get("type") == "content_block_delta":
            b, d = blocks[e["index"]], e["delta"]
            if d.get("type") == "text_delta":
                b["text"] = b.get("text", "") + d["text"]
            elif d.get("type") == "input_json_delta":
                b["_json"].append(d["partial_json"])
        elif e.get("type") == "message_delta":
            stop = (e.get("delta") or {}).get("stop_reason") or stop
    content = []
    for _, b in sorted(blocks.items()):
        if b.get("type") == "tool_use" and b["_json"]:
            # a call without arguments streams one delta of "" (the API's own shape): input {}
            b["input"] = json.loads("".join(b["_json"]) or "{}")
        content.append(b)
    return {"content": content, "stop_reason": stop}


def answer_parts(api, response: dict) -> tuple[str, tuple[ToolCall, ...], str]:
    """(text, tool calls, finish reason) of an upstream answer, non-streamed or ``{"sse": ...}``.
    Reasoning / thinking is left out (templates drop it from history). KeyError, TypeError,
    ValueError or RequestError when the answer has a shape this reader does not know."""
    if "sse" in response:
        response = _sse_answer(api, response["sse"])
    finish = _finish(api, response)
    if api is api_chat:
        msg = response["choices"][0]["message"]
        raw = [
            {
                "id": tc.get("id"),
                "name": tc["function"]["name"],
                "arguments": parse_arguments(tc["function"].get("arguments"), "tool_calls"),
            }
            for tc in msg.get("tool_calls") or []
        ]
        return msg.get("content") or "", _calls(raw), finish
    if api is api_anthropic:
        blocks = response["content"]
        text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
        raw = [
            {"id": b.get("id"), "name": b["name"], "arguments": dict(b.get("input") or {})}
            for b in blocks
            if b.get("type") == "tool_use"
        ]
        return text, _calls(raw), finish
    text, raw = "", []
    for item in response["output"]:
        if item.get("type") == "message":
            text += "".join(
                p.get("text", "")
                for p in item.get("content") or []
                if p.get("type") == "output_text"
            )
        elif item.get("type") == "function_call":
            raw.append(
                {
                    "id": item.get("call_id"),
                    "name": item["name"],
                    "arguments": parse_arguments(item.get("arguments"), "output"),
                }
            )
    calls_ = _calls(raw)
    if response.get("status") == "incomplete":
        finish = "length"
    return text, calls_, "tool_calls" if calls_ else finish


def _student(proxy, engine, session, student, response: dict):
    """The student-tokenized fields of a teacher's call, or None when its answer is unreadable."""
    api, rendered = student
    try:
        text, calls, finish = answer_parts(api, response)
        cache = proxy.caches[engine.tokenizer_dir]
        ids = cache.renderer.render_answer(text, [(c.name, c.arguments) for c in calls])
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, RequestError) as e:
        proxy.stats["errors"] += 1
        import logging

        logging.getLogger("claw_proxy").warning(
            "passthrough: cannot read the teacher's answer (%s: %s); recorded without ids",
            type(e).__name__,
            e,
        )
        return None
    if finish == "length":
        ids = ids[:-1]  # the teacher was cut off: the student must not learn to stop there
    answer = Answer(
        text=text,
        reasoning="",
        tool_calls=calls,
        finish_reason=finish,
        prompt_tokens=len(rendered.prompt_ids),
        completion_tokens=len(ids),
    )
    return cache, rendered, answer, ids


def one_line_json(raw: bytes) -> dict[str, str] | None:
    """`CallWriter.write`'s `raw` for a request whose bytes (already parsed and checked into a
    JSON object) can go into a JSONL line as they are: UTF-8 without line breaks (around it, e.g.
    a final newline, they are left out)."""
    raw = raw.strip(b" \t\r\n")
    if raw[:1] != b"{" or b"\n" in raw or b"\r" in raw or b"\x00" in raw[:4]:
        return None
    return {"request": raw.decode("utf-8")}


def _record(
    proxy,
    api,
    engine,
    body,
    session,
    state,
    seq,
    started,
    response: dict,
    student=None,
    raw: dict[str, str] | None = None,
) -> None:
    call_id = f"call-{uuid.uuid4().hex}"
    got = _student(proxy, engine, session, student, response) if student else None
    if got is not None:
        cache, r, answer, ids = got
        call = Call(
            call_id=call_id,
            session=session,
            seq=seq,
            api=api.NAME,
            model=str(body.get("model", "")),
            policy=dict(engine.policy),
            engine=engine.spec,
            trainable=True,
            prompt_ids=r.prompt_ids,
            completion_ids=ids,
            completion_logprobs=[0.0] * len(ids),
            prefix=r.prefix_record(),
            finish_reason=answer.finish_reason,
            sampling=_sampling(body),
            usage={"prompt_tokens": len(r.prompt_ids), "completion_tokens": len(ids)},
            started_at=started,
            ended_at=time.time(),
            tags=dict(state.tags),
            request=body,
            response=response,
            extra={"teacher": "passthrough"},
        )
        where = (
            proxy.writer.write(call, prompt_ids_json=r.prompt_json, raw=raw)
            if proxy.writer
            else None
        )
        proxy.stats["calls_recorded"] += 1
        state.calls += 1
        cache.remember(session, call_id, r, answer, ids, where)
        return
    call = Call(
        call_id=call_id,
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
        proxy.writer.write(call, raw=raw)
    proxy.stats["calls_recorded"] += 1
    state.calls += 1


def _upstream_error(engine, e: EngineError) -> EngineError:
    return EngineError(f"upstream {engine.url} failed: {e}", status=e.status)


async def forward(proxy, api, engine, request, body: dict, session: str, state):
    """Send the request's bytes upstream unchanged and its answer's bytes back (non-streamed:
    as one body; streamed: each piece as it comes), recording the call. The caller has taken
    a slot of the session's in-flight limit: it is released when the answer has been sent (or
    the client has gone)."""
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            state.in_flight -= 1

    try:
        response = await _forward(proxy, api, engine, request, body, session, state, release)
    except BaseException:
        release()
        raise
    if not isinstance(response, _Piped):
        release()
    return response


async def _forward(proxy, api, engine, request, body: dict, session: str, state, release):
    started = time.time()
    _sampling(body)  # a bad temperature / top_p / top_k is refused before going upstream
    student = None
    if proxy.config.student_ids:  # render the student's prompt before paying for the teacher
        req = await proxy.offload(api.parse, body)
        await proxy.check_prompt_bound(req, engine.tokenizer_dir)
        rendered = await proxy.offload(proxy.caches[engine.tokenizer_dir].render, session, req)
        proxy.check_prompt_tokens(len(rendered.prompt_array))
        student = (api, rendered)
    seq, state.seq = state.seq, state.seq + 1
    path = _PATHS[api.NAME]
    headers = engine.headers(api.NAME, request.headers)
    raw_body = request.state.raw_body

    def record(answer: dict) -> None:
        _record(
            proxy,
            api,
            engine,
            body,
            session,
            state,
            seq,
            started,
            answer,
            student,
            one_line_json(raw_body),
        )

    upstream = await engine.open(path, raw_body, headers)
    kind = upstream.headers.get("content-type") or "application/json"
    if not body.get("stream") or upstream.status >= 400:
        try:
            data = await upstream.read()
        except EngineError as e:
            raise _upstream_error(engine, e) from e
        finally:
            await upstream.aclose()
        if upstream.status >= 400:  # the upstream's error, as it gave it
            return Response(data, status_code=upstream.status, media_type=kind)
        try:
            answer = json.loads(data)
        except ValueError:
            raise EngineError(
                f"upstream {engine.url} answered {upstream.status} with non-JSON"
            ) from None
        record(answer)
        return Response(data, status_code=upstream.status, media_type="application/json")

    async def pipe():
        sse, held = [], None
        try:
            async for chunk in upstream.iter():
                if held is not None:
                    yield held
                held = chunk
                sse.append(chunk)
            # the record is written before the last bytes of the answer go out
            record({"sse": b"".join(sse).decode("utf-8", "replace")})
            if held is not None:
                yield held
        finally:
            await upstream.aclose()

    return _Piped(pipe(), on_close=release)


class _Piped:
    """A streamed answer sent piece by piece as `chunks` yields them (an ASGI app).

    What Starlette's StreamingResponse does, without its task group and cancel scope per
    response (a tenth of a busy passthrough proxy's CPU): one small task waits for the client to
    go away and, if it goes before the answer's end, cancels the piping, so `chunks` is closed
    (and the upstream connection with it) as it would be there."""

    def __init__(self, chunks, on_close=None) -> None:
        self.chunks, self.on_close = chunks, on_close

    async def __call__(self, scope, receive, send) -> None:
        task = asyncio.current_task()
        assert task is not None
        state = {"done": False, "gone": False}

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            if not state["done"]:  # the client went away mid-answer
                state["gone"] = True
                task.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8")],
                }
            )
            async for chunk in self.chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            state["done"] = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not state["gone"]:
                raise
            task.uncancel()  # our own cancel: the client is gone, nothing is left to send
        finally:
            state["done"] = True
            watcher.cancel()
            try:
                await self.chunks.aclose()
            finally:
                if self.on_close is not None:
                    self.on_close()  # the session's in-flight slot
