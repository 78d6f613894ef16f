"""Anthropic Messages (`POST /v1/messages`): request parsing, answers, the SSE event sequence."""

from __future__ import annotations

import json

from claw_proxy._sse import sse, text_of
from claw_proxy._thinking import from_anthropic
from claw_proxy.errors import RequestError
from claw_proxy.messages import (
    Answer,
    ChatRequest,
    Message,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    check_type,
    optional,
    require,
    sampling_from,
)

NAME = "anthropic.messages"
CALL_ID_PREFIX = "toolu_"
_STOP = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens", "error": "end_turn"}


def parse_tools(raw) -> tuple[dict, ...]:
    tools = []
    for i, t in enumerate(check_type(raw, list, "tools")):
        where = f"tools[{i}]"
        check_type(t, dict, where)
        if t.get("type") not in (None, "custom"):
            continue  # server tools (web search, ...) run at Anthropic, not in the model's output
        name = require(t, "name", str, f"{where}.")
        spec = {"name": name}
        if t.get("description") is not None:
            spec["description"] = check_type(t["description"], str, f"{where}.description")
        spec["parameters"] = require(t, "input_schema", dict, f"{where}.")
        tools.append({"type": "function", "function": spec})
    return tuple(tools)


def _blocks(content, path: str) -> list:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    check_type(content, list, path)
    for k, b in enumerate(content):
        check_type(b, dict, f"{path}[{k}]")
        if not isinstance(b.get("type"), str):
            raise RequestError("a content block needs a string 'type'", f"{path}[{k}].type")
    return content


def _message(m, where: str) -> tuple[Message, ...]:
    out: list[Message] = []
    check_type(m, dict, where)
    role = require(m, "role", str, f"{where}.")
    if role not in ("user", "assistant", "system"):
        raise RequestError(
            f"unknown role {role!r} (expected user, assistant or system)", f"{where}.role"
        )
    if "content" not in m:
        raise RequestError("required field is missing", f"{where}.content")
    blocks = _blocks(m["content"], f"{where}.content")
    if role == "system":
        out.append(
            Message(role="system", content=text_of(blocks, f"{where}.content", allowed=("text",)))
        )
    elif role == "assistant":
        parts: list[str] = []
        calls = []
        for k, b in enumerate(blocks):
            bw = f"{where}.content[{k}]"
            kind = b["type"]
            if kind == "text":
                parts.append(check_type(b.get("text"), str, f"{bw}.text"))
            elif kind == "tool_use":
                calls.append(
                    ToolCall(
                        id=b.get("id") or "",
                        name=require(b, "name", str, f"{bw}."),
                        arguments=require(b, "input", dict, f"{bw}."),
                    )
                )
            elif kind in ("thinking", "redacted_thinking"):
                continue  # reasoning is not re-sent to the model (the template drops it too)
            else:
                raise RequestError(f"unsupported assistant content block {kind!r}", bw)
        out.append(Message(role="assistant", content="".join(parts), tool_calls=tuple(calls)))
    else:
        texts: list[str] = []
        for k, b in enumerate(blocks):
            bw = f"{where}.content[{k}]"
            if b["type"] == "tool_result":
                if texts:
                    out.append(Message(role="user", content="".join(texts)))
                    texts = []
                use_id = require(b, "tool_use_id", str, f"{bw}.")
                content = text_of(b.get("content"), f"{bw}.content", allowed=("text",))
                out.append(Message(role="tool", content=content, tool_call_id=use_id))
            elif b["type"] == "text":
                texts.append(check_type(b.get("text"), str, f"{bw}.text"))
            elif b["type"] in ("image", "document", "search_result"):
                raise RequestError(
                    f"{b['type']} content is not supported: this proxy serves a text-only policy",
                    bw,
                )
            else:
                raise RequestError(f"unsupported user content block {b['type']!r}", bw)
        if texts or not any(b["type"] == "tool_result" for b in blocks):
            out.append(Message(role="user", content="".join(texts)))
    return tuple(out)


def parse(body: dict, reuse=()) -> ChatRequest:
    """The request as a ChatRequest. `reuse[i]`, when not None, is what `messages[i]` parsed
    to before (the caller knows the element is unchanged): it is taken as is."""
    model = require(body, "model", str)
    require(body, "max_tokens", int)
    raw = require(body, "messages", list)
    msgs: list[Message] = []
    system = body.get("system")
    if system is not None:
        text = text_of(system, "system", allowed=("text",))
        if text:
            msgs.append(Message(role="system", content=text))
    groups = tuple(
        reuse[i] if i < len(reuse) and reuse[i] is not None else _message(m, f"messages[{i}]")
        for i, m in enumerate(raw)
    )
    msgs += [msg for g in groups for msg in g]
    tools = parse_tools(body["tools"]) if body.get("tools") else ()
    if isinstance(body.get("tool_choice"), dict) and body["tool_choice"].get("type") == "none":
        tools = ()
    return ChatRequest(
        api=NAME,
        model=model,
        messages=tuple(msgs),
        tools=tools,
        sampling=sampling_from(body, "max_tokens", "stop_sequences"),
        stream=bool(optional(body, "stream", bool)),
        include_usage=True,
        tool_choice=body.get("tool_choice"),
        body=body,
        message_groups=groups,
        thinking=from_anthropic(body),
    )


def _content(answer: Answer) -> list[dict]:
    out: list[dict] = []
    if answer.reasoning:
        out.append({"type": "thinking", "thinking": answer.reasoning, "signature": ""})
    if answer.text or not answer.tool_calls:
        out.append({"type": "text", "text": answer.text})
    out += [
        {"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments}
        for c in answer.tool_calls
    ]
    return out


def _usage(answer: Answer) -> dict:
    return {
        "input_tokens": answer.prompt_tokens,
        "output_tokens": answer.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def response(answer: Answer, *, id: str, model: str, created: int | None = None) -> dict:
    return {
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": _content(answer),
        "stop_reason": _STOP[answer.finish_reason],
        "stop_sequence": None,
        "usage": _usage(answer),
    }


class Stream:
    """message_start, ping, content blocks (text / thinking / tool_use with input_json_delta),
    message_delta with stop_reason and usage, message_stop; every frame with its `event:` line."""

    def __init__(
        self, *, id: str, model: str, include_usage: bool = True, prompt_tokens: int = 0
    ) -> None:
        self.id, self.model, self.prompt_tokens = id, model, prompt_tokens
        self._index = -1
        self._open: str | None = None
        self._any_text = False

    def _ev(self, kind: str, data: dict) -> bytes:
        return sse({"type": kind, **data}, event=kind)

    def start(self) -> list[bytes]:
        msg: dict = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": self.prompt_tokens,
                "output_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
        return [self._ev("message_start", {"message": msg}), self._ev("ping", {})]

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        self._open = None
        return [self._ev("content_block_stop", {"index": self._index})]

    def _begin(self, kind: str, block: dict) -> list[bytes]:
        out = self._close()
        self._index += 1
        self._open = kind
        return [
            *out,
            self._ev("content_block_start", {"index": self._index, "content_block": block}),
        ]

    def event(self, ev) -> list[bytes]:
        out: list[bytes] = []
        if isinstance(ev, TextDelta):
            if self._open != "text":
                out += self._begin("text", {"type": "text", "text": ""})
            self._any_text = True
            out.append(
                self._ev(
                    "content_block_delta",
                    {"index": self._index, "delta": {"type": "text_delta", "text": ev.text}},
                )
            )
        elif isinstance(ev, ReasoningDelta):
            if self._open != "thinking":
                out += self._begin(
                    "thinking", {"type": "thinking", "thinking": "", "signature": ""}
                )
            out.append(
                self._ev(
                    "content_block_delta",
                    {
                        "index": self._index,
                        "delta": {"type": "thinking_delta", "thinking": ev.text},
                    },
                )
            )
        elif isinstance(ev, ToolCallEvent):
            c = ev.call
            out += self._begin(
                "tool_use", {"type": "tool_use", "id": c.id, "name": c.name, "input": {}}
            )
            out.append(
                self._ev(
                    "content_block_delta",
                    {
                        "index": self._index,
                        "delta": {
                            "type": "input_json_delta",
                            "partial_json": json.dumps(c.arguments),
                        },
                    },
                )
            )
            out += self._close()
        return out

    def finish(self, answer: Answer) -> list[bytes]:
        out: list[bytes] = []
        if not self._any_text and not answer.tool_calls:
            out += self._begin("text", {"type": "text", "text": ""})
        out += self._close()
        out.append(
            self._ev(
                "message_delta",
                {
                    "delta": {"stop_reason": _STOP[answer.finish_reason], "stop_sequence": None},
                    "usage": {"output_tokens": answer.completion_tokens},
                },
            )
        )
        out.append(self._ev("message_stop", {}))
        return out

    def error(self, kind: str, message: str) -> list[bytes]:
        return [sse(error_body(kind, message), event="error")]


def error_body(kind: str, message: str, param: str | None = None) -> dict:
    return {"type": "error", "error": {"type": kind, "message": message}}
