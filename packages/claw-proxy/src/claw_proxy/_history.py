"""The session index: what a prefix-cache miss needs to reuse the ids a session sampled.

The prefix cache (`render.PrefixCache`) keeps recent calls in memory, forgets cold sessions past
`--prefix-cache-bytes`, and starts empty when the proxy restarts. Re-rendering a forgotten call's
history is not what the model saw: the API parsers drop the reasoning it sampled (thinking
blocks, Responses reasoning items, `reasoning_content`, `<think>`), and Qwen3's template writes
`<think>` blocks only on its last turns. So every recorded call also leaves a short line in the
index next to the record series (`calls.jsonl` -> `calls.jsonl.index`): its session, call id,
where its record line is (shard, byte offset, length) and a digest of the history it answered
(the request's history keys and the answer's). On a miss the request's history is matched
against these digests, and the call's prompt + completion ids are read back from its record line.

Memory holds a bounded tail of it (`per_session` entries a session, `max_entries` in all, the
coldest sessions forgotten first); a restarted proxy reads the file back. Without a record
series the entries have no location: a miss is then known and counted as a fork, not avoided.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from array import array
from collections import OrderedDict
from pathlib import Path

from claw_proxy.records import shard_path


def index_path(record: str | Path) -> Path:
    """The index of a record series: the series' first path with `.index` appended."""
    record = Path(record)
    return record.with_name(record.name + ".index")


def history_digest(keys: list[str]) -> str:
    """A digest of a call's history keys (context, messages, answer): 16 bytes, as hex."""
    # one update of the joined keys: the same digest as one update a key (a hash reads its
    # input as one stream), without a Python step per message of the history
    return hashlib.blake2b("".join(keys).encode("ascii"), digest_size=16).hexdigest()


class Entry:
    """One recorded call: the history it answered and where its record line is."""

    __slots__ = (
        "call_id",
        "directory",
        "n_keys",
        "digest",
        "prompt_len",
        "eos",
        "shard",
        "offset",
        "length",
        "superseded",
    )

    def __init__(self, d: dict) -> None:
        self.call_id: str = d["call_id"]
        self.directory: str = d["tokenizer"]  # the tokenizer whose ids the record holds
        self.n_keys: int = d["n_keys"]
        self.digest: str = d["history"]
        self.prompt_len: int = d["prompt_len"]
        self.eos: bool = d["eos"]
        self.shard: int | None = d.get("shard")  # None: not recorded (no record series)
        self.offset: int = d.get("offset", 0)
        self.length: int = d.get("length", 0)
        self.superseded = False  # a later call of the session extends it


def _entry(d) -> Entry | None:
    """An index line's entry; None when the line is not one (a torn or foreign line)."""
    try:
        e = Entry(d)
    except (KeyError, TypeError):
        return None
    ints = (e.n_keys, e.prompt_len, e.offset, e.length, 0 if e.shard is None else e.shard)
    if not (
        all(type(x) is int and x >= 0 for x in ints)
        and isinstance(e.call_id, str)
        and isinstance(e.directory, str)
        and isinstance(e.digest, str)
        and isinstance(e.eos, bool)
    ):
        return None
    return e


class SessionIndex:
    """Session -> its recorded calls' history digests and record locations (see the module)."""

    def __init__(
        self, record: str | Path | None, per_session: int = 16, max_entries: int = 1 << 18
    ) -> None:
        self.record = Path(record) if record else None
        self.per_session = per_session
        self.max_entries = max_entries
        self._sessions: OrderedDict[str, list[Entry]] = OrderedDict()
        self._lock = threading.Lock()
        self.entries = 0
        self.evicted_sessions = 0
        self.skipped_lines = 0  # index lines read back that were not entries (a torn last line)
        self.write_errors = 0
        self._fd = -1  # opened at the first line written (a passthrough-only proxy writes none)
        if self.record is not None and index_path(self.record).exists():
            try:
                self._load(index_path(self.record))
            except OSError as e:  # the proxy still serves; forgotten calls render afresh
                logging.getLogger("claw_proxy").warning(
                    "session index %s: cannot read it (%s)", index_path(self.record), e.strerror
                )

    def _open(self) -> int:
        """The index file, open for appending (the lock is held)."""
        if self._fd < 0:
            assert self.record is not None
            self._fd = os.open(index_path(self.record), os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            size = os.fstat(self._fd).st_size
            if size and os.pread(self._fd, 1, size - 1) != b"\n":
                os.write(self._fd, b"\n")  # a torn last line stays a line of its own
        return self._fd

    def _load(self, path: Path) -> None:
        with path.open("rb") as f:
            for line in f:
                try:
                    d = json.loads(line)
                except ValueError:
                    d = None
                e = _entry(d) if isinstance(d, dict) and isinstance(d.get("session"), str) else None
                if e is None:
                    self.skipped_lines += bool(line.strip())
                    continue
                self._add(d["session"], e, d.get("extends"))

    def add(
        self,
        session: str,
        call_id: str,
        directory: str,
        keys: list[str],
        prompt_len: int,
        eos: bool,
        where: tuple[int, int, int] | None,
        extends: str | None,
    ) -> None:
        """Index a call that answered `keys`; `where` = (shard, offset, length) of its record
        line (None: not recorded); `extends` = the call whose tokens it continued, all of them."""
        d: dict = {
            "session": session,
            "call_id": call_id,
            "tokenizer": directory,
            "n_keys": len(keys),
            "history": history_digest(keys),
            "prompt_len": prompt_len,
            "eos": eos,
        }
        if where is not None:
            d["shard"], d["offset"], d["length"] = where
        if extends is not None:
            d["extends"] = extends
        line = (json.dumps(d, separators=(",", ":")) + "\n").encode("utf-8")
        with self._lock:
            if self.record is not None and where is not None:
                try:
                    os.write(self._open(), line)
                except OSError as e:  # the call is answered and recorded: it stays so
                    self.write_errors += 1
                    logging.getLogger("claw_proxy").warning(
                        "session index %s: cannot append (%s): a restarted proxy will render "
                        "this session's next call afresh",
                        index_path(self.record),
                        e.strerror,
                    )
            self._add(session, Entry(d), extends)

    def _add(self, session: str, e: Entry, extends: str | None) -> None:
        """Keep `e` in memory (the lock is held, or the index is loading)."""
        entries = self._sessions.setdefault(session, [])
        self._sessions.move_to_end(session)
        if extends is not None:
            for old in entries:
                if old.call_id == extends:
                    old.superseded = True
        entries.append(e)
        self.entries += 1
        while len(entries) > self.per_session:  # superseded calls go first, oldest first
            entries.pop(next((i for i, x in enumerate(entries) if x.superseded), 0))
            self.entries -= 1
        while self.entries > self.max_entries and len(self._sessions) > 1:
            self.entries -= len(self._sessions.popitem(last=False)[1])
            self.evicted_sessions += 1

    def candidate(
        self, session: str, directory: str, keys: list[str], longer_than: int
    ) -> Entry | None:
        """The indexed call with the most history keys (more than `longer_than`) that `keys`
        extends: its history is a proper prefix of `keys`, under the same tokenizer. Memory
        only, no I/O: cheap enough for the event loop when nothing longer is indexed."""
        with self._lock:
            entries = self._sessions.get(session)
            if not entries:
                return None
            found = [
                e
                for e in entries
                if longer_than < e.n_keys < len(keys) and e.directory == directory
            ]
        if not found:
            return None
        # the digest of each length asked for, in one pass over the keys
        digests: dict[int, str] = {}
        h = hashlib.blake2b(digest_size=16)
        done = 0
        for n in sorted({e.n_keys for e in found}):
            for k in keys[done:n]:
                h.update(k.encode("ascii"))
            done = n
            digests[n] = h.copy().hexdigest()
        best = None
        for e in found:  # the longest history; the newest of equals (the later in the list)
            if digests[e.n_keys] == e.digest and (best is None or e.n_keys >= best.n_keys):
                best = e
        return best

    def read_ids(self, e: Entry) -> tuple[array, str] | None:
        """The call's prompt + completion ids (and their JSON text, no brackets) from its record
        line; None when the line is not there as written (the shard moved, was cut or changed)."""
        if self.record is None or e.shard is None:
            return None
        try:
            with shard_path(self.record, e.shard).open("rb") as f:
                f.seek(e.offset)
                line = f.read(e.length)
            d = json.loads(line)
        except (OSError, ValueError):
            return None
        if not isinstance(d, dict) or d.get("call_id") != e.call_id or not line.endswith(b"\n"):
            return None
        prompt, completion = d.get("prompt_ids"), d.get("completion_ids")
        if not isinstance(prompt, list) or not isinstance(completion, list):
            return None
        ids = prompt + completion
        if len(prompt) != e.prompt_len or not all(type(t) is int and t >= 0 for t in ids):
            return None
        return array("q", ids), ",".join(map(str, ids))

    def forget(self, session: str) -> None:
        with self._lock:
            self.entries -= len(self._sessions.pop(session, ()))

    def stats(self) -> dict:
        with self._lock:
            return {
                "sessions": len(self._sessions),
                "entries": self.entries,
                "evicted_sessions": self.evicted_sessions,
                "skipped_lines": self.skipped_lines,
                "write_errors": self.write_errors,
            }

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
