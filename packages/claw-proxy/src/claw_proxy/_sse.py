"""Server-sent-event framing shared by the API modules."""

from __future__ import annotations

import json


def sse(data, event: str | None = None) -> bytes:
    """One SSE frame: optional `event:` line, one `data:` line, blank line."""
    payload = (
        data
        if isinstance(data, str)
        else json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    )
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def text_of(content, path: str, allowed=("text", "input_text", "output_text")) -> str:
    """Text of an OpenAI/Anthropic content value: a string or a list of text parts.

    Images, audio and files are refused with a 400 naming the part."""
    from claw_proxy.errors import RequestError

    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(
            f"expected a string or an array of content parts, got {type(content).__name__}", path
        )
    out = []
    for k, part in enumerate(content):
        where = f"{path}[{k}]"
        if isinstance(part, str):
            out.append(part)
            continue
        if not isinstance(part, dict):
            raise RequestError("a content part must be an object", where)
        kind = part.get("type")
        if kind in allowed:
            text = part.get("text")
            if not isinstance(text, str):
                raise RequestError("a text part needs a string 'text'", f"{where}.text")
            out.append(text)
        elif kind in (
            "image",
            "image_url",
            "input_image",
            "input_audio",
            "input_file",
            "file",
            "document",
        ):
            raise RequestError(
                f"{kind} content is not supported: this proxy serves a text-only policy", where
            )
        elif kind == "refusal":
            refusal = part.get("refusal")
            if refusal is not None and not isinstance(refusal, str):
                raise RequestError(
                    f"a refusal part needs a string 'refusal', got {type(refusal).__name__}",
                    f"{where}.refusal",
                )
            out.append(refusal or "")
        else:
            raise RequestError(f"unsupported content part type {kind!r}", where)
    return "".join(out)
