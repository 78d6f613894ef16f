"""MoE routing side stores (docs/formats.md, Routing store): references, reading, writing.

A routing file starts with the 8 bytes :data:`ROUTING_MAGIC`, then arrays one after another,
each the raw C-order little-endian bytes of its dtype (no per-array header). A record names one
array with a ``routing`` object ``{file, offset, shape: [T, L, K], dtype, experts}`` (calls add
``start``); ``file`` is relative to the directory of the JSONL file holding the record, or
absolute (records handed around in memory within one process), never with a ``..`` part.

Values are expert indices in [0, E): the K experts the engine chose for a token in each of the
L MoE layers, largest router weight first. In samples, a row of -1 (all K values) is a token
without recorded routing (the learner decides it itself). claw-tree writes samples' routing as
int16, 2 * L * K bytes a token.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Literal

import attrs
import numpy as np

from claw_tree.errors import ClawError, RecordError

ROUTING_MAGIC = b"CLAWRT1\n"
ROUTING_DTYPES = ("uint8", "int16")

__all__ = [
    "ROUTING_DTYPES",
    "ROUTING_MAGIC",
    "RoutedRows",
    "RoutingOut",
    "RoutingRef",
    "RoutingStore",
    "load_routing",
    "parse_routing",
    "read_sample_routing",
    "store_routing",
]


@attrs.frozen(kw_only=True)
class RoutingRef:
    """One ``routing`` reference, validated; ``path`` is ``file`` resolved against the directory
    of the record's JSONL file, ``where`` names the record (file:line) for errors."""

    file: str
    path: Path
    offset: int
    shape: tuple[int, int, int]  # (T, L, K)
    dtype: str
    experts: int  # E
    start: int = 0  # calls: the first token of prompt_ids + completion_ids with a stored row
    where: str = "<routing>"

    @property
    def dims(self) -> tuple[int, int, int]:
        """``(L, K, E)``: what must agree across the calls of one forest."""
        return self.shape[1], self.shape[2], self.experts

    def to_dict(self) -> dict[str, Any]:
        """The reference as written in a record (``file`` resolved: absolute when resolved from
        an absolute directory, for records handed around within one process)."""
        row: dict[str, Any] = {
            "file": str(self.path),
            "offset": self.offset,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "experts": self.experts,
        }
        if self.start:
            row["start"] = self.start
        return row


def _int(value: Any, field: str, where: str, low: int) -> int:
    if type(value) is not int or value < low:
        raise RecordError(f"{where}: {field}: expected an integer >= {low}, got {value!r:.40}")
    return value


def parse_routing(value: Any, where: str, base_dir: Path | None = None) -> RoutingRef:
    """Validate a record's ``routing`` object (no file access); errors name ``where`` and the
    field (``routing.offset``, ...). ``base_dir``: the directory of the record's JSONL file
    (None: the working directory)."""
    if not isinstance(value, dict):
        raise RecordError(f"{where}: routing: expected object, got {value!r:.60}")
    if "file" not in value:
        raise RecordError(f"{where}: routing.file: missing required field")
    file = value["file"]
    if not isinstance(file, str) or not file or "\0" in file:
        raise RecordError(f"{where}: routing.file: expected a non-empty path, got {file!r:.60}")
    if ".." in re.split(r"[/\\]", file):
        raise RecordError(f"{where}: routing.file: must not hold a '..' part, got {file!r:.60}")
    for key in ("offset", "shape", "dtype", "experts"):
        if key not in value:
            raise RecordError(f"{where}: routing.{key}: missing required field")
    offset = _int(value["offset"], "routing.offset", where, len(ROUTING_MAGIC))
    shape = value["shape"]
    if not isinstance(shape, list) or len(shape) != 3:
        raise RecordError(f"{where}: routing.shape: expected [T, L, K], got {shape!r:.60}")
    t = _int(shape[0], "routing.shape", where, 0)
    n_layers = _int(shape[1], "routing.shape", where, 1)
    k = _int(shape[2], "routing.shape", where, 1)
    dtype = value["dtype"]
    if dtype not in ROUTING_DTYPES:
        raise RecordError(
            f"{where}: routing.dtype: expected one of {list(ROUTING_DTYPES)}, got {dtype!r:.40}"
        )
    experts = _int(value["experts"], "routing.experts", where, 1)
    if k > experts:
        raise RecordError(
            f"{where}: routing.shape: K = {k} experts a token, but experts = {experts}"
        )
    start = _int(value.get("start", 0), "routing.start", where, 0)
    path = Path(file)
    if not path.is_absolute():
        path = (base_dir if base_dir is not None else Path.cwd()) / path
    return RoutingRef(
        file=file,
        path=path,
        offset=offset,
        shape=(t, n_layers, k),
        dtype=dtype,
        experts=experts,
        start=start,
        where=where,
    )


def load_routing(ref: RoutingRef, *, unknown: bool = False) -> np.ndarray:
    """The referenced array (shape (T, L, K), memory-mapped), after checking the file's magic,
    its size and every value: in [0, E), or (``unknown``: samples) a row of -1."""
    where = ref.where
    try:
        size = ref.path.stat().st_size
        with ref.path.open("rb") as fh:
            magic = fh.read(len(ROUTING_MAGIC))
    except OSError as exc:
        raise RecordError(
            f"{where}: routing.file: cannot read {ref.path}: {exc.strerror}"
        ) from None
    if magic != ROUTING_MAGIC:
        raise RecordError(
            f"{where}: routing.file: {ref.path} is no routing store (starts {magic!r}, "
            f"not {ROUTING_MAGIC!r})"
        )
    dtype = np.dtype(ref.dtype).newbyteorder("<")
    need = ref.offset + math.prod(ref.shape) * dtype.itemsize
    if size < need:
        raise RecordError(
            f"{where}: routing.offset: {ref.path} holds {size} bytes, the array needs {need} "
            f"(offset {ref.offset} + {'x'.join(map(str, ref.shape))} x {dtype.itemsize})"
        )
    if math.prod(ref.shape) == 0:
        return np.zeros(ref.shape, dtype=dtype)
    arr = np.memmap(ref.path, dtype=dtype, mode="r", offset=ref.offset, shape=ref.shape)
    lo, hi = int(arr.min()), int(arr.max())
    if hi >= ref.experts or lo < (-1 if unknown else 0):
        bad = hi if hi >= ref.experts else lo
        raise RecordError(
            f"{where}: routing: expert index {bad} out of range [0, {ref.experts})"
            + (" (or a row of -1)" if unknown else "")
        )
    if unknown and lo < 0:
        missing = arr < 0
        if not np.array_equal(missing.any(axis=2), missing.all(axis=2)):
            raise RecordError(f"{where}: routing: a row mixes -1 with expert indices")
    return arr


def read_sample_routing(
    sample: dict[str, Any], base_dir: str | Path | None = None, where: str = "<sample>"
) -> np.ndarray | None:
    """A `claw.sample/v1` dict's routing rows (shape (N, L, K), int16, -1 = no recorded routing),
    or None when it has none; ``base_dir`` is the directory of the samples' JSONL file."""
    value = sample.get("routing")
    if value is None:
        return None
    ref = parse_routing(value, where, None if base_dir is None else Path(base_dir))
    if ref.dtype != "int16":
        raise RecordError(f"{where}: routing.dtype: samples' routing is int16, got {ref.dtype!r}")
    n = len(sample.get("input_ids", ()))
    if ref.shape[0] != n:
        raise RecordError(f"{where}: routing.shape: {ref.shape[0]} rows for {n} tokens")
    return np.asarray(load_routing(ref, unknown=True), dtype=np.int16)


@attrs.frozen(kw_only=True, eq=False)
class RoutedRows:
    """A sample's routing before it is written: rows (N, L, K) int16 (-1 = unknown) over E
    experts. :class:`RoutingStore` turns it into a reference."""

    rows: np.ndarray
    experts: int


class RoutingStore:
    """A routing side store being written (append only): :data:`ROUTING_MAGIC` when opened,
    then one int16 array per :meth:`append`, flushed before the offset is returned, so a record
    that references it can be written after (crash safety: never a line without its bytes).

    ``name`` is what references write as ``file`` (default: ``path`` as given); `claw-tree
    samples -o out.jsonl` writes ``out.routing`` next to it and references it by that bare name.
    """

    def __init__(self, path: str | Path, *, name: str | None = None) -> None:
        self.path = Path(path)
        self.name = str(path) if name is None else name
        self._fh: IO[bytes] | None = None
        self._at = 0

    def __enter__(self) -> RoutingStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open(self) -> IO[bytes]:
        if self._fh is None:
            try:
                self._fh = self.path.open("wb")
            except OSError as exc:
                raise ClawError(
                    f"{self.path}: cannot write the routing store: {exc.strerror}"
                ) from None
            self._fh.write(ROUTING_MAGIC)
            self._fh.flush()
            self._at = len(ROUTING_MAGIC)
        return self._fh

    def append(self, rows: np.ndarray) -> int:
        """Append ``rows`` as little-endian int16; return its offset (the bytes are flushed)."""
        fh = self._open()
        data = np.ascontiguousarray(rows, dtype="<i2").tobytes()
        offset = self._at
        fh.write(data)
        fh.flush()
        self._at += len(data)
        return offset

    def reference(self, routed: RoutedRows) -> dict[str, Any]:
        """Append a sample's rows; its ``routing`` reference."""
        offset = self.append(routed.rows)
        return {
            "file": self.name,
            "offset": offset,
            "shape": list(routed.rows.shape),
            "dtype": "int16",
            "experts": routed.experts,
        }

    def write_rows(self, rows: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """``rows`` with each sample's :class:`RoutedRows` stored and replaced by its reference
        (the store is created, holding at least its magic, before the first row is given out)."""
        self._open()
        experts: int | None = None
        try:
            for row in rows:
                routed = row.get("routing")
                if isinstance(routed, RoutedRows):
                    if experts is not None and routed.experts != experts:
                        raise ClawError(
                            f"sample {row.get('sample_id')!r}: routing over {routed.experts} "
                            f"experts, earlier samples of this store over {experts}"
                        )
                    experts = routed.experts
                    row["routing"] = self.reference(routed)
                yield row
        finally:
            self.close()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


# where samples' routing goes: a store path, a RoutingStore, False (drop it) or None (unset)
RoutingOut = str | Path | RoutingStore | Literal[False] | None


def drop_routing(rows: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """``rows`` without their routing (``routing_out=False``, `--no-routing`)."""
    for row in rows:
        if row.pop("routing", None) is not None:
            row.get("tags", {}).pop("routing_forks", None)
        yield row


def store_routing(
    rows: Iterator[dict[str, Any]], routed: bool, routing_out: RoutingOut
) -> Iterator[dict[str, Any]]:
    """Samples' rows with their routing stored in ``routing_out`` (a path or a
    :class:`RoutingStore`), or dropped (``False``); ``rows`` as they are when ``routed`` is
    false (a forest without routing writes nothing). Raises before any row is made when the
    calls carry routing and ``routing_out`` is None."""
    if not routed:
        return rows
    if routing_out is None or routing_out is True:
        raise ClawError(
            "the calls carry MoE routing: pass routing_out=PATH (the samples' routing side "
            "store, written before the samples that reference it) or routing_out=False to drop it"
        )
    if routing_out is False:
        return drop_routing(rows)
    store = routing_out if isinstance(routing_out, RoutingStore) else RoutingStore(routing_out)
    return store.write_rows(rows)
