"""Parsing sampled text into answer events: text, reasoning and tool calls, incrementally.

The default parser reads the Qwen3 / Hermes format: tool calls as
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` and reasoning as
``<think>...</think>``. It is fed text deltas as tokens are sampled and yields events as soon
as they are certain, so streamed and non-streamed answers come from the same code path and
are identical. Parsers are pluggable: anything with `feed(text) -> list` and
`finish() -> list` registered in `PARSERS`.
"""

from __future__ import annotations

import json
import uuid

from claw_proxy.messages import ReasoningDelta, TextDelta, ToolCall, ToolCallEvent


def new_call_id(prefix: str = "call_") -> str:
    return prefix + uuid.uuid4().hex[:24]


class HermesParser:
    """Incremental parser of ``<tool_call>`` JSON blocks and ``<think>`` reasoning."""

    open_call, close_call = "<tool_call>", "</tool_call>"
    open_think, close_think = "<think>", "</think>"

    def __init__(self, id_prefix: str = "call_") -> None:
        self.id_prefix = id_prefix
        self._buf = ""
        self._mode = "text"  # text | call | think
        self._pending_ws = ""  # whitespace held back in text mode
        self._seen_text = False

    # The tail of the buffer that could still become an opening tag is held back.
    def _holdback(self, text: str) -> int:
        for tag in (self.open_call, self.open_think):
            for k in range(min(len(tag) - 1, len(text)), 0, -1):
                if text.endswith(tag[:k]):
                    return k
        return 0

    def _emit_text(self, text: str, out: list) -> None:
        if not text:
            return
        body = text.rstrip()
        if body:
            out.append(TextDelta(self._pending_ws + body))
            self._pending_ws = ""
            self._seen_text = True
        self._pending_ws += text[len(body) :]

    def feed(self, text: str) -> list:
        out: list = []
        self._buf += text
        while self._buf:
            if self._mode == "text":
                i_call = self._buf.find(self.open_call)
                i_think = self._buf.find(self.open_think)
                hits = [(i, t) for i, t in ((i_call, "call"), (i_think, "think")) if i >= 0]
                if hits:
                    i, mode = min(hits)
                    self._emit_text(self._buf[:i], out)
                    self._pending_ws = ""
                    tag = self.open_call if mode == "call" else self.open_think
                    self._buf = self._buf[i + len(tag) :]
                    self._mode = mode
                    continue
                keep = self._holdback(self._buf)
                self._emit_text(self._buf[: len(self._buf) - keep], out)
                self._buf = self._buf[len(self._buf) - keep :]
                break
            if self._mode == "think":
                i = self._buf.find(self.close_think)
                if i < 0:
                    keep = 0
                    for k in range(min(len(self.close_think) - 1, len(self._buf)), 0, -1):
                        if self._buf.endswith(self.close_think[:k]):
                            keep = k
                            break
                    if len(self._buf) > keep:
                        out.append(ReasoningDelta(self._buf[: len(self._buf) - keep]))
                    self._buf = self._buf[len(self._buf) - keep :]
                    break
                if i:
                    out.append(ReasoningDelta(self._buf[:i]))
                self._buf = self._buf[i + len(self.close_think) :].lstrip()
                self._mode = "text"
                continue
            # call mode: wait for the closing tag, then parse the whole block
            i = self._buf.find(self.close_call)
            if i < 0:
                break
            block, self._buf = self._buf[:i], self._buf[i + len(self.close_call) :]
            self._mode = "text"
            events = self._call_events(block)
            out.extend(events)
            if events and isinstance(events[0], ToolCallEvent):
                self._buf = self._buf.lstrip()
        return out

    def _call_events(self, block: str) -> list:
        try:
            obj = json.loads(block)
        except json.JSONDecodeError:
            obj = None
        name = obj.get("name") if isinstance(obj, dict) else None
        args = obj.get("arguments", {}) if isinstance(obj, dict) else None
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                args = None
        if not isinstance(name, str) or not name or not isinstance(args, dict):
            # not a well-formed call: it is text the model wrote
            out: list = []
            self._emit_text(self.open_call + block + self.close_call, out)
            return out
        call = ToolCall(id=new_call_id(self.id_prefix), name=name, arguments=args)
        return [ToolCallEvent(call, json.dumps(args, ensure_ascii=False))]

    def finish(self) -> list:
        """Flush what is left when sampling ends (an unclosed block is parsed or kept as text)."""
        out: list = []
        rest, self._buf = self._buf, ""
        if self._mode == "call":
            events = self._call_events(rest)
            if events and isinstance(events[0], ToolCallEvent):
                out.extend(events)
            else:
                out = []
                self._emit_text(self.open_call + rest, out)
        elif self._mode == "think":
            if rest:
                out.append(ReasoningDelta(rest))
        else:
            self._emit_text(rest, out)
        self._mode = "text"
        return out


PARSERS = {"hermes": HermesParser, "qwen3": HermesParser}


def make_parser(name: str, id_prefix: str = "call_"):
    try:
        return PARSERS[name](id_prefix=id_prefix)
    except KeyError:
        raise ValueError(f"unknown tool-call parser {name!r}; known: {sorted(PARSERS)}") from None
