"""The MoE routing of ``claw.call/v1`` records (docs/formats.md, Routing store) as per-token rows
of a call's sample, for ``claw-rl logprobs``.

A call's ``routing`` names an array (T, L, K) in a routing file (``uint8`` or ``int16``, no -1)
covering tokens ``start .. start + T - 1`` of ``prompt_ids + completion_ids``, with
T = P + C - 1 - start (the last sampled token is never forwarded). The rows before ``start``
are the reused prefix of ``prefix.parent_call``: the parent's own rows there, recursively
through its parent. :class:`CallRoutes` resolves them over the calls of one file; a parent that
is not in the file (or has no routing) leaves those rows -1 (the learner routes them itself),
and is counted. A sample's rows are (P + C, L, K) int16; the last token's row is -1.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePath
from typing import Any

import attrs
import numpy as np

from claw_rl.errors import RecordError
from claw_rl.records import CALL_SCHEMA, ROUTING_MAGIC, Routing, _check_schema

_DTYPES = ("uint8", "int16")


def _int(value: Any, field: str, where: str, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise RecordError(f"{where}: field {field!r} must be an integer >= {low}, got {value!r}")
    return value


def call_prefix(row: dict, where: str) -> tuple[int, str | None]:
    """``(prefix.reused_tokens, prefix.parent_call)`` of a call (absent: 0, None)."""
    prefix = row.get("prefix")
    if prefix is None:
        return 0, None
    if not isinstance(prefix, dict):
        raise RecordError(f"{where}: field 'prefix' must be an object, got {prefix!r:.40}")
    reused = prefix.get("reused_tokens")
    reused = 0 if reused is None else _int(reused, "prefix.reused_tokens", where, 0)
    parent = prefix.get("parent_call")
    if parent is not None and (not isinstance(parent, str) or not parent):
        raise RecordError(
            f"{where}: field 'prefix.parent_call' must be a non-empty string or null, got "
            f"{parent!r:.40}"
        )
    return reused, parent


@attrs.frozen(kw_only=True)
class CallRef:
    """A call's validated ``routing``: the array (as a :class:`~claw_rl.records.Routing`
    reference; ``load`` checks magic, size and values), its ``start`` and the call's parent."""

    routing: Routing
    start: int
    parent: str | None
    tokens: tuple[int, ...]  # prompt_ids + completion_ids


def call_routing(row: dict, where: str, base: Path, tokens: tuple[int, ...]) -> CallRef | None:
    """Validate a call's ``routing`` reference (no file access); None when it has none.
    ``base``: the directory of the calls file (a relative ``routing.file`` lies there)."""
    ref = row.get("routing")
    if ref is None:
        return None
    if not isinstance(ref, dict):
        raise RecordError(f"{where}: field 'routing' must be an object, got {ref!r:.40}")
    for key in ("file", "offset", "shape", "dtype", "experts"):
        if key not in ref:
            raise RecordError(f"{where}: missing required field 'routing.{key}'")
    file = ref["file"]
    if not isinstance(file, str) or not file:
        raise RecordError(f"{where}: field 'routing.file' must be a non-empty string")
    if ".." in PurePath(file).parts:
        raise RecordError(f"{where}: field 'routing.file' = {file!r} has a '..' component")
    offset = _int(ref["offset"], "routing.offset", where, len(ROUTING_MAGIC))
    shape = ref["shape"]
    ok = isinstance(shape, list) and len(shape) == 3
    ok = ok and all(isinstance(x, int) and not isinstance(x, bool) for x in shape)
    if not ok or shape[0] < 0 or shape[1] < 1 or shape[2] < 1:
        raise RecordError(
            f"{where}: field 'routing.shape' must be [T, L, K] (ints, L and K >= 1), got {shape!r}"
        )
    if ref["dtype"] not in _DTYPES:
        raise RecordError(
            f"{where}: field 'routing.dtype' is {ref['dtype']!r}, not one of {', '.join(_DTYPES)}"
        )
    experts = _int(ref["experts"], "routing.experts", where, 1)
    start = _int(ref.get("start", 0), "routing.start", where, 0)
    reused, parent = call_prefix(row, where)
    if start > 0 and parent is None:
        raise RecordError(
            f"{where}: field 'routing.start' = {start} > 0 without prefix.parent_call"
        )
    if start > reused:
        raise RecordError(
            f"{where}: field 'routing.start' = {start} exceeds prefix.reused_tokens ({reused})"
        )
    want = len(tokens) - 1 - start
    if shape[0] != want:
        raise RecordError(
            f"{where}: field 'routing.shape' = {shape}: {shape[0]} rows, but prompt_ids + "
            f"completion_ids hold {len(tokens)} tokens: T = {len(tokens)} - 1 - start ({start}) "
            f"= {want}"
        )
    path = Path(file) if os.path.isabs(file) else base / file
    routing = Routing(file=file, path=path, offset=offset, shape=tuple(shape),
                      dtype=ref["dtype"], experts=experts, where=where)  # fmt: skip
    return CallRef(routing=routing, start=start, parent=parent, tokens=tokens)


def _own_rows(ref: CallRef) -> np.ndarray:
    """The call's stored rows (T, L, K) int16: experts in [0, E), never -1."""
    a = ref.routing.load()
    unset = np.argwhere(a < 0)
    if len(unset):
        t, layer, _ = (int(x) for x in unset[0])
        raise RecordError(
            f"{ref.routing.where}: field 'routing': token {ref.start + t}, MoE layer {layer} holds "
            "-1; a call records every row it forwarded (-1 is for samples only)"
        )
    return a


@attrs.define
class CallRoutes:
    """The routing rows of the calls of one file, each call's rows before ``routing.start``
    taken from its ``prefix.parent_call`` chain. ``missing`` counts the calls whose parent is
    not in the file or has no routing, ``unrouted`` the tokens they leave -1."""

    base: Path
    rows_by_id: dict[str, tuple[str, dict]] = attrs.field(factory=dict)  # call_id -> (where, row)
    missing: int = 0
    unrouted: int = 0
    _refs: dict[str, CallRef | None] = attrs.field(factory=dict)
    _resolved: dict[str, np.ndarray] = attrs.field(factory=dict)

    def add(self, where: str, row: dict) -> None:
        """Index one call line (the first line of a repeated call_id is kept)."""
        cid = row.get("call_id")
        if isinstance(cid, str) and cid and cid not in self.rows_by_id:
            self.rows_by_id[cid] = (where, row)

    def _ref(self, cid: str) -> CallRef | None:
        if cid not in self._refs:
            where, row = self.rows_by_id[cid]
            _check_schema(row, CALL_SCHEMA, where)
            tokens = tuple(row.get("prompt_ids") or ()) + tuple(row.get("completion_ids") or ())
            self._refs[cid] = call_routing(row, where, self.base, tokens)
        return self._refs[cid]

    def rows(self, cid: str) -> Routing | None:
        """The call's rows (P + C, L, K) int16 as an in-memory sample routing (-1: the last
        token, and a reused prefix whose parent is missing); None when it has no routing."""
        ref = self._ref(cid)
        if ref is None:
            return None
        a = self._resolve(cid, ref)
        return attrs.evolve(ref.routing, file="", path=None, offset=0, shape=a.shape,
                            dtype="int16", array=a)  # fmt: skip

    def _resolve(self, cid: str, ref: CallRef) -> np.ndarray:
        """Resolve ``cid``'s chain from its oldest unresolved ancestor down (no recursion: a
        session's chain can be hundreds of calls long)."""
        chain: list[tuple[str, CallRef]] = []
        seen: set[str] = set()
        cur: str | None = cid
        cur_ref: CallRef | None = ref
        while cur is not None and cur_ref is not None and cur not in self._resolved:
            if cur in seen:
                raise RecordError(
                    f"{ref.routing.where}: field 'prefix.parent_call': a cycle at {cur!r}"
                )
            seen.add(cur)
            chain.append((cur, cur_ref))
            parent = cur_ref.parent if cur_ref.start > 0 else None
            cur = parent if parent in self.rows_by_id else None
            cur_ref = self._ref(cur) if cur is not None else None
        for c, r in reversed(chain):
            self._resolved[c] = self._full_rows(r)
        return self._resolved[cid]

    def _full_rows(self, ref: CallRef) -> np.ndarray:
        """(P + C, L, K) int16 of one call whose parent (if any) is resolved already."""
        r = ref.routing
        out = np.full((len(ref.tokens), r.layers, r.top_k), -1, dtype=np.int16)
        out[ref.start : len(ref.tokens) - 1] = _own_rows(ref)
        if ref.start == 0:
            return out
        assert ref.parent is not None  # call_routing: start > 0 needs a parent
        parent = self._resolved.get(ref.parent)
        if parent is None:  # not in the file, or no routing: the learner routes these
            self.missing += 1
            self.unrouted += ref.start
            return out
        p_ref = self._refs[ref.parent]
        assert p_ref is not None
        if p_ref.tokens[: ref.start] != ref.tokens[: ref.start]:
            raise RecordError(
                f"{r.where}: field 'prefix.parent_call': the first {ref.start} tokens "
                f"(routing.start) are not those of {ref.parent!r} ({p_ref.routing.where})"
            )
        dims, p_dims = (r.layers, r.top_k, r.experts), (p_ref.routing.layers,
                        p_ref.routing.top_k, p_ref.routing.experts)  # fmt: skip
        if dims != p_dims:
            raise RecordError(
                f"{r.where}: field 'routing': {dims[0]} MoE layers x top {dims[1]} of {dims[2]} "
                f"experts, but its parent {ref.parent!r} ({p_ref.routing.where}) has {p_dims[0]} "
                f"x top {p_dims[1]} of {p_dims[2]}"
            )
        out[: ref.start] = parent[: ref.start]
        self.unrouted += int((out[: ref.start, 0, 0] < 0).sum())
        return out
