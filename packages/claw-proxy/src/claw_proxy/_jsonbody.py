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
import threading

from claw_proxy.errors import LimitError, RequestError

# a \uD800-\uDFFF escape, or a surrogate encoded as UTF-8 (json.loads decodes bytes with
# "surrogatepass")
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


def _may_hold_surrogates(raw: bytes | str) -> bool:
    """False when the parsed text cannot hold a surrogate (its strings need no check)."""
    if isinstance(raw, str) or b"\x00" in raw[:4] or raw[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return True  # text, or UTF-16/32: checked string by string
    if b"\\u" not in raw and b"\xed" not in raw:  # two memchr-speed scans: the common case
        return False
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
    _check([(value, 0, None)], what, strings)


def _check(stack: list[tuple[object, int, object]], what: str, strings: bool) -> None:
    """`check` from these roots: (value, depth, path as a linked list of (key, parent))."""
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


# --- request bodies whose messages were seen before ------------------------------------------

# the scanner `json.loads(..., parse_float=_finite, parse_constant=_constant)` runs: scan(text,
# i) -> (the value starting at i, where it ends); StopIteration when none starts there
_SCAN = json.JSONDecoder(parse_float=_finite, parse_constant=_constant).scan_once  # type: ignore[attr-defined]
_WS = re.compile(r"[ \t\n\r]*")
_SPACE = frozenset(" \t\n\r")


def _skip(text: str, i: int) -> int:
    """Past the JSON whitespace at `i`."""
    return _WS.match(text, i).end()  # type: ignore[union-attr]  # `*` always matches


class Split:
    """The elements of a body's `messages` array as JSON text: `region` runs from the first
    element's first character to the last one's last, `spans[j]` is element j's (start, end)
    in it, `values[j]` its value. `fresh`: the indices parsed from text (the others were taken
    from the `known` split the body was read against)."""

    __slots__ = ("fresh", "region", "spans", "values")

    def __init__(self, region: str = "", spans=(), values=(), fresh=()) -> None:
        self.region, self.spans, self.values, self.fresh = region, spans, values, fresh

    def text(self, j: int) -> str:
        a, b = self.spans[j]
        return self.region[a:b]


_NONE = Split()


def _elements(text: str, i: int, known: Split) -> tuple[Split, int] | None:
    """The elements of the array whose first element starts at `i`, and where the array ends.
    An element whose text is known's element at the same index is known's value (the text is
    followed by a delimiter, so the same text is the same value); when known's whole region is
    there, its elements are all taken with one comparison."""
    scan, ws = _SCAN, _skip
    values: list = []
    spans: list[tuple[int, int]] = []
    fresh: list[int] = []
    base, kr, ks = i, known.region, known.spans
    taken = bool(kr) and text.startswith(kr, i)
    if taken:
        values.extend(known.values)
        spans.extend(ks)
        end = i + len(kr)
    while True:
        if not taken:
            j = len(values)
            k = known.text(j) if j < len(ks) else ""
            if k and text.startswith(k, i):
                value, end = known.values[j], i + len(k)
            else:
                value, end = scan(text, i)
                fresh.append(j)
            values.append(value)
            spans.append((i - base, end - base))
        taken = False
        c = text[end : end + 1]
        if c in _SPACE:
            end = ws(text, end)
            c = text[end : end + 1]
        i = end + 1
        if c == "]":
            return Split(text[base : base + spans[-1][1]], spans, values, fresh), i
        if c != ",":
            return None
        if text[i : i + 1] in _SPACE:
            i = ws(text, i)


class _Members:
    """Big top-level members (an array or object of `MIN_CHARS` or more: `tools`, a long
    `system`) by their JSON text, as parsed and checked before: a harness re-sends the same
    tools on every call of every session, and such a member whose text is one of these is
    taken as that value (shared, as the parse memo shares messages), neither parsed nor
    checked again. An array or object is never a proper prefix of another JSON value, so
    the same text followed by the member's delimiter is the same value. Bounded: `PER_KEY`
    texts a member name, `KEYS` names, `MAX_CHARS` a text."""

    MIN_CHARS, MAX_CHARS, PER_KEY, KEYS = 256, 1 << 20, 4, 16

    def __init__(self) -> None:
        self._by_key: dict[str, list[tuple[str, object]]] = {}
        self._lock = threading.Lock()

    def take(self, key: str, text: str, i: int) -> tuple[object, int] | None:
        """The known value whose text starts at `i`, and where it ends; None when none."""
        for known, value in self._by_key.get(key, ()):
            if text.startswith(known, i):
                return value, i + len(known)
        return None

    def keep(self, key: str, known: str, value: object) -> None:
        with self._lock:
            entries = self._by_key.get(key)
            if entries is None:
                if len(self._by_key) >= self.KEYS:
                    return
                entries = []
            # most recent first; a copy, so readers on other threads see a whole list
            self._by_key[key] = [(known, value), *entries[: self.PER_KEY - 1]]


_MEMBERS = _Members()


def _member(text: str, i: int, key: str, fresh: dict[str, str], taken: set[str]):
    """The value of top-level member `key` starting at `i`, and where it ends: `_MEMBERS`'s
    when it knows the text (noted in `taken`), else scanned (a big one's text noted in
    `fresh`)."""
    if text[i : i + 1] not in ("[", "{"):
        return _SCAN(text, i)
    got = _MEMBERS.take(key, text, i)
    if got is not None:
        taken.add(key)
        return got
    value, end = _SCAN(text, i)
    if _Members.MIN_CHARS <= end - i <= _Members.MAX_CHARS:
        fresh[key] = text[i:end]
    return value, end


def _split(
    text: str, field: str, known: Split
) -> tuple[dict, Split | None, dict[str, str], set[str]] | None:
    """A top-level JSON object parsed member by member with the json module's own scanner (the
    values are exactly `json.loads`'s), with its `field` array's elements as a Split (None
    when it has no such array, or an empty one), the text of each big member parsed here (by
    name) and the names of those taken from `_MEMBERS` (checked before). None for anything
    else: not an object, malformed JSON, a non-finite number, nesting too deep. The caller
    then parses the plain way, which names the error."""
    scan, ws = _SCAN, _skip
    out: dict = {}
    split: Split | None = None
    fresh: dict[str, str] = {}
    taken: set[str] = set()
    try:
        i = ws(text, 0)
        if text[i : i + 1] != "{":
            return None
        i = ws(text, i + 1)
        if text[i : i + 1] == "}":
            i += 1
        else:
            while True:
                if text[i : i + 1] != '"':
                    return None
                key, i = scan(text, i)
                i = ws(text, i)
                if text[i : i + 1] != ":":
                    return None
                i = ws(text, i + 1)
                if key == field:
                    split = None  # a later duplicate key wins, as in json.loads
                    if text[i : i + 1] == "[" and text[ws(text, i + 1)] != "]":
                        got = _elements(text, ws(text, i + 1), known)
                        if got is None:
                            return None
                        split, i = got
                        out[key] = list(split.values)  # the memo keeps its own list
                    else:
                        out[key], i = scan(text, i)
                else:
                    fresh.pop(key, None)  # a later duplicate key wins, as in json.loads
                    taken.discard(key)
                    out[key], i = _member(text, i, key, fresh, taken)
                i = ws(text, i)
                c, i = text[i : i + 1], i + 1
                if c == "}":
                    break
                if c != ",":
                    return None
                i = ws(text, i)
    except (StopIteration, ValueError, RecursionError, IndexError):
        return None
    if ws(text, i) != len(text):
        return None
    return out, split, fresh, taken


def loads_split(
    raw: bytes, known: Split = _NONE, field: str = "messages"
) -> tuple[object, Split | None]:
    """`loads` of a request body, with the elements of its top-level `field` array as a Split
    (None when the body has no such array or is not plain UTF-8 JSON: then this is `loads`).
    An element whose text is `known`'s element at the same index (an element of an earlier
    body that passed these checks) is neither parsed nor checked again: it is known's value,
    shared."""
    got = None
    if raw[:3] != b"\xef\xbb\xbf" and not (
        b"\x00" in raw[:4] or raw[:2] in (b"\xff\xfe", b"\xfe\xff")
    ):
        try:
            got = _split(raw.decode("utf-8", "surrogatepass"), field, known)
        except UnicodeDecodeError:
            got = None
    if got is None:
        return loads(raw), None
    value, split, fresh, taken = got
    what = "the request body"
    for k in value:
        if _bad_text(k):
            raise RequestError(
                f"{what} has a key with a lone UTF-16 surrogate (not valid Unicode)", "(top level)"
            )
    # every string parsed here is checked (scanning the raw bytes for surrogate escapes would
    # cost as much as the parse saved); a big member taken from `_MEMBERS` was checked then
    roots: list[tuple[object, int, object]] = []
    for k, v in value.items():
        if k == field and split is not None:
            where = (k, None)
            roots.extend((v[j], 2, (j, where)) for j in split.fresh)
        elif k not in taken:
            roots.append((v, 1, (k, None)))
    _check(roots, what, True)
    for k, member in fresh.items():
        _MEMBERS.keep(k, member, value[k])
    return value, split
