"""RL samples from a calls file larger than memory: index it once, build one unit at a time.

:func:`index_calls` reads `calls.jsonl` (and its shards) once, validating every line as
:func:`~claw_tree.records.read_calls` does, and keeps per call only where its line starts, its
session and a hash of its call_id, and per session its flat tokens, its longest call and
whether it holds a trainable token. A call_id recorded twice with different content is the
:class:`~claw_tree.errors.ConflictError` of :func:`~claw_tree.tree.build_forest` (the first one in
file order), found by re-reading only the lines whose call_id hashes collide.

:func:`stream_indexed_samples` then computes what the whole batch needs before the first row
(the votes and group statistics from the outcomes; the kept sessions from the index; for
``weighting="path"`` the number of kept paths, and with ``max_tokens`` the check that no kept
path exceeds the budget, by building the sessions concerned one at a time) and makes the samples
unit by unit: a run of whole sessions (``pack="session"``), groups (``"group"``) or harness
buckets (``"batch"``) of about :data:`UNIT_TOKENS` flat tokens (a call counting
:data:`CALL_TOKENS` more: many small calls weigh more than their tokens), whose calls are read
back by offset and built into a forest of their own. With ``max_tokens`` the greedy packing runs on
across units: the sample still open at the end of a unit is not written; its sessions (from the
piece it starts with) are built again with the next unit, where packing resumes from that
sample's start exactly as it would have. Peak memory is that of the largest unit (at least one
session, group or bucket, whichever ``pack`` keeps whole) plus the index, not of the corpus.

The rows are those of :func:`~claw_tree.samples.stream_samples` over the whole forest, byte for
byte (tests/test_streaming.py). PPO (GAE over the forest, values matched to every sample) and
stdin are not streamed: `claw-tree samples` builds the forest in memory for them.
"""

from __future__ import annotations

import array
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any

import attrs
import numpy as np

from claw_tree._packing import (
    Kept,
    Piece,
    fill_merged,
    lay_out,
    outcomes_by_session,
    pieces,
    plan_groups,
    plan_sessions,
    trainable_sessions,
)
from claw_tree.errors import ClawError, ConflictError, RecordError
from claw_tree.options import SampleOptions
from claw_tree.records import Call, Outcome, parse_line, shard_path
from claw_tree.routing import RoutingOut, store_routing
from claw_tree.samples import SampleBatch, _group_key, _sample_row, _Votes, _votes, _weights
from claw_tree.tree import Forest, build_forest, conflict

__all__ = [
    "CALL_TOKENS",
    "UNIT_TOKENS",
    "CallIndex",
    "index_calls",
    "stream_file_samples",
    "stream_indexed_samples",
]

UNIT_TOKENS = 1 << 23  # flat tokens per unit (~140 MB at ~17 bytes a flat token)
CALL_TOKENS = 200  # what one call's record and tree objects weigh, in flat tokens (~3 KB)


@attrs.frozen(kw_only=True, eq=False)
class CallIndex:
    """Where every valid call of a calls file (series) lies, and what the batch needs of them.

    Per call, in file order (shape (C,)): ``part`` (index into ``parts``), ``offset`` (byte
    offset of its line), ``session`` (index into ``names``). Per session (shape (S,)):
    ``calls``, ``flat_tokens``, ``longest`` (its longest prompt + completion: no path is longer),
    ``trainable`` (some trainable call generated a non-root token: the session has trainable
    tokens). ``skipped``: the invalid lines skipped (``skip_invalid``)."""

    parts: tuple[Path, ...]
    part: np.ndarray
    offset: np.ndarray
    session: np.ndarray
    names: list[str]
    calls: np.ndarray
    flat_tokens: np.ndarray
    longest: np.ndarray
    trainable: np.ndarray
    skipped: list[str]
    routed: bool = False  # some call has MoE routing (and it is read: routing=True)
    routing: bool = True  # read the calls' routing into the forests (False: ignore it)
    routing_dir: Path | None = None  # where relative routing files lie (None: next to each part)
    ids: dict[str, int] = attrs.field(init=False)
    _order: np.ndarray = attrs.field(init=False)  # calls by session, file order within one
    _bounds: np.ndarray = attrs.field(init=False)  # (S + 1,) session s: _order[b[s]:b[s + 1]]

    def __attrs_post_init__(self) -> None:
        order = np.argsort(self.session, kind="stable")
        bounds = np.searchsorted(self.session[order], np.arange(len(self.names) + 1))
        object.__setattr__(self, "ids", {name: i for i, name in enumerate(self.names)})
        object.__setattr__(self, "_order", order)
        object.__setattr__(self, "_bounds", bounds)

    def lines(self, sessions: Iterable[str]) -> np.ndarray:
        """The calls (indices) of these sessions, in file order."""
        ids = [self.ids[name] for name in sessions]
        parts = [self._order[self._bounds[s] : self._bounds[s + 1]] for s in ids]
        return np.sort(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)

    def read(self, lines: Iterable[int]) -> Iterator[Call]:
        """The calls at these indices, parsed again from their lines."""
        with ExitStack() as stack:
            files: dict[int, IO[bytes]] = {}
            for i in lines:
                p = int(self.part[i])
                if p not in files:
                    files[p] = stack.enter_context(self.parts[p].open("rb"))
                files[p].seek(int(self.offset[i]))
                where = f"{self.parts[p]}@{int(self.offset[i])}"
                row = parse_line(files[p].readline(), where)
                if isinstance(row, RecordError):
                    raise row  # the file changed since it was indexed
                yield Call.from_dict(row, where, self.routing_dir or self.parts[p].parent)

    def forest(self, sessions: Iterable[str]) -> Forest:
        """The prefix forest of these sessions alone."""
        return build_forest(self.read(self.lines(sessions).tolist()), routing=self.routing)


@attrs.define
class _Indexer:
    part: array.array = attrs.Factory(lambda: array.array("h"))
    offset: array.array = attrs.Factory(lambda: array.array("q"))
    session: array.array = attrs.Factory(lambda: array.array("i"))
    call_hash: array.array = attrs.Factory(lambda: array.array("q"))
    ids: dict[str, int] = attrs.Factory(dict)
    calls: list[int] = attrs.Factory(list)
    flat: list[int] = attrs.Factory(list)
    longest: list[int] = attrs.Factory(list)
    trainable: list[bool] = attrs.Factory(list)
    routed: bool = False

    def add(self, call: Call, part: int, offset: int) -> None:
        s = self.ids.setdefault(call.session, len(self.ids))
        if s == len(self.flat):
            self.calls.append(0)
            self.flat.append(0)
            self.longest.append(0)
            self.trainable.append(False)
        p, c = len(call.prompt_ids), len(call.completion_ids)
        self.calls[s] += 1
        self.flat[s] += p + c
        self.longest[s] = max(self.longest[s], p + c)
        if call.trainable and c > 0 and p + c > max(p, 1):  # a non-root generated token
            self.trainable[s] = True
        self.part.append(part)
        self.offset.append(offset)
        self.session.append(s)
        self.call_hash.append(hash(call.call_id))
        self.routed = self.routed or call.routing is not None


def _parts(path: Path) -> list[Path]:
    if not path.exists():
        raise RecordError(f"{path}: no such file")
    parts = [path]
    while shard_path(path, len(parts)).exists():
        parts.append(shard_path(path, len(parts)))
    return parts


def index_calls(
    path: str | Path,
    *,
    skip_invalid: bool = False,
    routing: bool = True,
    routing_dir: str | Path | None = None,
) -> CallIndex:
    """Index a calls file and its shards (``calls.jsonl``, ``calls.00001.jsonl``, ...) in one
    pass: the errors of :func:`~claw_tree.records.read_calls` and
    :func:`~claw_tree.tree.build_forest` (invalid lines, conflicting call_ids), none of the
    token ids kept. Each shard's relative routing files lie next to it (or in ``routing_dir``);
    ``routing=False`` ignores the calls' routing."""
    parts = _parts(Path(path))
    routing_base = None if routing_dir is None else Path(routing_dir)
    ix = _Indexer()
    skipped: list[str] = []
    for k, part in enumerate(parts):
        with part.open("rb") as fh:
            at = 0
            for lineno, line in enumerate(fh, start=1):
                start, at = at, at + len(line)
                if not line.strip():
                    continue
                where = f"{part}:{lineno}"
                try:
                    row = parse_line(line, where)
                    if isinstance(row, RecordError):
                        raise row
                    ix.add(Call.from_dict(row, where, routing_base or part.parent), k, start)
                except RecordError as exc:
                    if not skip_invalid:
                        raise
                    skipped.append(str(exc))
    index = CallIndex(
        parts=tuple(parts),
        part=np.frombuffer(ix.part, dtype=np.int16),
        offset=np.frombuffer(ix.offset, dtype=np.int64),
        session=np.frombuffer(ix.session, dtype=np.int32),
        names=list(ix.ids),
        calls=np.array(ix.calls, dtype=np.int64),
        flat_tokens=np.array(ix.flat, dtype=np.int64),
        longest=np.array(ix.longest, dtype=np.int64),
        trainable=np.array(ix.trainable, dtype=bool),
        skipped=skipped,
        routed=routing and ix.routed,
        routing=routing,
        routing_dir=routing_base,
    )
    _check_conflicts(index, np.frombuffer(ix.call_hash, dtype=np.int64))
    return index


def _check_conflicts(index: CallIndex, call_hash: np.ndarray) -> None:
    """Raise build_forest's ConflictError for the first call (in file order) whose call_id was
    recorded before with different content; only calls whose call_id hashes collide are read."""
    order = np.argsort(call_hash, kind="stable")
    h = call_hash[order]
    cuts = np.flatnonzero(h[1:] != h[:-1]) + 1
    bounds = np.concatenate(([0], cuts, [len(h)]))
    first: tuple[int, ConflictError] | None = None
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        if b - a < 2:
            continue
        lines = order[a:b].tolist()  # ascending: the sort is stable
        seen: dict[str, Call] = {}
        for line, call in zip(lines, index.read(lines), strict=True):
            prior = seen.setdefault(call.call_id, call)
            if prior is not call and not prior.same_content(call):
                if first is None or line < first[0]:
                    first = (line, conflict(prior, call))
                break
    if first is not None:
        raise first[1]


@attrs.frozen(kw_only=True, eq=False)
class _Batch:
    """What every unit needs of the whole batch."""

    votes: _Votes
    order: list[tuple[str, str]]  # kept sessions in plan order, with the key kept whole
    n_kept: int
    n_paths: int | None  # kept paths (counted first only for weighting="path")


def _plan_order(kept: list[str], votes: _Votes, opts: SampleOptions) -> list[tuple[str, str]]:
    """The kept sessions (in name order) in the order the plan takes them: by name, group after
    group (groups by their first session) or harness after harness (harnesses by their first
    session in that group order); each with the key whose run stays in one sample without a
    budget (the session, its group, its harness)."""
    by = votes.by_session
    if opts.pack == "session":
        return [(name, name) for name in kept]
    groups: dict[str, list[str]] = {}
    for name in kept:
        groups.setdefault(_group_key(by[name], opts.group_by), []).append(name)
    if opts.pack == "group":
        return [(name, g) for g, members in groups.items() for name in members]
    buckets: dict[str, list[str]] = {}
    for members in groups.values():
        for name in members:
            buckets.setdefault(by[name].harness, []).append(name)
    return [(name, h) for h, members in buckets.items() for name in members]


def _count_paths(index: CallIndex, batch: _Batch, opts: SampleOptions) -> int | None:
    """Build, one at a time, the sessions the batch needs first: every kept one for
    ``weighting="path"`` (its kept paths counted), and with ``max_tokens`` those with a call
    longer than the budget (a kept path that is longer is the plan's BudgetError, raised before
    any row as :func:`~claw_tree.samples.stream_samples` does). Returns the kept paths, or
    None when they were not counted."""
    budget = opts.max_tokens
    count = opts.weighting == "path"
    n_paths = 0
    for name, _ in batch.order:
        long = budget is not None and int(index.longest[index.ids[name]]) > budget
        if not (count or long):
            continue
        forest = index.forest([name])
        (k,), _ = trainable_sessions(forest, {})
        n_paths += len(k.paths)
        if long:
            pieces(forest, k, budget)
    return n_paths if count else None


def _units(
    batch: _Batch, index: CallIndex, opts: SampleOptions, unit_tokens: int
) -> list[list[str]]:
    """Runs of ``batch.order`` of about ``unit_tokens`` flat tokens (a call counting
    :data:`CALL_TOKENS` more); without a budget a run holds whole keys (sessions, groups,
    harness buckets: one sample each)."""
    units: list[list[str]] = []
    unit: list[str] = []
    size = 0
    last = None
    for name, key in batch.order:
        if unit and size >= unit_tokens and (opts.max_tokens is not None or key != last):
            units.append(unit)
            unit, size = [], 0
        unit.append(name)
        s = index.ids[name]
        size += int(index.flat_tokens[s]) + CALL_TOKENS * int(index.calls[s])
        last = key
    if unit:
        units.append(unit)
    return units


Pending = list[tuple[str, int]]  # the open sample's sessions, each from its piece number


def _unit_plans(
    forest: Forest,
    kept: list[Kept],
    skip: int,
    keys: dict[str, str],
    opts: SampleOptions,
    final: bool,
) -> tuple[list[list[Piece]], Pending]:
    """The unit's samples (plans), and the sample left open at its end (not in the plans; none
    when ``final``). ``skip``: pieces of the first session already written."""
    budget = opts.max_tokens
    if budget is None:
        if opts.pack == "session":
            return plan_sessions(forest, kept, None), []
        return plan_groups(forest, kept, lambda tree: keys[tree.name], None), []
    if opts.pack == "session":  # an open sample holds whole sessions within the budget
        plans = plan_sessions(forest, kept, budget)
        if final or plans[-1][0][0].n_nodes > budget:
            return plans, []
        return plans[:-1], [(tree.name, 0) for tree, _, _ in plans[-1]]
    tagged = [(k.tree.name, j, p) for k in kept for j, p in enumerate(pieces(forest, k, budget))]
    tagged = tagged[skip:]
    plans = fill_merged(forest, [p for _, _, p in tagged], budget)
    if final:
        return plans, []
    rest = tagged[len(tagged) - len(plans[-1]) :]
    pending: Pending = [(rest[0][0], rest[0][1])]
    for name, _, _ in rest[1:]:
        if name != pending[-1][0]:
            pending.append((name, 0))
    return plans[:-1], pending


def _rows(
    index: CallIndex, batch: _Batch, opts: SampleOptions, unit_tokens: int
) -> Iterator[dict[str, Any]]:
    """The samples, unit by unit (the open sample's sessions built again with the next unit)."""
    keys = dict(batch.order)
    units = _units(batch, index, opts, unit_tokens)
    pending: Pending = []
    first = 0
    for u, unit in enumerate(units):
        names = [name for name, _ in pending] + unit
        forest = index.forest(names)
        kept_by = {k.tree.name: k for k in trainable_sessions(forest, batch.votes.excluded)[0]}
        kept = [kept_by[name] for name in names]
        skip = pending[0][1] if pending else 0
        plans, pending = _unit_plans(forest, kept, skip, keys, opts, u == len(units) - 1)
        weights = _weights(forest, kept, opts.weighting, n_kept=batch.n_kept, n_paths=batch.n_paths)
        merge = opts.pack != "session"
        for p in lay_out(forest, plans, opts.prefix, merge=merge, first=first):
            yield _sample_row(forest, p, batch.votes, weights, None, opts)
        first += len(plans)
        del forest, kept_by, kept, plans, weights


def stream_indexed_samples(
    index: CallIndex,
    outcomes: Iterable[Outcome | dict] | str | Path,
    options: SampleOptions | None = None,
    *,
    unit_tokens: int = UNIT_TOKENS,
    routing_out: RoutingOut = None,
    **fields: Any,
) -> tuple[SampleBatch, Iterator[dict]]:
    """:func:`~claw_tree.samples.stream_samples` over the indexed calls, built one unit of
    about ``unit_tokens`` flat tokens at a time (see the module docstring). The same batch
    (``trajectories`` is -1 unless ``weighting="path"``: count the rows with a
    :class:`~claw_tree.samples.SampleTally`) and the same rows, byte for byte. Errors (options,
    outcomes, a path over the budget) are raised before it returns. Not for PPO.
    ``routing_out``: where MoE routing goes (see :func:`~claw_tree.samples.build_samples`)."""
    opts = SampleOptions.resolve(options, fields)
    if opts.algo in ("sft", "ppo"):
        raise ClawError(
            f"algo {opts.algo!r} is not streamed from an index: build the forest "
            "(stream_samples / stream_sft_samples)"
        )
    votes = _votes(set(index.names), outcomes_by_session(outcomes), opts)
    excluded = dict(votes.excluded)
    kept: list[str] = []
    for name in sorted(index.names):
        if name in excluded:
            continue
        if index.trainable[index.ids[name]]:
            kept.append(name)
        else:
            excluded[name] = "no trainable tokens"
    batch = _Batch(
        votes=votes, order=_plan_order(kept, votes, opts), n_kept=len(kept), n_paths=None
    )
    batch = attrs.evolve(batch, n_paths=_count_paths(index, batch, opts))
    head = SampleBatch(
        samples=[],
        excluded=excluded,
        rollouts=len(votes.voters),
        trajectories=-1 if batch.n_paths is None else batch.n_paths,
        zero_spread_groups=votes.zero_spread,
    )
    rows = _rows(index, batch, opts, unit_tokens)
    return head, store_routing(rows, index.routed, routing_out)


def stream_file_samples(
    calls: str | Path,
    outcomes: Iterable[Outcome | dict] | str | Path,
    options: SampleOptions | None = None,
    *,
    skip_invalid: bool = False,
    unit_tokens: int = UNIT_TOKENS,
    routing_out: RoutingOut = None,
    **fields: Any,
) -> tuple[SampleBatch, Iterator[dict]]:
    """:func:`stream_indexed_samples` over ``index_calls(calls)``: samples from a calls file
    (series) with memory bounded by the largest unit, not the corpus."""
    index = index_calls(calls, skip_invalid=skip_invalid, routing=routing_out is not False)
    return stream_indexed_samples(
        index, outcomes, options, unit_tokens=unit_tokens, routing_out=routing_out, **fields
    )
