"""The records claw-tree reads (`claw.call/v1`, `claw.outcome/v1`) and JSONL input/output.

Readers reject malformed lines and unknown schema versions with the file name and line number.
With ``skip_invalid=True`` they skip such lines instead and count them, with the reason, in the
returned :class:`ReadResult` (never silently).

Reader kinds (docs/formats.md, Readers; held to formats/conformance by tests/test_conformance.py):
:meth:`Outcome.from_dict` is *strict* (every field of `claw.outcome/v1` is validated);
:meth:`Call.from_dict` is a *projection*: it validates exactly the fields it reads (`CALL_READS`)
and accepts anything in the others (api, timings, usage, raw request/response). Both accept
unknown fields. Blank lines are skipped; ``NaN`` / ``Infinity`` are not JSON and are rejected.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

import attrs
import numpy as np

from claw_tree.errors import RecordError
from claw_tree.routing import RoutingRef, parse_routing

CALL_SCHEMA = "claw.call/v1"
OUTCOME_SCHEMA = "claw.outcome/v1"
SAMPLE_SCHEMA = "claw.sample/v1"
OUTCOME_STATUSES = ("ok", "infra_error", "not_scorable")
FINISH_REASONS = ("stop", "length", "tool_calls", "error")
# the claw.call/v1 fields Call.from_dict reads (and so validates); it ignores all others
CALL_READS = (
    "schema",
    "call_id",
    "session",
    "seq",
    "model",
    "policy.name",
    "policy.version",
    "trainable",
    "prompt_ids",
    "completion_ids",
    "completion_logprobs",
    "completion_kept",
    "finish_reason",
    "tags",
    "prefix.reused_tokens",
    "prefix.fresh_render_matches",
    "prefix.fork_reason",
    "prefix.fork_of",
    "prefix.parent_call",
    "sampling.temperature",
    "sampling.top_p",
    "sampling.top_k",
    "routing",
)
_MAX_TOKEN_ID = 2**31 - 1

T = TypeVar("T")


def _require(row: dict, field: str, types: type | tuple[type, ...], where: str) -> Any:
    if field not in row:
        raise RecordError(f"{where}: {field}: missing required field")
    value = row[field]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
        raise RecordError(f"{where}: {field}: expected {_type_names(types)}, got {value!r:.60}")
    return value


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def _type_names(types: type | tuple[type, ...]) -> str:
    names = {
        int: "integer",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
        bool: "boolean",
        type(None): "null",
    }
    kinds = [t for t in _as_tuple(types) if not (t is int and float in _as_tuple(types))]
    return " or ".join(names.get(t, t.__name__) for t in kinds)


def _check_schema(row: dict, expected: str, where: str) -> None:
    schema = row.get("schema")
    if schema != expected:
        if isinstance(schema, str) and schema.split("/")[0] == expected.split("/")[0]:
            raise RecordError(
                f"{where}: schema: unsupported version {schema!r} (this reader knows {expected!r})"
            )
        raise RecordError(f"{where}: schema: expected {expected!r}, got {schema!r}")


def token_array(values: Any, field: str, where: str) -> np.ndarray:
    """A JSON list of token ids as an int32 array (ids lie in [0, 2**31): 4 bytes a token, half
    of int64, which matters at corpus scale); anything but non-negative ints is an error."""
    if isinstance(values, np.ndarray):
        if values.ndim != 1 or (values.size and values.dtype.kind not in "iu"):
            raise RecordError(f"{where}: {field}: expected a 1-d integer array")
        arr = values.astype(np.int64, copy=False)
    else:
        if not isinstance(values, list):
            raise RecordError(f"{where}: {field}: expected array of integers, got {values!r:.60}")
        # the set of element types, built at C speed: exactly {int} (JSON true/false are bool)
        if not set(map(type, values)) <= {int}:
            bad = next(v for v in values if type(v) is not int)
            raise RecordError(f"{where}: {field}: token ids must be integers, found {bad!r:.40}")
        try:
            arr = np.fromiter(values, dtype=np.int64, count=len(values))
        except OverflowError:
            raise RecordError(f"{where}: {field}: token id out of range") from None
    if arr.size and (arr.min() < 0 or arr.max() > _MAX_TOKEN_ID):
        raise RecordError(f"{where}: {field}: token ids must lie in [0, 2**31)")
    return arr.astype(np.int32)


def _float_array(values: Any, field: str, where: str) -> np.ndarray:
    if isinstance(values, np.ndarray):
        arr = values.astype(np.float64, copy=False)
    else:
        if not isinstance(values, list):
            raise RecordError(f"{where}: {field}: expected array of numbers, got {values!r:.60}")
        if values and not set(map(type, values)) <= {int, float}:
            bad = next(v for v in values if type(v) not in (int, float))
            raise RecordError(f"{where}: {field}: expected numbers, found {bad!r:.40}")
        arr = np.fromiter(values, dtype=np.float64, count=len(values))
    if arr.ndim != 1 or not np.isfinite(arr).all():
        raise RecordError(
            f"{where}: {field}: expected a flat array of finite numbers (no NaN, no infinity)"
        )
    return arr


@attrs.frozen(kw_only=True, eq=False)
class Call:
    """One recorded model call (`claw.call/v1`), reduced to what the tree needs."""

    call_id: str
    session: str
    seq: int
    model: str
    policy_name: str
    policy_version: int
    trainable: bool
    prompt_ids: np.ndarray  # (P,) int32
    completion_ids: np.ndarray  # (C,) int32
    completion_logprobs: np.ndarray  # (C,) float64
    finish_reason: str
    tags: dict
    reused_tokens: int | None = None
    fresh_render_matches: bool | None = None
    # the proxy rendered this prompt fresh although the conversation continued call `fork_of`,
    # whose ids it could not reuse (why: `fork_reason`): the prompt may fork from that call's
    fork_reason: str | None = None
    fork_of: str | None = None
    parent_call: str | None = None  # the call whose ids this prompt reused (prefix.parent_call)
    # sampling settings the engine drew the completion with (absent in the record: 1 / 1 / 0)
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # 1 = off
    top_k: int = 0  # 0 = off
    # MoE policies: the experts the engine chose for tokens start .. of prompt + completion
    routing: RoutingRef | None = None
    # (C,) int64: each token's kept-set size less itself as the engine sampled it (-1:
    # untruncated); None when the record has no completion_kept
    completion_kept: np.ndarray | None = None

    @property
    def default_sampling(self) -> bool:
        """True when the call was sampled at temperature 1 without truncation."""
        return self.temperature == 1.0 and self.top_p == 1.0 and self.top_k == 0

    @classmethod
    def from_dict(cls, row: Any, where: str = "<call>", routing_dir: Path | None = None) -> Call:
        """Validate the fields of one `claw.call/v1` dict that the tree reads (`CALL_READS`: a
        projection reader); errors name `where` (file:line) and the field. ``routing_dir``: the
        directory a relative ``routing.file`` is resolved against (the calls file's; None: the
        working directory). The routing array itself is read when a forest is built."""
        if not isinstance(row, dict):
            raise RecordError(f"{where}: expected a JSON object, got {type(row).__name__}")
        _check_schema(row, CALL_SCHEMA, where)
        call_id = _require(row, "call_id", str, where)
        session = _require(row, "session", str, where)
        if not call_id or not session:
            raise RecordError(f"{where}: call_id and session must be non-empty")
        seq = _require(row, "seq", int, where)
        if seq < 0:
            raise RecordError(f"{where}: seq: must be >= 0, got {seq}")
        finish = _require(row, "finish_reason", str, where)
        if finish not in FINISH_REASONS:
            raise RecordError(
                f"{where}: finish_reason: {finish!r} is not one of {list(FINISH_REASONS)}"
            )
        model = _require(row, "model", str, where)
        policy = _require(row, "policy", dict, where)
        version = _require(policy, "version", int, f"{where}: policy")
        if version < 0:
            raise RecordError(f"{where}: policy: version: must be >= 0, got {version}")
        name = _require(policy, "name", str, f"{where}: policy")
        tags = _require(row, "tags", dict, where)
        trainable = row.get("trainable", True)
        if not isinstance(trainable, bool):
            raise RecordError(f"{where}: trainable: expected boolean, got {trainable!r}")
        prompt = token_array(
            _require(row, "prompt_ids", (list, np.ndarray), where), "prompt_ids", where
        )
        completion = token_array(
            _require(row, "completion_ids", (list, np.ndarray), where), "completion_ids", where
        )
        logprobs = _float_array(
            _require(row, "completion_logprobs", (list, np.ndarray), where),
            "completion_logprobs",
            where,
        )
        if len(logprobs) != len(completion):
            raise RecordError(
                f"{where}: completion_logprobs: has {len(logprobs)} entries but completion_ids has "
                f"{len(completion)} (call {call_id})"
            )
        kept = _kept_array(row.get("completion_kept"), len(completion), where)
        prefix = _prefix_fields(row.get("prefix"), where)
        temperature, top_p, top_k = _sampling(row.get("sampling"), where)
        routing = None
        if row.get("routing") is not None:
            routing = parse_routing(row["routing"], where, routing_dir)
            _check_routing_span(routing, len(prompt) + len(completion), prefix, where)
        return cls(
            call_id=call_id,
            session=session,
            seq=seq,
            model=model,
            policy_name=name,
            policy_version=version,
            trainable=trainable,
            prompt_ids=prompt,
            completion_ids=completion,
            completion_logprobs=logprobs,
            finish_reason=row["finish_reason"],
            tags=tags,
            **prefix,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            routing=routing,
            completion_kept=kept,
        )

    def to_dict(self) -> dict:
        """The fields claw-tree keeps, as a `claw.call/v1` dict (api, timings are not kept)."""
        row = {
            "schema": CALL_SCHEMA,
            "call_id": self.call_id,
            "session": self.session,
            "seq": self.seq,
            "model": self.model,
            "policy": {"name": self.policy_name, "version": self.policy_version},
            "trainable": self.trainable,
            "prompt_ids": self.prompt_ids.tolist(),
            "completion_ids": self.completion_ids.tolist(),
            "completion_logprobs": self.completion_logprobs.tolist(),
            **(
                {"completion_kept": self.completion_kept.tolist()}
                if self.completion_kept is not None
                else {}
            ),
            "finish_reason": self.finish_reason,
            "tags": dict(self.tags),
        }
        prefix = {
            k: v
            for k, v in (
                ("reused_tokens", self.reused_tokens),
                ("fresh_render_matches", self.fresh_render_matches),
                ("fork_reason", self.fork_reason),
                ("fork_of", self.fork_of),
                ("parent_call", self.parent_call),
            )
            if v is not None
        }
        if prefix:
            row["prefix"] = prefix
        if self.routing is not None:
            row["routing"] = self.routing.to_dict()
        if not self.default_sampling:
            row["sampling"] = {
                "temperature": self.temperature,
                "top_p": self.top_p,
                "top_k": self.top_k,
            }
        return row

    def same_content(self, other: Call) -> bool:
        """True when two records of one call_id carry the same data (a duplicate, not a conflict)."""
        return (
            self.session == other.session
            and self.seq == other.seq
            and self.trainable == other.trainable
            and self.policy_version == other.policy_version
            and np.array_equal(self.prompt_ids, other.prompt_ids)
            and np.array_equal(self.completion_ids, other.completion_ids)
            and np.array_equal(self.completion_logprobs, other.completion_logprobs)
            and (self.temperature, self.top_p, self.top_k)
            == (other.temperature, other.top_p, other.top_k)
            and _same_kept(self.completion_kept, other.completion_kept)
        )


def _same_kept(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and np.array_equal(a, b))


def _kept_array(values: Any, n: int, where: str) -> np.ndarray | None:
    """A call's optional ``completion_kept``: one integer >= -1 per completion token (int64)."""
    if values is None:
        return None
    if isinstance(values, np.ndarray):
        if values.ndim != 1 or (values.size and values.dtype.kind not in "iu"):
            raise RecordError(f"{where}: completion_kept: expected a 1-d integer array")
        arr = values.astype(np.int64, copy=False)
    else:
        if not isinstance(values, list):
            raise RecordError(
                f"{where}: completion_kept: expected array of integers, got {values!r:.60}"
            )
        if not set(map(type, values)) <= {int}:
            bad = next(v for v in values if type(v) is not int)
            raise RecordError(f"{where}: completion_kept: expected integers, found {bad!r:.40}")
        try:
            arr = np.fromiter(values, dtype=np.int64, count=len(values))
        except OverflowError:
            raise RecordError(f"{where}: completion_kept: value out of range") from None
    if arr.size and arr.min() < -1:
        raise RecordError(f"{where}: completion_kept: values must be >= -1, found {arr.min()}")
    if len(arr) != n:
        raise RecordError(
            f"{where}: completion_kept: has {len(arr)} entries but completion_ids has {n}"
        )
    return arr


def _prefix_fields(prefix: Any, where: str) -> dict[str, Any]:
    """A call's ``prefix`` object as Call fields: reused_tokens, fresh_render_matches, fork_reason
    and fork_of (None when absent)."""
    prefix = prefix or {}
    if not isinstance(prefix, dict):
        raise RecordError(f"{where}: prefix: expected object")
    reused = prefix.get("reused_tokens")
    if reused is not None and (type(reused) is not int or reused < 0):
        raise RecordError(
            f"{where}: prefix.reused_tokens: expected an integer >= 0, got {reused!r:.40}"
        )
    fresh = prefix.get("fresh_render_matches")
    if fresh is not None and not isinstance(fresh, bool):
        raise RecordError(
            f"{where}: prefix.fresh_render_matches: expected boolean or null, got {fresh!r:.40}"
        )
    fields: dict[str, Any] = {"reused_tokens": reused, "fresh_render_matches": fresh}
    for k in ("fork_reason", "fork_of", "parent_call"):
        v = prefix.get(k)
        if v is not None and (not isinstance(v, str) or not v):
            raise RecordError(
                f"{where}: prefix.{k}: expected a non-empty string or null, got {v!r:.40}"
            )
        fields[k] = v
    return fields


def _check_routing_span(ref: RoutingRef, n_tokens: int, prefix: dict[str, Any], where: str) -> None:
    """A call's routing covers tokens ``start .. n_tokens - 2`` (the last sampled token is never
    fed back); rows before ``start`` are the reused prefix of ``prefix.parent_call``."""
    if ref.start > 0:
        if prefix["parent_call"] is None:
            raise RecordError(f"{where}: routing.start: {ref.start} > 0 without prefix.parent_call")
        if ref.start > (prefix["reused_tokens"] or 0):
            raise RecordError(
                f"{where}: routing.start: {ref.start} exceeds prefix.reused_tokens "
                f"({prefix['reused_tokens']})"
            )
    want = n_tokens - 1 - ref.start
    if ref.shape[0] != want:
        raise RecordError(
            f"{where}: routing.shape: {ref.shape[0]} rows, but prompt_ids + completion_ids hold "
            f"{n_tokens} tokens: T = {n_tokens} - 1 - start ({ref.start}) = {want}"
        )


def _sampling(value: Any, where: str) -> tuple[float, float, int]:
    """``(temperature, top_p, top_k)`` from a call's optional ``sampling`` object.

    Absent (or null) means temperature 1, top_p 1, top_k 0 (older proxies); a key missing
    inside the object takes the same default. Other keys (forced, max_tokens, seed) are ignored.
    """
    if value is None:
        return 1.0, 1.0, 0
    if not isinstance(value, dict):
        raise RecordError(f"{where}: sampling: expected object, got {value!r:.60}")
    t = value.get("temperature", 1.0)
    p = value.get("top_p", 1.0)
    k = value.get("top_k", 0)
    for field, v in (("temperature", t), ("top_p", p)):
        if type(v) not in (int, float) or not np.isfinite(v):
            raise RecordError(f"{where}: sampling.{field}: expected a finite number, got {v!r:.40}")
    if t < 0:
        raise RecordError(f"{where}: sampling.temperature: must be >= 0 (0 = greedy), got {t!r}")
    if not 0 < p <= 1:
        raise RecordError(f"{where}: sampling.top_p: must lie in (0, 1], got {p!r}")
    if type(k) is not int or k < 0:
        raise RecordError(
            f"{where}: sampling.top_k: expected an integer >= 0 (0 = off), got {k!r:.40}"
        )
    return float(t), float(p), k


@attrs.frozen(kw_only=True)
class Outcome:
    """The scored result of one rollout (`claw.outcome/v1`)."""

    session: str
    task: str
    harness: str
    group: str
    reward: float | None
    passed: bool | None
    status: str

    @classmethod
    def from_dict(cls, row: Any, where: str = "<outcome>") -> Outcome:
        """Validate one `claw.outcome/v1` dict, every field (a strict reader); errors name `where`
        and the field."""
        if not isinstance(row, dict):
            raise RecordError(f"{where}: expected a JSON object, got {type(row).__name__}")
        _check_schema(row, OUTCOME_SCHEMA, where)
        session = _require(row, "session", str, where)
        task = _require(row, "task", str, where)
        harness = _require(row, "harness", str, where)
        group = _require(row, "group", str, where)
        status = _require(row, "status", str, where)
        if status not in OUTCOME_STATUSES:
            raise RecordError(f"{where}: status: {status!r} is not one of {list(OUTCOME_STATUSES)}")
        reward = _require(row, "reward", (int, float, type(None)), where)
        passed = _require(row, "passed", (bool, type(None)), where)
        for field, value in (("session", session), ("task", task), ("harness", harness)):
            if not value:
                raise RecordError(f"{where}: {field}: must be non-empty")
        if status == "ok" and reward is None:
            raise RecordError(f"{where}: reward: null although status is 'ok'")
        if status == "ok" and passed is None:
            raise RecordError(f"{where}: passed: null although status is 'ok'")
        if status != "ok" and (reward is not None or passed is not None):
            field = "reward" if reward is not None else "passed"
            raise RecordError(f"{where}: {field}: must be null when status is {status!r}")
        if reward is not None and not (np.isfinite(reward) and 0.0 <= reward <= 1.0):
            raise RecordError(f"{where}: reward: must be a number in [0, 1], got {reward!r}")
        for field, types in (
            ("sample", int),
            ("job_id", str),
            ("details", dict),
            ("meta", dict),
            ("error", (str, type(None))),
            ("policy_version", (int, type(None))),
        ):
            if field in row:
                value = _require(row, field, types, where)
                if field in ("sample", "policy_version") and value is not None and value < 0:
                    raise RecordError(f"{where}: {field}: must be >= 0, got {value}")
        return cls(
            session=session,
            task=task,
            harness=harness,
            group=group,
            reward=None if reward is None else float(reward),
            passed=passed,
            status=status,
        )

    def to_dict(self) -> dict:
        """The record as a `claw.outcome/v1` dict (the fields claw-tree knows)."""
        return {"schema": OUTCOME_SCHEMA, **attrs.asdict(self)}


@attrs.frozen(kw_only=True)
class ReadResult:
    """Records read from one source plus what was skipped (``where: reason``) and duplicates."""

    records: list
    skipped: list[str] = attrs.field(factory=list)


def shard_path(path: Path, index: int) -> Path:
    """The `index`-th shard of a record series (0 is `path` itself; docs/formats.md, Record
    shards): ``calls.jsonl``, ``calls.00001.jsonl``, ``calls.00002.jsonl``, ..."""
    if index == 0:
        return path
    return path.with_name(f"{path.stem}.{index:05d}{path.suffix}")


def iter_jsonl(
    source: str | Path | IO[str] | Iterable[Any], *, shards: bool = False
) -> Iterator[tuple[str, Any]]:
    """Yield ``(where, row)`` per line of a JSONL path, ``-`` (stdin), text stream or row iterable.

    With ``shards=True`` a path is read as a record series: the file, then its shards
    ``<stem>.00001<suffix>``, ``<stem>.00002<suffix>``, ... up to the first missing index.
    Lines that are not JSON yield a :class:`RecordError` instance as the row so that the caller
    decides whether to raise or skip. Blank lines are ignored.
    """
    for where, row, _ in _iter_jsonl_dirs(source, shards=shards):
        yield where, row


def _iter_jsonl_dirs(
    source: str | Path | IO[str] | Iterable[Any], *, shards: bool = False
) -> Iterator[tuple[str, Any, Path | None]]:
    """:func:`iter_jsonl` with the directory of the file each line came from (None for stdin,
    streams and row iterables: the working directory)."""
    if isinstance(source, (str, Path)):
        if str(source) == "-":
            for where, row in _iter_lines(sys.stdin, "<stdin>"):
                yield where, row, None
            return
        path = Path(source)
        if not path.exists():
            raise RecordError(f"{path}: no such file")
        index = 0
        while index == 0 or (shards and shard_path(path, index).exists()):
            part = shard_path(path, index)
            with part.open(encoding="utf-8") as fh:
                for where, row in _iter_lines(fh, str(part)):
                    yield where, row, part.parent
            index += 1
    elif hasattr(source, "read"):
        name = getattr(source, "name", "<stream>")
        for where, row in _iter_lines(source, name):  # type: ignore[arg-type]
            yield where, row, None
    else:
        for i, row in enumerate(source):
            yield f"<record {i}>", row, None


def _iter_lines(fh: IO[str], name: str) -> Iterator[tuple[str, Any]]:
    for lineno, line in enumerate(fh, start=1):
        if not line.strip():
            continue
        where = f"{name}:{lineno}"
        yield where, parse_line(line, where)


def parse_line(line: str | bytes, where: str) -> Any:
    """One JSONL line's value, or a :class:`RecordError` instance when it is not JSON (the
    caller decides whether to raise or skip)."""
    try:
        return json.loads(line, parse_constant=_not_json)
    except json.JSONDecodeError as exc:
        return RecordError(f"{where}: not JSON: {exc.msg} (column {exc.colno})")
    except ValueError as exc:
        return RecordError(f"{where}: not JSON: {exc}")


def _not_json(word: str) -> Any:
    raise ValueError(f"{word} is not a JSON number")


def read_records(
    source: str | Path | IO[str] | Iterable[Any],
    parse: Callable[[Any, str], T],
    *,
    skip_invalid: bool = False,
    shards: bool = False,
) -> ReadResult:
    """Parse every row of ``source`` with ``parse(row, where)``; raise or count invalid rows
    (``shards``: a path is a record series, see :func:`iter_jsonl`)."""
    return _read(source, lambda row, where, _: parse(row, where), skip_invalid, shards)


def _read(
    source: str | Path | IO[str] | Iterable[Any],
    parse: Callable[[Any, str, Path | None], T],
    skip_invalid: bool,
    shards: bool,
) -> ReadResult:
    records: list[Any] = []
    skipped: list[str] = []
    for where, row, base in _iter_jsonl_dirs(source, shards=shards):
        try:
            if isinstance(row, RecordError):
                raise row
            records.append(row if isinstance(row, (Call, Outcome)) else parse(row, where, base))
        except RecordError as exc:
            if not skip_invalid:
                raise
            skipped.append(str(exc))
    return ReadResult(records=records, skipped=skipped)


def read_calls(
    source: Any, *, skip_invalid: bool = False, routing_dir: str | Path | None = None
) -> ReadResult:
    """Read `claw.call/v1` records (see :func:`read_records`). A path is read with every shard
    of its series (``calls.jsonl``, ``calls.00001.jsonl``, ...), in order; pass one shard's
    own path (e.g. the one ``POST /admin/rotate`` closed) to read that shard alone.

    A relative ``routing.file`` is resolved against the directory of the file (shard) its line
    came from (stdin, streams and dicts: the working directory); ``routing_dir`` overrides it."""
    override = None if routing_dir is None else Path(routing_dir)

    def parse(row: Any, where: str, base: Path | None) -> Call:
        return Call.from_dict(row, where, override if override is not None else base)

    return _read(source, parse, skip_invalid, shards=True)


def read_outcomes(source: Any, *, skip_invalid: bool = False) -> ReadResult:
    """Read `claw.outcome/v1` records (see :func:`read_records`)."""
    return read_records(source, Outcome.from_dict, skip_invalid=skip_invalid)


def read_values(source: str | Path | IO[str]) -> dict[str, np.ndarray]:
    """Read critic values: JSONL lines ``{"sample_id": str, "values": [float, ...]}`` (a strict
    reader of docs/formats.md, PPO values file; other keys are ignored)."""
    out: dict[str, np.ndarray] = {}
    for where, row in iter_jsonl(source):
        if isinstance(row, RecordError):
            raise row
        if not isinstance(row, dict):
            raise RecordError(f"{where}: expected a JSON object, got {type(row).__name__}")
        if not isinstance(row.get("sample_id"), str) or not row["sample_id"]:
            raise RecordError(f"{where}: sample_id: missing or not a non-empty string")
        if row["sample_id"] in out:
            raise RecordError(f"{where}: sample_id: {row['sample_id']!r} appears twice")
        out[row["sample_id"]] = _float_array(row.get("values"), "values", where)
    return out


def _jsonable(value: Any) -> Any:
    """numpy arrays and scalars as the Python lists and numbers they hold (json.dumps' default)."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def write_jsonl(rows: Iterable[dict], out: str | Path | IO[str]) -> int:
    """Write one compact JSON object per line to a path, ``-`` (stdout) or a stream; return count.
    numpy arrays are written as lists (one field's list at a time, never the whole row's)."""
    if isinstance(out, (str, Path)) and str(out) != "-":
        with Path(out).open("w", encoding="utf-8") as file:
            return write_jsonl(rows, file)
    fh: IO[str] = sys.stdout if isinstance(out, (str, Path)) else out
    n = 0
    for row in rows:
        fh.write(json.dumps(row, separators=(",", ":"), default=_jsonable))
        fh.write("\n")
        n += 1
    fh.flush()
    return n
