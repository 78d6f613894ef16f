"""The API-neutral conversation every request is turned into, and the answer events.

Each API module (`api_openai`, `api_anthropic`) parses its request body into a `ChatRequest`
of `Message`s in the chat-template shape (system / user / assistant / tool), and formats the
`AnswerEvent`s the proxy produces back into that API's JSON and SSE shapes.
"""

from __future__ import annotations

import hashlib
import json
import math
import re

import attrs

from claw_proxy._jsonbody import loads
from claw_proxy._thinking import Thinking
from claw_proxy.errors import RequestError

_THINK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


@attrs.frozen(kw_only=True)
class ToolCall:
    """An assistant tool call; `arguments` is the decoded JSON object."""

    id: str
    name: str
    arguments: dict

    def to_template(self) -> dict:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@attrs.frozen(kw_only=True)
class Message:
    """One message of the conversation, in chat-template roles."""

    role: str  # system | user | assistant | tool
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    # key(), computed once: a message re-sent in later requests is the same object there
    _key: str | None = attrs.field(default=None, init=False, eq=False, repr=False)

    def to_template(self) -> dict:
        d: dict = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = [c.to_template() for c in self.tool_calls]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        return d

    def key(self) -> str:
        """What makes two messages "the same history" for prefix reuse.

        Tool-call ids (harnesses rewrite them), whitespace inside tool-call JSON, reasoning
        (`<think>` blocks, thinking blocks) and surrounding whitespace do not count.
        """
        if self._key is None:
            object.__setattr__(self, "_key", self._digest())
        return self._key  # type: ignore[return-value]

    def _digest(self) -> str:
        content = self.content
        if self.role == "assistant" and "<think>" in content:
            content = _THINK.sub("", content)
        h = hashlib.blake2b(digest_size=16)
        h.update(self.role.encode())
        h.update(b"\x00")
        h.update(content.strip().encode("utf-8", "surrogatepass"))
        for c in self.tool_calls:
            h.update(b"\x00" + c.name.encode("utf-8", "surrogatepass") + b"\x00")
            h.update(canonical_json(c.arguments).encode("utf-8", "surrogatepass"))
        return h.hexdigest()


@attrs.frozen(kw_only=True)
class Sampling:
    """Sampling parameters as asked for (None = not given)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False  # vLLM's extension: decode to max_tokens, through eos tokens


@attrs.frozen(kw_only=True)
class ChatRequest:
    """A request of any of the three APIs, in API-neutral form."""

    api: str
    model: str
    messages: tuple[Message, ...]
    tools: tuple[dict, ...] = ()  # OpenAI function format: {"type": "function", "function": {...}}
    sampling: Sampling = Sampling()
    stream: bool = False
    include_usage: bool = False
    tool_choice: object = None
    body: dict = attrs.field(factory=dict, repr=False)
    logprobs: bool = False  # the answer carries each completion token's logprob
    thinking: Thinking | None = None  # the harness's thinking switch, when it sent one
    # the Messages each element of the body's messages array became, in order (the API
    # parsers fill it; an unchanged element of a later request reuses its group)
    message_groups: tuple[tuple[Message, ...], ...] = attrs.field(default=(), eq=False, repr=False)

    def context_key(self) -> str:
        """Hash of what is rendered before the messages (the tools)."""
        blob = canonical_json(list(self.tools))
        return hashlib.blake2b(blob.encode("utf-8"), digest_size=16).hexdigest()


def canonical_json(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# --- answer events -------------------------------------------------------------------------


@attrs.frozen
class TextDelta:
    text: str


@attrs.frozen
class ReasoningDelta:
    text: str


@attrs.frozen
class ToolCallEvent:
    call: ToolCall
    arguments_json: str


@attrs.frozen
class TokenLogprobs:
    """Sampled tokens with their engine logprobs, in OpenAI's shape (`{token, logprob, bytes,
    top_logprobs}`); sent before the text events of the same tokens, only when asked for."""

    entries: tuple[dict, ...]


@attrs.frozen(kw_only=True)
class Answer:
    """The complete answer, gathered from the same events the stream sends."""

    text: str
    reasoning: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str  # stop | length | tool_calls | error
    prompt_tokens: int
    completion_tokens: int
    logprobs: tuple[dict, ...] | None = None  # TokenLogprobs entries, when the request asked
    reasoning_tokens: int = 0  # sampled tokens of the reasoning (<think> ... </think>)

    def message(self) -> Message:
        return Message(role="assistant", content=self.text, tool_calls=self.tool_calls)


# --- helpers shared by the API parsers -----------------------------------------------------


def require(body: dict, name: str, types, where: str = ""):
    path = f"{where}{name}"
    if name not in body:
        raise RequestError("required field is missing", path)
    return check_type(body[name], types, path)


def optional(body: dict, name: str, types, where: str = ""):
    if body.get(name) is None:
        return None
    return check_type(body[name], types, f"{where}{name}")


_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    list: "an array",
    dict: "an object",
}


def check_type(value, types, path: str):
    types = types if isinstance(types, tuple) else (types,)
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if float in types and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        want = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)
        raise RequestError(f"expected {want}, got {type(value).__name__}", path)
    return value


def parse_arguments(raw, path: str) -> dict:
    """Tool-call arguments as sent back by a client: a JSON object or a string of one."""
    if isinstance(raw, dict):
        return raw
    if raw is None or raw == "":
        return {}
    if isinstance(raw, str):
        try:  # checked as a request body is: NaN, lone surrogates (a 500 later), nesting depth
            value = loads(raw, "the tool-call arguments")
        except RequestError as e:
            raise RequestError(str(e), path) from None
        if isinstance(value, dict):
            return value
    raise RequestError("tool-call arguments must be a JSON object", path)


def sampling_from(
    body: dict, max_tokens_field: str | tuple[str, ...], stop_field: str | None
) -> Sampling:
    fields = max_tokens_field if isinstance(max_tokens_field, tuple) else (max_tokens_field,)
    max_tokens = None
    for f in fields:
        v = optional(body, f, int)
        if v is not None:
            if v < 1:
                raise RequestError("must be >= 1", f)
            max_tokens = v
            break
    temperature = optional(body, "temperature", float)
    if temperature is not None and not (math.isfinite(temperature) and temperature >= 0):
        raise RequestError(f"must be a finite number >= 0, got {temperature!r}", "temperature")
    top_p = optional(body, "top_p", float)
    if top_p is not None and not (math.isfinite(top_p) and 0 < top_p <= 1):
        raise RequestError(f"must be a finite number in (0, 1], got {top_p!r}", "top_p")
    top_k = optional(body, "top_k", int)
    if top_k is not None and top_k < -1:
        raise RequestError(f"must be >= 0 (0 or -1: off), got {top_k}", "top_k")
    stop: tuple[str, ...] = ()
    if stop_field and body.get(stop_field) is not None:
        raw = body[stop_field]
        if isinstance(raw, str):
            stop = (raw,)
        else:
            check_type(raw, list, stop_field)
            stop = tuple(check_type(s, str, f"{stop_field}[{i}]") for i, s in enumerate(raw))
    return Sampling(
        temperature=None if temperature is None else float(temperature),
        top_p=None if top_p is None else float(top_p),
        top_k=None if top_k is None else max(top_k, 0),
        max_tokens=max_tokens,
        seed=optional(body, "seed", int),
        stop=tuple(s for s in stop if s),
        ignore_eos=bool(optional(body, "ignore_eos", bool)),
    )
