"""OpenAI Chat Completions (`POST /v1/chat/completions`): request parsing, answers, SSE chunks."""

from __future__ import annotations

import json
import time

from claw_proxy._logprobs import check_top_logprobs
from claw_proxy._sse import sse, text_of
from claw_proxy._thinking import from_chat
from claw_proxy.errors import RequestError
from claw_proxy.messages import (
    Answer,
    ChatRequest,
    Message,
    ReasoningDelta,
    TextDelta,
    TokenLogprobs,
    ToolCall,
    ToolCallEvent,
    check_type,
    optional,
    parse_arguments,
    require,
    sampling_from,
)

NAME = "openai.chat"
CALL_ID_PREFIX = "call_"
_ROLES = {"system", "developer", "user", "assistant", "tool"}


def parse_tools(raw, path: str = "tools") -> tuple[dict, ...]:
    tools = []
    for i, t in enumerate(check_type(raw, list, path)):
        where = f"{path}[{i}]"
        check_type(t, dict, where)
        if t.get("type", "function") != "function":
            raise RequestError(
                f"tool type {t.get('type')!r} is not supported (only 'function')", f"{where}.type"
            )
        fn = require(t, "function", dict, f"{where}.")
        name = require(fn, "name", str, f"{where}.function.")
        spec = {"name": name}
        if fn.get("description") is not None:
            spec["description"] = check_type(
                fn["description"], str, f"{where}.function.description"
            )
        spec["parameters"] = optional(fn, "parameters", dict, f"{where}.function.") or {
            "type": "object",
            "properties": {},
        }
        tools.append({"type": "function", "function": spec})
    return tuple(tools)


def _message(m, where: str) -> tuple[Message, ...]:
    check_type(m, dict, where)
    role = require(m, "role", str, f"{where}.")
    if role not in _ROLES:
        raise RequestError(
            f"unknown role {role!r} (expected one of {sorted(_ROLES)})", f"{where}.role"
        )
    content = text_of(m.get("content"), f"{where}.content")
    if role in ("system", "developer"):
        return (Message(role="system", content=content),)
    if role == "user":
        return (Message(role="user", content=content),)
    if role == "tool":
        call_id = require(m, "tool_call_id", str, f"{where}.")
        return (Message(role="tool", content=content, tool_call_id=call_id),)
    calls = []
    for k, c in enumerate(optional(m, "tool_calls", list, f"{where}.") or []):
        cw = f"{where}.tool_calls[{k}]"
        check_type(c, dict, cw)
        fn = require(c, "function", dict, f"{cw}.")
        calls.append(
            ToolCall(
                id=c.get("id") or "",
                name=require(fn, "name", str, f"{cw}.function."),
                arguments=parse_arguments(fn.get("arguments"), f"{cw}.function.arguments"),
            )
        )
    return (Message(role="assistant", content=content, tool_calls=tuple(calls)),)


def parse(body: dict, reuse=()) -> ChatRequest:
    """The request as a ChatRequest. `reuse[i]`, when not None, is what `messages[i]` parsed
    to before (the caller knows the element is unchanged): it is taken as is."""
    model = require(body, "model", str)
    raw = require(body, "messages", list)
    if body.get("n") not in (None, 1):
        raise RequestError("only n=1 is supported", "n")
    groups = tuple(
        reuse[i] if i < len(reuse) and reuse[i] is not None else _message(m, f"messages[{i}]")
        for i, m in enumerate(raw)
    )
    msgs = [msg for g in groups for msg in g]
    opts = optional(body, "stream_options", dict) or {}
    logprobs = bool(optional(body, "logprobs", bool))
    check_top_logprobs(body)
    return ChatRequest(
        api=NAME,
        model=model,
        messages=tuple(msgs),
        tools=parse_tools(body["tools"])
        if body.get("tools") and body.get("tool_choice") != "none"
        else (),
        sampling=sampling_from(body, ("max_completion_tokens", "max_tokens"), "stop"),
        stream=bool(optional(body, "stream", bool)),
        include_usage=bool(opts.get("include_usage")),
        tool_choice=body.get("tool_choice"),
        body=body,
        logprobs=logprobs,
        message_groups=groups,
        thinking=from_chat(body),
    )


def _tool_call_json(call: ToolCall, index: int | None = None, arguments: str | None = None) -> dict:
    d: dict = {
        "id": call.id,
        "type": "function",
        "function": {
            "name": call.name,
            "arguments": arguments if arguments is not None else json.dumps(call.arguments),
        },
    }
    if index is not None:
        d = {"index": index, **d}
    return d


def _finish(answer: Answer) -> str:
    return (
        answer.finish_reason if answer.finish_reason in ("stop", "length", "tool_calls") else "stop"
    )


def _usage(answer: Answer) -> dict:
    return {
        "prompt_tokens": answer.prompt_tokens,
        "completion_tokens": answer.completion_tokens,
        "total_tokens": answer.prompt_tokens + answer.completion_tokens,
        "completion_tokens_details": {"reasoning_tokens": answer.reasoning_tokens},
    }


def _logprobs(entries) -> dict | None:
    return None if entries is None else {"content": list(entries), "refusal": None}


def response(answer: Answer, *, id: str, model: str, created: int | None = None) -> dict:
    message: dict = {
        "role": "assistant",
        "content": answer.text if answer.text or not answer.tool_calls else None,
    }
    if answer.reasoning:
        message["reasoning_content"] = answer.reasoning
    if answer.tool_calls:
        message["tool_calls"] = [_tool_call_json(c) for c in answer.tool_calls]
    return {
        "id": id,
        "object": "chat.completion",
        "created": created or int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": _logprobs(answer.logprobs),
                "finish_reason": _finish(answer),
            }
        ],
        "usage": _usage(answer),
    }


class Stream:
    """Chat-completion chunks: a role chunk, deltas, a finish chunk, a usage chunk, [DONE].

    When the request asked for logprobs, each chunk carries the entries of the tokens sampled
    since the previous chunk (tokens whose text is still held back go with a later chunk)."""

    def __init__(self, *, id: str, model: str, include_usage: bool) -> None:
        self.id, self.model, self.include_usage = id, model, include_usage
        self.created = int(time.time())
        self._tools = 0
        self._pending: list[dict] = []  # logprob entries not yet sent

    def _chunk(self, delta: dict, finish: str | None = None) -> bytes:
        logprobs = _logprobs(self._pending) if self._pending else None
        self._pending = []
        return sse(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
                ],
            }
        )

    def start(self) -> list[bytes]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def event(self, ev) -> list[bytes]:
        if isinstance(ev, TokenLogprobs):
            self._pending.extend(ev.entries)
            return []
        if isinstance(ev, TextDelta):
            return [self._chunk({"content": ev.text})]
        if isinstance(ev, ReasoningDelta):
            return [self._chunk({"reasoning_content": ev.text})]
        if isinstance(ev, ToolCallEvent):
            self._tools += 1
            return [
                self._chunk(
                    {"tool_calls": [_tool_call_json(ev.call, self._tools - 1, ev.arguments_json)]}
                )
            ]
        return []

    def finish(self, answer: Answer) -> list[bytes]:
        out = [self._chunk({}, _finish(answer))]
        if self.include_usage:
            out.append(
                sse(
                    {
                        "id": self.id,
                        "object": "chat.completion.chunk",
                        "created": self.created,
                        "model": self.model,
                        "choices": [],
                        "usage": _usage(answer),
                    }
                )
            )
        out.append(sse("[DONE]"))
        return out

    def error(self, kind: str, message: str) -> list[bytes]:
        return [
            sse({"error": {"message": message, "type": kind, "param": None, "code": None}}),
            sse("[DONE]"),
        ]


def error_body(kind: str, message: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}
