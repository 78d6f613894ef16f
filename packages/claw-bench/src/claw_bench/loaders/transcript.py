"""Transcripts for checkers that want one, built from claw-proxy's claw.call/v1 records.

PinchBench's ``grade(transcript, workspace_path)`` reads an OpenClaw-style session log: a list of
events ``{"type": "message", "message": {"role", "content": [blocks]}}`` with blocks
``{"type": "text", "text"}``, ``{"type": "toolCall", "name", "arguments"}`` and
``{"type": "toolResult", "content"}``. The proxy records each call's raw request and answer
(``request`` / ``response``, when it keeps them); the session's transcript is the last call's
request messages followed by its answer, which holds the whole conversation as the harness sent
it. Calls without raw bodies give no transcript (an empty list), as the checker would get anyway.

Hand it to the verify step as ``.claw_verify/transcript.json`` (a job's hidden files) or
``$CLAW_TRANSCRIPT_FILE``; the PinchBench runner passes it to grade().
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

TRANSCRIPT_FILE = ".claw_verify/transcript.json"


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    out: list[dict[str, Any]] = []
    for b in content or []:
        if not isinstance(b, dict):
            continue
        kind = b.get("type")
        if kind in ("text", "input_text", "output_text"):
            out.append({"type": "text", "text": b.get("text", "")})
        elif kind == "tool_use":
            out.append(
                {
                    "type": "toolCall",
                    "id": b.get("id"),
                    "name": b.get("name"),
                    "arguments": b.get("input", {}),
                }
            )
        elif kind == "tool_result":
            out.append(
                {"type": "toolResult", "id": b.get("tool_use_id"), "content": b.get("content")}
            )
    return out


def _openai_message(m: dict[str, Any]) -> dict[str, Any]:
    role = m.get("role", "user")
    blocks = _blocks(m.get("content"))
    for tc in m.get("tool_calls") or []:
        fn = tc.get("function") or {}
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except json.JSONDecodeError:
            args = fn.get("arguments")
        blocks.append(
            {"type": "toolCall", "id": tc.get("id"), "name": fn.get("name"), "arguments": args}
        )
    if role == "tool":
        return {
            "role": "toolResult",
            "content": [
                {"type": "toolResult", "id": m.get("tool_call_id"), "content": m.get("content")}
            ],
        }
    return {"role": role, "content": blocks}


def _messages(call: dict[str, Any]) -> list[dict[str, Any]]:
    req, resp = call.get("request") or {}, call.get("response") or {}
    api = str(call.get("api", ""))
    msgs: list[dict[str, Any]] = []
    if (
        api.startswith("anthropic")
        or "system" in req
        and "messages" in req
        and "choices" not in resp
    ):
        if isinstance(req.get("system"), str) and req["system"]:
            msgs.append({"role": "system", "content": _blocks(req["system"])})
        msgs += [
            {"role": m.get("role", "user"), "content": _blocks(m.get("content"))}
            for m in req.get("messages") or []
            if isinstance(m, dict)
        ]
        if resp.get("content"):
            msgs.append({"role": "assistant", "content": _blocks(resp["content"])})
        return msgs
    msgs += [_openai_message(m) for m in req.get("messages") or [] if isinstance(m, dict)]
    for choice in (resp.get("choices") or [])[:1]:
        if isinstance(choice.get("message"), dict):
            msgs.append(_openai_message(choice["message"]))
    return msgs


def transcript_from_calls(
    calls: Iterable[dict[str, Any]], session: str | None = None
) -> list[dict[str, Any]]:
    """The PinchBench-style transcript of one session from its claw.call/v1 dicts (``[]`` if unknown).

    ``session`` picks the session when ``calls`` holds several; the call with the highest
    ``seq`` that carries a raw request gives the conversation.
    """
    mine = [c for c in calls if session is None or c.get("session") == session]
    with_bodies = [c for c in mine if isinstance(c.get("request"), dict)]
    if not with_bodies:
        return []
    last = max(with_bodies, key=lambda c: c.get("seq", 0))
    return [{"type": "message", "message": m} for m in _messages(last)]
