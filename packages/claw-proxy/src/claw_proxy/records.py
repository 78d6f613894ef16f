"""The records claw-proxy writes (`claw.call/v1`) and reads (`claw.policy/v1`), and JSONL I/O.

`CallWriter` appends one line per answered call with a single `write` on an append-only file
and flushes it before the answer is completed, so a crash (even kill -9) never loses a call
whose answer the harness received and never leaves half a line. With `max_bytes` the records
shard by size: ``calls.jsonl``, then ``calls.00001.jsonl``, ``calls.00002.jsonl``...; `rotate`
(``POST /admin/rotate``) closes the open shard on demand, so a training step reads only the
shards closed since the previous step. `read_calls` and `follow_calls` read such a series in order, the latter while it grows.

An MoE policy's calls also carry a `routing` reference into the shard's binary side store
(``calls.jsonl`` -> ``calls.routing``, ``calls.00003.jsonl`` -> ``calls.00003.routing``): the
experts the engine routed every forwarded token to (docs/formats.md, Routing store). The writer
appends and flushes a call's routing bytes before its line, so every line on disk has its bytes;
`read_routing` loads them back, checked.

Reader kinds (docs/formats.md, Readers; held to formats/conformance by tests/test_conformance.py):
`Call.from_dict` (so `read_calls` / `follow_calls`) and `Policy.from_dict` are *strict*: they
validate every field the record defines, accept fields they do not know (a call keeps them in
`extra` and writes them back) and reject ``NaN`` / ``Infinity``. Blank lines are skipped.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import attrs

from claw_proxy.errors import RecordError
from claw_proxy.routing import MAGIC, RoutingRows, check_call_routing, routing_bytes, routing_path

CALL_SCHEMA = "claw.call/v1"
POLICY_SCHEMA = "claw.policy/v1"
APIS = ("openai.chat", "openai.responses", "anthropic.messages")
FINISH_REASONS = ("stop", "length", "tool_calls", "error")


def _check_schema(d: dict, want: str, where: str) -> None:
    if not isinstance(d, dict):
        raise RecordError(f"{where}: expected a JSON object, got {type(d).__name__}")
    got = d.get("schema")
    if got != want:
        name, _, major = str(got).partition("/")
        if name == want.split("/")[0] and major != "v1":
            raise RecordError(
                f"{where}: unsupported major version {got!r} (this reader knows {want})"
            )
        raise RecordError(f"{where}: schema is {got!r}, expected {want!r}")


def _field(d: dict, name: str, types, where: str, required: bool = True):
    if name not in d:
        if required:
            raise RecordError(f"{where}: missing field {name!r}")
        return None
    v = d[name]
    if not isinstance(v, types) or (isinstance(v, bool) and bool not in _as_tuple(types)):
        raise RecordError(f"{where}: field {name!r} has the wrong type ({type(v).__name__})")
    return v


def _as_tuple(t):
    return t if isinstance(t, tuple) else (t,)


def _text(d: dict, name: str, where: str) -> str:
    v = _field(d, name, str, where)
    if not v:
        raise RecordError(f"{where}: field {name!r} must be a non-empty string")
    return v


def _count(d: dict, name: str, where: str, required: bool = True, label: str | None = None):
    v = _field(d, name, int, where, required)
    if v is not None and v < 0:
        raise RecordError(f"{where}: field {label or name!r} must be >= 0, got {v}")
    return v


def _time(d: dict, name: str, where: str, required: bool = True):
    v = _field(d, name, (int, float), where, required)
    if v is not None and not (math.isfinite(v) and v >= 0):
        raise RecordError(f"{where}: field {name!r} must be a Unix time >= 0, got {v!r}")
    return v


def _token_ids(d: dict, name: str, where: str) -> list:
    ids = _field(d, name, list, where)
    for j, t in enumerate(ids):
        if type(t) is not int or t < 0:
            raise RecordError(f"{where}: field {name!r}[{j}] must be a token id >= 0, got {t!r}")
    return ids


def _logprobs(d: dict, name: str, where: str) -> list:
    lps = _field(d, name, list, where)
    for j, x in enumerate(lps):
        if type(x) not in (int, float) or not math.isfinite(x):
            raise RecordError(f"{where}: field {name!r}[{j}] must be a finite number, got {x!r}")
    return lps


def _prefix(d: dict, where: str) -> dict:
    p = _field(d, "prefix", dict, where, required=False)
    if p is None:
        return {}
    for k in ("reused_tokens", "rendered_tokens"):
        _count(p, k, where, required=False, label=f"prefix.{k}")
    if p.get("parent_call") is not None and not isinstance(p["parent_call"], str):
        raise RecordError(f"{where}: field 'prefix.parent_call' must be a string or null")
    if p.get("fresh_render_matches") is not None and not isinstance(
        p["fresh_render_matches"], bool
    ):
        raise RecordError(f"{where}: field 'prefix.fresh_render_matches' must be a boolean or null")
    if p.get("drift_check") not in (None, "boundary", "full"):
        raise RecordError(f"{where}: field 'prefix.drift_check' must be 'boundary' or 'full'")
    for k in ("fork_reason", "fork_of"):
        if p.get(k) is not None and (not isinstance(p[k], str) or not p[k]):
            raise RecordError(f"{where}: field 'prefix.{k}' must be a non-empty string or null")
    return p


def sampling_record(
    temperature: float, top_p: float, top_k: int, forced: bool, *, ignore_eos: bool = False, **extra
) -> dict:
    """The `sampling` object of a `claw.call/v1` (its one shape, for every engine):
    ``{temperature, top_p, top_k, forced}`` the engine sampled with, then `extra` (max_tokens,
    seed), then ``ignore_eos: true`` only when the request decoded through eos. A value that is
    not a finite number in range raises `RecordError` (a NaN must never reach a record)."""
    d = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "forced": forced, **extra}
    if ignore_eos:
        d["ignore_eos"] = True
    _check_sampling(d, "sampling")
    if top_k < 0:
        raise RecordError(f"sampling: field 'sampling.top_k' must be >= 0 (0: off), got {top_k}")
    d["temperature"], d["top_p"] = float(temperature), float(top_p)
    return d


def _check_sampling(d: dict, where: str) -> None:
    for name, ok, want in (
        ("temperature", lambda v: v >= 0, "a finite number >= 0"),
        ("top_p", lambda v: 0 < v <= 1, "a finite number in (0, 1]"),
    ):
        if name in d:
            v = d[name]
            if (
                isinstance(v, bool)
                or not isinstance(v, (int, float))
                or not (math.isfinite(v) and ok(v))
            ):
                raise RecordError(f"{where}: field 'sampling.{name}' must be {want}, got {v!r}")
    if "top_k" in d and (
        isinstance(d["top_k"], bool) or not isinstance(d["top_k"], int) or d["top_k"] < -1
    ):  # -1 (off) only in records of older proxies that copied it from a request
        raise RecordError(f"{where}: field 'sampling.top_k' must be an integer >= 0 (0: off)")
    for name in ("forced", "ignore_eos"):
        if name in d and not isinstance(d[name], bool):
            raise RecordError(f"{where}: field 'sampling.{name}' must be a boolean")


@attrs.frozen(kw_only=True)
class Policy:
    """`claw.policy/v1`: a policy the proxy can serve (an HF model directory and a version)."""

    name: str
    version: int
    path: str
    created_at: float | None = None
    step: int | None = None
    metrics: dict | None = None
    # the weights of this version come over a process group (`_transfer`), not from `path`
    transfer: dict | None = None

    @classmethod
    def from_dict(cls, d: dict, where: str = "policy") -> Policy:
        """Validate a `claw.policy/v1` dict (strict; unknown fields are accepted and dropped)."""
        from claw_proxy._transfer import check_transfer

        _check_schema(d, POLICY_SCHEMA, where)
        version = _count(d, "version", where)
        transfer = check_transfer(d["transfer"], where) if "transfer" in d else None
        return cls(
            name=_text(d, "name", where),
            version=version,
            path=_text(d, "path", where),
            created_at=_time(d, "created_at", where, required=False),
            step=_count(d, "step", where, required=False),
            metrics=_field(d, "metrics", dict, where, required=False),
            transfer=transfer,
        )

    def to_dict(self) -> dict:
        d = {"schema": POLICY_SCHEMA, "name": self.name, "version": self.version, "path": self.path}
        for k in ("created_at", "step", "metrics", "transfer"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        return d


@attrs.frozen(kw_only=True)
class Call:
    """`claw.call/v1`: one model call answered by the proxy, token by token."""

    call_id: str
    session: str
    seq: int
    api: str
    model: str
    policy: dict
    engine: str
    trainable: bool
    prompt_ids: Sequence[int]  # a list; the proxy's own records may hold an array('q')
    completion_ids: list[int]
    completion_logprobs: list[float]
    # each completion token's kept-set size less itself (-1: untruncated), where the engine
    # knew it and some token was truncated (top_k / top_p); None: not recorded
    completion_kept: list[int] | None = None
    prefix: dict
    finish_reason: str
    sampling: dict
    usage: dict
    started_at: float
    ended_at: float
    tags: dict
    request: dict | None = None
    response: dict | None = None
    # where the experts of an MoE policy's forwarded tokens are (`_routing_field`); None: no MoE
    routing: dict | None = None
    extra: dict = attrs.field(factory=dict)  # fields of a newer writer, written back unchanged

    @classmethod
    def from_dict(cls, d: dict, where: str = "call") -> Call:
        """Validate a `claw.call/v1` dict, every field (strict); unknown fields go to `extra`."""
        _check_schema(d, CALL_SCHEMA, where)
        known = {f.name for f in attrs.fields(cls)} | {"schema"}
        extra = {k: v for k, v in d.items() if k not in known or k == "extra"}
        policy = _field(d, "policy", dict, where)
        _field(policy, "name", str, where)
        _count(policy, "version", where, label="policy.version")
        api = _field(d, "api", str, where)
        if api not in APIS:
            raise RecordError(f"{where}: field 'api' is {api!r}, expected one of {APIS}")
        finish = _field(d, "finish_reason", str, where)
        if finish not in FINISH_REASONS:
            raise RecordError(f"{where}: field 'finish_reason' is {finish!r}")
        ids = _token_ids(d, "prompt_ids", where)
        out = _token_ids(d, "completion_ids", where)
        lps = _logprobs(d, "completion_logprobs", where)
        if len(out) != len(lps):
            raise RecordError(
                f"{where}: completion_logprobs: {len(lps)} values for {len(out)} completion_ids"
            )
        trainable = _field(d, "trainable", bool, where, required=False)
        prefix = _prefix(d, where)
        return cls(
            call_id=_text(d, "call_id", where),
            session=_text(d, "session", where),
            seq=_count(d, "seq", where),
            api=api,
            model=_field(d, "model", str, where),
            policy=policy,
            engine=_field(d, "engine", str, where, required=False) or "",
            trainable=True if trainable is None else trainable,
            prompt_ids=ids,
            completion_ids=out,
            completion_logprobs=lps,
            completion_kept=_kept(d, where, len(out)),
            prefix=prefix,
            finish_reason=finish,
            sampling=_sampling_field(d, where),
            usage=_field(d, "usage", dict, where, required=False) or {},
            started_at=_time(d, "started_at", where),
            ended_at=_time(d, "ended_at", where),
            tags=_field(d, "tags", dict, where),
            request=_field(d, "request", dict, where, required=False),
            response=_field(d, "response", dict, where, required=False),
            routing=_routing_field(d, where, len(ids) + len(out), prefix),
            extra=extra,
        )

    @property
    def sampled_with(self) -> tuple[float, float, int]:
        """(temperature, top_p, top_k) the completion was sampled with; a record without
        `sampling` (older proxies) means (1.0, 1.0, 0)."""
        s = self.sampling
        t, p, k = s.get("temperature", 1.0), s.get("top_p", 1.0), s.get("top_k", 0)
        return float(t), float(p), max(int(k), 0)

    def to_dict(self) -> dict:
        d = {"schema": CALL_SCHEMA}
        for f in attrs.fields(type(self)):
            v = getattr(self, f.name)
            if (f.name in _OPTIONAL and v is None) or f.name == "extra":
                continue
            d[f.name] = v
        d.update(self.extra)
        return d


_OPTIONAL = ("completion_kept", "request", "response", "routing")  # absent when None


def _kept(d: dict, where: str, n: int) -> list[int] | None:
    """`completion_kept`: absent, or one integer >= -1 per completion token."""
    if d.get("completion_kept") is None:
        return None
    kept = _field(d, "completion_kept", list, where)
    if len(kept) != n:
        raise RecordError(
            f"{where}: field 'completion_kept': {len(kept)} values for {n} completion_ids"
        )
    for j, k in enumerate(kept):
        if type(k) is not int or k < -1:
            raise RecordError(
                f"{where}: field 'completion_kept'[{j}] must be an integer >= -1, got {k!r}"
            )
    return kept


def _routing_field(d: dict, where: str, tokens: int, prefix: dict) -> dict | None:
    r = d.get("routing")
    return None if r is None else check_call_routing(r, where, tokens, prefix)


def _sampling_field(d: dict, where: str) -> dict:
    s = d.get("sampling", {})
    if not isinstance(s, dict):
        raise RecordError(f"{where}: field 'sampling' has the wrong type ({type(s).__name__})")
    _check_sampling(s, where)
    return s


def shard_path(path: Path, index: int) -> Path:
    """The `index`-th shard of a record series (0 is `path` itself)."""
    if index == 0:
        return path
    return path.with_name(f"{path.stem}.{index:05d}{path.suffix}")


class CallWriter:
    """Append `claw.call/v1` lines, one `write` each, flushed (and optionally fsynced)."""

    def __init__(self, path: str | Path, max_bytes: int | None = None, fsync: bool = False) -> None:
        self.path = Path(path)
        if self.path.suffix == ".routing":
            raise RecordError(
                f"{self.path}: a record file cannot end in .routing (its side store's)"
            )
        self.max_bytes = max_bytes
        self.fsync = fsync
        self._lock = threading.Lock()
        self._rfd = -1  # the open shard's routing file, opened at its first MoE call
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._index = 0
        while shard_path(self.path, self._index + 1).exists():
            self._index += 1
        try:
            self._fd = self._open()
        except OSError as e:
            raise RecordError(f"{self.path}: cannot append records here: {e.strerror}") from None
        self.written = 0
        self._lines = _count_lines(shard_path(self.path, self._index))  # in the open shard
        self._closed: list[tuple[Path, int]] = []  # shards closed by size since the last rotate

    def _open(self) -> int:
        return os.open(
            shard_path(self.path, self._index), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644
        )

    def write(
        self,
        record: Call | dict,
        prompt_ids_json: str | None = None,
        raw: dict[str, str] | None = None,
        routing: RoutingRows | None = None,
    ) -> tuple[int, int, int]:
        """Append one record; return where its line is: (shard index, byte offset, length).
        `prompt_ids_json` ("1,2,3") is the prompt ids already serialised: long prompts that
        extend an earlier call's are not re-encoded from scratch. `raw` maps fields to their
        values already serialised as one-line JSON (a passthrough request's bytes as they
        came), written as they are instead of the record's values. `routing` (an MoE call's
        expert indices) is appended to the shard's routing file and flushed (fsynced with
        `fsync`) before the line, which gets the `routing` reference (also set on `routing.ref`)."""
        d = record.to_dict() if isinstance(record, Call) else dict(record)
        if routing is not None:
            d.pop("routing", None)  # the reference is the writer's to make
        # the line is put together as bytes in one join: the long parts (a 25K-token prompt's
        # ids are ~150 KB) are copied twice (encoded, joined), not four times
        parts: list[bytes] = []
        if prompt_ids_json is not None:
            d.pop("prompt_ids")
            parts += (b',"prompt_ids":[', prompt_ids_json.encode("ascii"), b"]")
        elif "prompt_ids" in d and not isinstance(d["prompt_ids"], list):
            d["prompt_ids"] = list(d["prompt_ids"])  # an array('q'): JSON knows lists
        for key, value in (raw or {}).items():
            d.pop(key, None)
            parts += (b',"' + key.encode("utf-8") + b'":', value.encode("utf-8"))
        line = json.dumps(d, separators=(",", ":"), ensure_ascii=False)
        if parts:
            data = b"".join((line[:-1].encode("utf-8"), *parts, b"}\n"))
        else:
            data = (line + "\n").encode("utf-8")
        blob = routing_bytes(routing.rows, routing.experts) if routing is not None else None
        with self._lock:
            size = os.fstat(self._fd).st_size if self.max_bytes else 0
            grow = len(data) + (200 if blob else 0)  # a routing reference is < 200 bytes
            if self.max_bytes and size > 0 and size + grow > self.max_bytes:
                self._next_shard()
            if routing is not None and blob is not None:
                data = self._with_routing(data, routing, *blob)
            view = memoryview(data)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
            if self.fsync:
                os.fsync(self._fd)
            self.written += 1
            self._lines += 1
            # appends move the offset to the end first: the line ends where the offset is now
            return self._index, os.lseek(self._fd, 0, os.SEEK_CUR) - len(data), len(data)

    def _with_routing(
        self, data: bytes, routing: RoutingRows, blob: bytes, shape: list[int], dtype: str
    ) -> bytes:
        """Append a call's routing bytes to the open shard's routing file (the lock is held);
        return its line `data` with the `routing` reference added."""
        offset = self._append_routing(blob)
        ref = {
            "file": routing_path(shard_path(self.path, self._index)).name,
            "offset": offset,
            "shape": shape,
            "dtype": dtype,
            "experts": routing.experts,
            "start": routing.start,
        }
        routing.ref = ref
        tail = json.dumps(ref, separators=(",", ":")).encode("ascii")
        return b"".join((data[:-2], b',"routing":', tail, b"}\n"))

    def _append_routing(self, blob: bytes) -> int:
        """Append `blob` to the open shard's routing file (magic first when it is new), flushed;
        return its offset. A file left by a crash keeps its bytes: they are appended after."""
        path = routing_path(shard_path(self.path, self._index))
        try:
            if self._rfd < 0:
                self._rfd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            size = os.fstat(self._rfd).st_size
            if 0 < size < len(MAGIC):  # a torn magic: no line can point into such a file
                os.ftruncate(self._rfd, 0)
                size = 0
            elif size and os.pread(self._rfd, len(MAGIC), 0) != MAGIC:
                raise RecordError(f"{path}: not a routing file (no {MAGIC!r} magic); move it away")
            view = memoryview(MAGIC + blob if size == 0 else blob)
            offset = size + (len(MAGIC) if size == 0 else 0)
            while view:
                n = os.write(self._rfd, view)
                view = view[n:]
            if self.fsync:
                os.fsync(self._rfd)
        except OSError as e:
            raise RecordError(f"{path}: cannot append routing: {e.strerror}") from None
        return offset

    def _next_shard(self) -> None:
        """Close the open shard and open the next one (the lock is held)."""
        os.close(self._fd)
        if self._rfd >= 0:
            os.close(self._rfd)
            self._rfd = -1
        self._closed.append((shard_path(self.path, self._index), self._lines))
        self._index += 1
        self._lines = 0
        self._fd = self._open()

    def rotate(self) -> dict:
        """Close the open shard and start the next one; return what was closed since the last
        rotation (or since this writer opened): ``{"closed": [paths], "lines": n, "next": path}``.

        A record is written whole, under the lock, to exactly one shard, so a call answered
        before the rotation is in a closed shard and one answered after it is in `next`: a
        reader of each rotation's `closed` shards sees every call once. `--record-max-bytes`
        may have closed several shards since the last rotation; all of them are listed."""
        with self._lock:
            if self._fd < 0:
                raise RecordError(f"{self.path}: the record writer is closed")
            self._next_shard()
            closed, self._closed = self._closed, []
            return {
                "closed": [str(p) for p, _ in closed],
                "lines": sum(n for _, n in closed),
                "next": str(shard_path(self.path, self._index)),
            }

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            if self._rfd >= 0:
                os.close(self._rfd)
                self._rfd = -1


def _count_lines(path: Path) -> int:
    try:
        with path.open("rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


_HEAD = re.compile(rb'"session":"((?:[^"\\]|\\.)*)","seq":(\d+)[,}]')


def last_seqs(path: str | Path) -> dict[str, int]:
    """The highest `seq` of each session in a record series (empty when there is none yet), so
    a restarted proxy appending to it continues each session's numbering.

    Reads each line's head only (the writer puts `session` and `seq` first); a line whose head
    does not match is parsed in full, and a line that is not a record is skipped."""
    path = Path(path)
    out: dict[str, int] = {}
    index = 0
    while shard_path(path, index).exists():
        with shard_path(path, index).open("rb") as f:
            for line in f:
                m = _HEAD.search(line, 0, 600)
                if m:
                    session, seq = json.loads(b'"' + m.group(1) + b'"'), int(m.group(2))
                else:
                    try:
                        d = json.loads(line)
                        session, seq = d["session"], int(d["seq"])
                    except (ValueError, KeyError, TypeError):
                        continue
                if seq > out.get(session, -1):
                    out[session] = seq
        index += 1
    return out


def _not_json(word: str):
    raise ValueError(f"{word} is not a JSON number")


def _parse_line(line: str, where: str) -> Call:
    try:
        d = json.loads(line, parse_constant=_not_json)
    except json.JSONDecodeError as e:
        raise RecordError(f"{where}: invalid JSON ({e.msg})") from e
    except ValueError as e:
        raise RecordError(f"{where}: invalid JSON ({e})") from e
    return Call.from_dict(d, where)


def read_calls(path: str | Path) -> Iterator[Call]:
    """Every call of a record file (and its shards, in order); bad lines raise with file:line."""
    path = Path(path)
    if not path.exists():
        raise RecordError(f"{path}: no such record file")
    index = 0
    while shard_path(path, index).exists():
        p = shard_path(path, index)
        with p.open(encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    yield _parse_line(line, f"{p}:{n}")
        index += 1


def follow_calls(path: str | Path, poll: float = 0.2, stop=None) -> Iterator[Call]:
    """Like `read_calls`, then keep yielding calls as they are appended (and as shards appear).

    Only whole lines are yielded: a line still being written is read once its newline lands.
    `stop` is an optional callable; following ends when it returns true and nothing is left.
    """
    path = Path(path)
    index, offset, n, buf = 0, 0, 0, b""
    while True:
        p = shard_path(path, index)
        got = False
        if p.exists():
            with p.open("rb") as f:
                f.seek(offset)
                chunk = f.read()
            if chunk:
                got = True
                offset += len(chunk)
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    n += 1
                    if line.strip():
                        yield _parse_line(line.decode("utf-8"), f"{p}:{n}")
            elif not buf and shard_path(path, index + 1).exists():
                index, offset, n = index + 1, 0, 0
                continue
        if not got:
            if stop is not None and stop():
                return
            time.sleep(poll)
