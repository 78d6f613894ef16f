"""Request bodies: read with a byte limit while they stream in, then parsed into checked JSON.

Everything a record holds comes from here, so the checks are the ones that keep records valid
JSON and keep later stages (templates, hashing, `json.dumps`) from failing on a request's
shape: no NaN or Infinity (nor numbers too large for a float), no lone UTF-16 surrogates, no
nesting deeper than `MAX_DEPTH`. Each failure is a `RequestError` naming where it is.
"""

from __future__ import annotations

import asyncio
import json
import math
import re

from claw_proxy.errors import LimitError, RequestError

# a \uD800-\uDFFF escape, or a surrogate encoded as UTF-8 (json.loads decodes bytes with
# "surrogatepass")
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


def _may_hold_surrogates(raw: bytes | str) -> bool:
    """False when the parsed text cannot hold a surrogate (its strings need no check)."""
    if isinstance(raw, str) or b"\x00" in raw[:4] or raw[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return True  # text, or UTF-16/32: checked string by string
    return _SURROGATE.search(raw) is not None


MAX_DEPTH = 128  # real requests (tool schemas included) nest a few dozen levels at most


async def read_limited(request, limit: int, idle_timeout: float | None = None) -> bytes:
    """The body of a Starlette request, refused with a 413 as soon as it passes `limit` bytes
    (a declared content-length over the limit is refused before reading anything; a chunked
    upload is counted as it arrives), and with a 408 when no byte of it arrives for
    `idle_timeout` seconds."""
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > limit:
        raise LimitError(f"request body of {length} bytes is over the limit of {limit}", status=413)
    parts: list[bytes] = []
    size = 0
    chunks = request.stream()
    while True:
        try:
            async with asyncio.timeout(idle_timeout):
                chunk = await anext(chunks)
        except StopAsyncIteration:
            break
        except TimeoutError:
            raise LimitError(
                f"no part of the request body arrived for {idle_timeout:g} s "
                f"(read {size} bytes of it)",
                status=408,
            ) from None
        size += len(chunk)
        if size > limit:
            raise LimitError(
                f"request body is over the limit of {limit} bytes (refused after {size})",
                status=413,
            )
        parts.append(chunk)
    return b"".join(parts)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(text)
    return value


def _constant(text: str):
    raise _NotFinite(text)


class _NotFinite(ValueError):
    pass


def loads(raw: bytes | str, what: str = "the request body") -> object:
    """JSON text -> value, with the checks above (an error names the first bad place)."""
    try:
        value = json.loads(raw, parse_float=_finite, parse_constant=_constant)
    except _NotFinite as e:
        raise RequestError(
            f"{what} holds the number {e.args[0]}: only finite numbers are accepted "
            "(NaN and Infinity are not JSON)"
        ) from None
    except RecursionError:
        raise RequestError(f"{what} is nested too deeply (more than {MAX_DEPTH} levels)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        detail = (
            f"{e.msg} at line {e.lineno} column {e.colno}"
            if isinstance(e, json.JSONDecodeError)
            else str(e)
        )
        raise RequestError(f"{what} is not valid JSON: {detail}") from None
    check(value, what, strings=_may_hold_surrogates(raw))
    return value


def _path(node) -> str:
    parts = []
    while node is not None:
        key, node = node
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}")
    return "".join(reversed(parts)).lstrip(".") or "(top level)"


def _bad_text(s: str) -> bool:
    if s.isascii():
        return False
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def check(value, what: str = "the request body", strings: bool = True) -> None:
    """Refuse lone surrogates (in keys or strings; `strings=False` skips them) and nesting
    deeper than `MAX_DEPTH`.

    Iterative, so a deep value cannot exhaust the stack here."""
    stack: list[tuple[object, int, object]] = [
        (value, 0, None)
    ]  # (value, depth, path as a linked list of (key, parent))
    while stack:
        v, depth, where = stack.pop()
        if isinstance(v, str):
            if _bad_text(v):
                raise RequestError(
                    f"{what} has a string with a lone UTF-16 surrogate (not valid Unicode)",
                    _path(where),
                )
        elif isinstance(v, (dict, list)):
            if depth >= MAX_DEPTH:
                raise RequestError(
                    f"{what} is nested too deeply (more than {MAX_DEPTH} levels)", _path(where)
                )
            if isinstance(v, dict):
                for k, item in v.items():
                    if strings and _bad_text(k):
                        raise RequestError(
                            f"{what} has a key with a lone UTF-16 surrogate (not valid Unicode)",
                            _path(where),
                        )
                    if isinstance(item, (dict, list)) or strings and isinstance(item, str):
                        stack.append((item, depth + 1, (k, where)))
            else:
                for i, item in enumerate(v):
                    if isinstance(item, (dict, list)) or strings and isinstance(item, str):
                        stack.append((item, depth + 1, (i, where)))
        elif isinstance(v, float) and not math.isfinite(v):
            raise RequestError(f"{what} holds a non-finite number", _path(where))
