"""Per-session memory of the last request's messages, so re-sent history is not parsed again.

An agent re-sends its whole history on every turn. The body's `messages` elements are read as
JSON text against the session's previous request (`_jsonbody.loads_split`): an element whose
text is the previous request's element at the same index is the same value, so it is neither
parsed nor checked again, and the API parser takes the `Message` objects it became then (with
their prefix-reuse keys already computed). Anything else (an edited, inserted or reordered
message, another API) is parsed afresh: the work follows the new messages, and the result is
the same as a plain parse.

Memory is bounded by `max_bytes` (least recently used sessions are forgotten first); a
forgotten session only loses speed.
"""

from __future__ import annotations

from collections import OrderedDict

from claw_proxy._jsonbody import Split
from claw_proxy.messages import ChatRequest, Message

_MESSAGE_BYTES = 300  # a message's own objects, near enough


class _Entry:
    __slots__ = ("api", "groups", "nbytes", "split")

    def __init__(self, api: str, split: Split, groups: tuple[tuple[Message, ...], ...]):
        self.api, self.split, self.groups = api, split, groups
        # the text, and the values' strings (the Messages share them)
        self.nbytes = 2 * len(split.region) + _MESSAGE_BYTES * len(split.spans)


class ParseMemo:
    """Session -> its last parsed request's messages: their text and values (a `Split`) and
    the Messages each became. Used from the event loop only."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._sessions: OrderedDict[str, _Entry] = OrderedDict()
        self.reused = 0  # messages taken from an earlier request, so far
        self.parsed = 0  # messages parsed afresh

    def known(self, session: str) -> Split:
        """The messages of the session's last request (an empty Split when none)."""
        e = self._sessions.get(session)
        return e.split if e is not None else Split()

    def reuse(
        self, session: str, api: str, split: Split, known: Split
    ) -> list[tuple[Message, ...] | None]:
        """For each message of `split` (read against `known`), the Messages it became in the
        session's last request when it was taken from there (same API), else None."""
        e = self._sessions.get(session)
        out: list[tuple[Message, ...] | None] = []
        if e is not None and e.split is known and e.api == api:
            out = list(e.groups[: len(split.spans)])
            for j in split.fresh:
                if j < len(out):
                    out[j] = None
        hits = sum(1 for g in out if g is not None)
        self.reused += hits
        self.parsed += len(split.spans) - hits
        return out

    def remember(self, session: str, req: ChatRequest, split: Split) -> None:
        """Keep this request's messages: their text and values, and what they parsed to."""
        if len(req.message_groups) != len(split.spans):
            return  # the parser did not follow these elements (not reusable)
        old = self._sessions.pop(session, None)
        if old is not None:
            self.nbytes -= old.nbytes
        e = _Entry(req.api, split, req.message_groups)
        if e.nbytes > self.max_bytes:
            return
        self._sessions[session] = e
        self.nbytes += e.nbytes
        while self.nbytes > self.max_bytes:
            _, cold = self._sessions.popitem(last=False)
            self.nbytes -= cold.nbytes

    def forget(self, session: str) -> None:
        old = self._sessions.pop(session, None)
        if old is not None:
            self.nbytes -= old.nbytes

    def stats(self) -> dict:
        return {
            "bytes": self.nbytes,
            "max_bytes": self.max_bytes,
            "sessions": len(self._sessions),
            "reused_messages": self.reused,
            "parsed_messages": self.parsed,
        }
