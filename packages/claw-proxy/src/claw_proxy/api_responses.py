"""OpenAI Responses (`POST /v1/responses`): input items, output items, the typed event stream."""

from __future__ import annotations

import json
import time
import uuid

from claw_proxy._logprobs import check_top_logprobs
from claw_proxy._sse import sse, text_of
from claw_proxy._thinking import from_responses
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

NAME = "openai.responses"
CALL_ID_PREFIX = "call_"
LOGPROBS_INCLUDE = "message.output_text.logprobs"
_HOSTED = {
    "web_search",
    "web_search_preview",
    "file_search",
    "code_interpreter",
    "computer_use_preview",
    "image_generation",
    "mcp",
    "local_shell",
}


def _function(t: dict, where: str) -> dict:
    spec = {"name": require(t, "name", str, f"{where}.")}
    if t.get("description") is not None:
        spec["description"] = check_type(t["description"], str, f"{where}.description")
    spec["parameters"] = optional(t, "parameters", dict, f"{where}.") or {
        "type": "object",
        "properties": {},
    }
    return {"type": "function", "function": spec}


def parse_tools(raw) -> tuple[dict, ...]:
    tools = []
    for i, t in enumerate(check_type(raw, list, "tools")):
        where = f"tools[{i}]"
        check_type(t, dict, where)
        kind = t.get("type")
        if not isinstance(kind, str):
            raise RequestError(
                f"a tool needs a string 'type', got {type(kind).__name__}", f"{where}.type"
            )
        if kind == "function":
            tools.append(_function(t, where))
        elif (
            kind == "namespace"
        ):  # a group of functions (Codex): offered to the model by their names
            for k, inner in enumerate(optional(t, "tools", list, f"{where}.") or []):
                check_type(inner, dict, f"{where}.tools[{k}]")
                if inner.get("type", "function") == "function":
                    tools.append(_function(inner, f"{where}.tools[{k}]"))
        elif kind in _HOSTED:
            continue  # hosted tools run at the provider, never in the model's output
        else:
            raise RequestError(f"unsupported tool type {kind!r}", f"{where}.type")
    return tuple(tools)


def parse(body: dict) -> ChatRequest:
    model = require(body, "model", str)
    if body.get("previous_response_id"):
        raise RequestError(
            "previous_response_id is not supported: responses are not stored, "
            "send the whole conversation in 'input'",
            "previous_response_id",
        )
    msgs: list[Message] = []
    instructions = optional(body, "instructions", str)
    if instructions:
        msgs.append(Message(role="system", content=instructions))
    raw = require(body, "input", (str, list))
    if isinstance(raw, str):
        raw = [{"type": "message", "role": "user", "content": raw}]
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        check_type(item, dict, where)
        kind = item.get("type", "message")
        if kind == "message":
            role = require(item, "role", str, f"{where}.")
            if role not in ("user", "system", "developer", "assistant"):
                raise RequestError(f"unknown role {role!r}", f"{where}.role")
            content = text_of(item.get("content"), f"{where}.content")
            if role == "assistant":
                msgs.append(Message(role="assistant", content=content))
            else:
                msgs.append(Message(role="user" if role == "user" else "system", content=content))
        elif kind == "function_call":
            call = ToolCall(
                id=require(item, "call_id", str, f"{where}."),
                name=require(item, "name", str, f"{where}."),
                arguments=parse_arguments(item.get("arguments"), f"{where}.arguments"),
            )
            if msgs and msgs[-1].role == "assistant":  # text and calls of one turn are one message
                last = msgs.pop()
                msgs.append(
                    Message(
                        role="assistant", content=last.content, tool_calls=(*last.tool_calls, call)
                    )
                )
            else:
                msgs.append(Message(role="assistant", tool_calls=(call,)))
        elif kind == "function_call_output":
            out = item.get("output")
            content = out if isinstance(out, str) else text_of(out, f"{where}.output")
            msgs.append(
                Message(
                    role="tool",
                    content=content,
                    tool_call_id=require(item, "call_id", str, f"{where}."),
                )
            )
        elif kind == "reasoning":
            continue  # reasoning items are not re-sent to the model
        else:
            raise RequestError(f"unsupported input item type {kind!r}", f"{where}.type")
    include = optional(body, "include", list) or []
    for i, name in enumerate(include):
        check_type(name, str, f"include[{i}]")
    check_top_logprobs(body)
    return ChatRequest(
        api=NAME,
        model=model,
        messages=tuple(msgs),
        tools=parse_tools(body["tools"])
        if body.get("tools") and body.get("tool_choice") != "none"
        else (),
        sampling=sampling_from(body, "max_output_tokens", None),
        stream=bool(optional(body, "stream", bool)),
        include_usage=True,
        tool_choice=body.get("tool_choice"),
        body=body,
        logprobs=LOGPROBS_INCLUDE in include,
        thinking=from_responses(body),
    )


def _usage(answer: Answer) -> dict:
    return {
        "input_tokens": answer.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": answer.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": answer.reasoning_tokens},
        "total_tokens": answer.prompt_tokens + answer.completion_tokens,
    }


def _text_part(text: str, logprobs=None) -> dict:
    part = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = list(logprobs)
    return part


def _message_item(id: str, text: str, status: str = "completed", logprobs=None) -> dict:
    content = [_text_part(text, logprobs)] if status == "completed" else []
    return {"type": "message", "id": id, "status": status, "role": "assistant", "content": content}


def _reasoning_item(id: str, text: str, status: str = "completed") -> dict:
    """OpenAI's reasoning output item: the sampled reasoning as `reasoning_text` content (no
    summary: the policy writes none)."""
    content = [{"type": "reasoning_text", "text": text}] if status == "completed" else []
    return {"type": "reasoning", "id": id, "summary": [], "content": content, "status": status}


def _call_item(id: str, call: ToolCall, arguments: str, status: str = "completed") -> dict:
    return {
        "type": "function_call",
        "id": id,
        "call_id": call.id,
        "name": call.name,
        "arguments": arguments,
        "status": status,
    }


def _response(
    id: str, model: str, created: int, body: dict, status: str, output: list, answer: Answer | None
) -> dict:
    return {
        "id": id,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": model,
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "reasoning": _reasoning_setting(body),
        "store": False,
        "temperature": body.get("temperature", 1.0),
        "text": {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools", []),
        "top_p": body.get("top_p", 1.0),
        "truncation": "disabled",
        "metadata": body.get("metadata") or {},
        "usage": _usage(answer) if answer else None,
    }


def _reasoning_setting(body: dict) -> dict:
    asked = body.get("reasoning")
    if not isinstance(asked, dict):
        asked = {}
    return {"effort": asked.get("effort"), "summary": asked.get("summary")}


def _ids() -> str:
    return uuid.uuid4().hex[:24]


def response(
    answer: Answer, *, id: str, model: str, created: int | None = None, body: dict | None = None
) -> dict:
    output = []
    if answer.reasoning:
        output.append(_reasoning_item(f"rs_{_ids()}", answer.reasoning))
    if answer.text or not answer.tool_calls:
        output.append(_message_item(f"msg_{_ids()}", answer.text, logprobs=answer.logprobs))
    output += [_call_item(f"fc_{_ids()}", c, json.dumps(c.arguments)) for c in answer.tool_calls]
    status = "incomplete" if answer.finish_reason == "length" else "completed"
    return _response(id, model, created or int(time.time()), body or {}, status, output, answer)


class Stream:
    """response.created / in_progress, output items with their deltas and done events,
    response.completed (or .incomplete); every frame with `event:` and a sequence_number.

    With `include: ["message.output_text.logprobs"]` each text delta carries the logprob
    entries of the tokens sampled since the previous delta, and the message's output_text part
    all of them up to its end."""

    def __init__(
        self, *, id: str, model: str, include_usage: bool = True, body: dict | None = None
    ) -> None:
        self.id, self.model, self.body = id, model, body or {}
        self.created = int(time.time())
        self._seq = 0
        self._output: list[dict] = []
        self._text: str | None = None  # text of the open message item
        self._msg_id = ""
        self._pending: list[dict] | None = None  # logprob entries not yet sent (None: not asked)
        self._msg_logprobs: list[dict] = []  # the entries sent with the open message's deltas
        self._reasoning: str | None = None  # text of the open reasoning item
        self._rs_id = ""

    def _ev(self, kind: str, data: dict) -> bytes:
        frame = sse({"type": kind, "sequence_number": self._seq, **data}, event=kind)
        self._seq += 1
        return frame

    def start(self) -> list[bytes]:
        r = _response(self.id, self.model, self.created, self.body, "in_progress", [], None)
        return [
            self._ev("response.created", {"response": r}),
            self._ev("response.in_progress", {"response": r}),
        ]

    def _open_message(self) -> list[bytes]:
        self._msg_id, self._text = f"msg_{_ids()}", ""
        idx = len(self._output)
        return [
            self._ev(
                "response.output_item.added",
                {"output_index": idx, "item": _message_item(self._msg_id, "", "in_progress")},
            ),
            self._ev(
                "response.content_part.added",
                {
                    "item_id": self._msg_id,
                    "output_index": idx,
                    "content_index": 0,
                    "part": {"type": "output_text", "text": "", "annotations": []},
                },
            ),
        ]

    def _open_reasoning(self) -> list[bytes]:
        self._rs_id, self._reasoning = f"rs_{_ids()}", ""
        idx = len(self._output)
        return [
            self._ev(
                "response.output_item.added",
                {"output_index": idx, "item": _reasoning_item(self._rs_id, "", "in_progress")},
            ),
            self._ev(
                "response.content_part.added",
                {
                    "item_id": self._rs_id,
                    "output_index": idx,
                    "content_index": 0,
                    "part": {"type": "reasoning_text", "text": ""},
                },
            ),
        ]

    def _close_reasoning(self) -> list[bytes]:
        if self._reasoning is None:
            return []
        idx, text, rs_id = len(self._output), self._reasoning, self._rs_id
        item = _reasoning_item(rs_id, text)
        self._output.append(item)
        self._reasoning = None
        where = {"item_id": rs_id, "output_index": idx, "content_index": 0}
        return [
            self._ev("response.reasoning_text.done", {**where, "text": text}),
            self._ev(
                "response.content_part.done",
                {**where, "part": {"type": "reasoning_text", "text": text}},
            ),
            self._ev("response.output_item.done", {"output_index": idx, "item": item}),
        ]

    def _close_message(self) -> list[bytes]:
        if self._text is None:
            return []
        idx, text = len(self._output), self._text
        logprobs = None
        if self._pending is not None:
            logprobs, self._msg_logprobs, self._pending = self._msg_logprobs + self._pending, [], []
        part = _text_part(text, logprobs)
        item = _message_item(self._msg_id, text, logprobs=logprobs)
        self._output.append(item)
        self._text = None
        return [
            self._ev(
                "response.output_text.done",
                {"item_id": self._msg_id, "output_index": idx, "content_index": 0, "text": text},
            ),
            self._ev(
                "response.content_part.done",
                {"item_id": self._msg_id, "output_index": idx, "content_index": 0, "part": part},
            ),
            self._ev("response.output_item.done", {"output_index": idx, "item": item}),
        ]

    def event(self, ev) -> list[bytes]:
        out: list[bytes] = []
        if isinstance(ev, TokenLogprobs):
            self._pending = [*(self._pending or []), *ev.entries]
        elif isinstance(ev, ReasoningDelta):
            out += self._close_message()
            if self._reasoning is None:
                out += self._open_reasoning()
            self._reasoning = (self._reasoning or "") + ev.text
            out.append(
                self._ev(
                    "response.reasoning_text.delta",
                    {
                        "item_id": self._rs_id,
                        "output_index": len(self._output),
                        "content_index": 0,
                        "delta": ev.text,
                    },
                )
            )
        elif isinstance(ev, TextDelta):
            out += self._close_reasoning()
            if self._text is None:
                out += self._open_message()
            self._text = (self._text or "") + ev.text
            data: dict = {
                "item_id": self._msg_id,
                "output_index": len(self._output),
                "content_index": 0,
                "delta": ev.text,
            }
            if self._pending is not None:
                data["logprobs"], self._pending = self._pending, []
                self._msg_logprobs += data["logprobs"]
            out.append(self._ev("response.output_text.delta", data))
        elif isinstance(ev, ToolCallEvent):
            out += self._close_reasoning()
            out += self._close_message()
            idx, fc_id = len(self._output), f"fc_{_ids()}"
            args = json.dumps(ev.call.arguments)
            out.append(
                self._ev(
                    "response.output_item.added",
                    {"output_index": idx, "item": _call_item(fc_id, ev.call, "", "in_progress")},
                )
            )
            out.append(
                self._ev(
                    "response.function_call_arguments.delta",
                    {"item_id": fc_id, "output_index": idx, "delta": args},
                )
            )
            out.append(
                self._ev(
                    "response.function_call_arguments.done",
                    {"item_id": fc_id, "output_index": idx, "arguments": args},
                )
            )
            item = _call_item(fc_id, ev.call, args)
            self._output.append(item)
            out.append(self._ev("response.output_item.done", {"output_index": idx, "item": item}))
        return out

    def finish(self, answer: Answer) -> list[bytes]:
        out: list[bytes] = []
        if answer.logprobs is not None and self._pending is None:
            self._pending = []  # asked, but no token yet (an empty answer)
        out += self._close_reasoning()
        if self._text is None and not any(o["type"] != "reasoning" for o in self._output):
            out += self._open_message()  # an answer always has a message or a call
        out += self._close_message()
        status = "incomplete" if answer.finish_reason == "length" else "completed"
        r = _response(self.id, self.model, self.created, self.body, status, self._output, answer)
        out.append(self._ev(f"response.{status}", {"response": r}))
        return out

    def error(self, kind: str, message: str) -> list[bytes]:
        r = _response(self.id, self.model, self.created, self.body, "failed", self._output, None)
        r["error"] = {"code": "server_error", "message": message}
        return [self._ev("response.failed", {"response": r})]


def error_body(kind: str, message: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}
