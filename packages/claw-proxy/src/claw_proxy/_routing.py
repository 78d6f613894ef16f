"""Which rows of an MoE call's routing the proxy stores: a call that reuses a recorded call's
prefix stores only its own rows (`routing.start`), so a prefix's routing is stored once."""

from __future__ import annotations

import logging
from collections import OrderedDict
from pathlib import Path

import attrs

from claw_proxy.errors import RecordError
from claw_proxy.routing import RoutingRows, read_routing

log = logging.getLogger("claw_proxy.routing")


@attrs.frozen
class _Stored:
    covered: int  # tokens 0 .. covered-1 of the call have routing (its own rows and its parents')
    policy: tuple  # (name, version) that routed them
    ref: dict  # the call's `routing` reference


class RoutingLedger:
    """The routing references of the calls recorded lately (by call id, up to `max_calls`), and
    counts in the proxy's `stats`: ``routing_calls``, ``routing_rows`` and ``routing_bytes``
    stored, ``routing_missing`` (an MoE call recorded without routing: the engine sent none
    or too few rows), ``routing_prefix_mismatch_calls`` / ``_rows`` (a call's recomputed
    prefix rows that differ from what its parent call stored; the parent's are kept)."""

    def __init__(self, stats: dict, max_calls: int = 1 << 16) -> None:
        self.stats = stats
        for k in ("calls", "rows", "bytes", "missing", "prefix_mismatch_calls"):
            stats[f"routing_{k}"] = 0
        stats["routing_prefix_mismatch_rows"] = 0
        self.max_calls = max_calls
        self._calls: OrderedDict[str, _Stored] = OrderedDict()

    def rows(self, gen, call, reused_tokens: int, record: Path) -> RoutingRows | None:
        """The rows of `call` to store from its generation's routing (None: none to store).
        `start` is the reused prefix's length where the parent call's routing is known and
        was routed by the same policy version (capped at what the parent covers), else 0."""
        got = gen.routing
        n = len(call.prompt_ids) + len(call.completion_ids) - 1  # the tokens forwarded
        if got is None or n < 0 or len(got) < n:
            if gen.routes:
                self.stats["routing_missing"] += 1
            return None
        start = 0
        parent = self._calls.get(call.prefix.get("parent_call") or "")
        if parent is not None and parent.policy == _policy(call.policy):
            start = min(reused_tokens, parent.covered)
            self._check(parent, got, start, record, call.call_id)
        return RoutingRows(rows=got[start:n], experts=int(gen.experts), start=start)

    def remember(self, call, rows: RoutingRows) -> None:
        """Keep a recorded call's reference (`rows.ref`, set by the writer) and count it."""
        ref = rows.ref
        if ref is None:
            return
        self._calls[call.call_id] = _Stored(ref["shape"][0] + rows.start, _policy(call.policy), ref)
        while len(self._calls) > self.max_calls:
            self._calls.popitem(last=False)
        self.stats["routing_calls"] += 1
        self.stats["routing_rows"] += ref["shape"][0]
        self.stats["routing_bytes"] += rows.rows.nbytes

    def _check(self, parent: _Stored, got, start: int, record: Path, call_id: str) -> None:
        """Count the reused rows this engine recomputed differently from the parent's own."""
        lo = parent.ref.get("start", 0)
        if start <= lo:
            return
        try:
            stored = read_routing(record, {"routing": parent.ref})[: start - lo]
        except RecordError as e:  # the parent's bytes are gone: nothing to compare with
            log.debug("routing of the parent of %s not readable: %s", call_id, e)
            return
        differ = int((stored != got[lo:start]).any(axis=(1, 2)).sum())
        if differ:
            self.stats["routing_prefix_mismatch_calls"] += 1
            self.stats["routing_prefix_mismatch_rows"] += differ
            log.debug(
                "%s: %d of %d reused tokens routed differently from the parent call's record",
                call_id,
                differ,
                start - lo,
            )


def _policy(p: dict) -> tuple:
    return (p.get("name"), p.get("version"))
