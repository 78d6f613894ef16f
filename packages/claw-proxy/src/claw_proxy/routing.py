"""The routing side store: which experts an MoE policy's engine routed each token to.

A routing file starts with the 8 magic bytes ``CLAWRT1\\n``; after them, arrays are appended one
after another, each as the raw C-order little-endian bytes of its dtype, with no header of its
own. A record names one array with a `routing` object::

    {"file": "calls.routing", "offset": 8, "shape": [T, L, K], "dtype": "uint8",
     "experts": E, "start": 0}

`file` is relative to the directory of the JSONL file holding the record (or absolute, for
records handed around in memory) and has no ``..`` component; values are expert indices in
``[0, E)``, the K values of a (token, MoE layer) row in the engine's order (largest router
weight first); ``uint8`` when E <= 255, else ``int16``. In a `claw.call/v1`, the T rows are
tokens ``start .. start+T-1`` of ``prompt_ids + completion_ids``, T = P + C - 1 - start
(every token the engine forwarded: the last sampled one never is); rows before `start` are
``prefix.parent_call``'s (docs/formats.md, Routing store). numpy is imported only by the
functions that need it (`read_routing`, `routing_bytes`).
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import attrs

from claw_proxy.errors import RecordError

MAGIC = b"CLAWRT1\n"
DTYPES = {"uint8": "<u1", "int16": "<i2"}  # the dtype names a record may give, as numpy's
REF_FIELDS = ("file", "offset", "shape", "dtype", "experts")


def routing_dtype(experts: int) -> str:
    """The dtype a writer stores expert indices of an E-expert model in."""
    return "uint8" if experts <= 255 else "int16"


def routing_path(shard: str | Path) -> Path:
    """The routing file of a record shard: its suffix replaced by ``.routing``."""
    return Path(shard).with_suffix(".routing")


@attrs.define(kw_only=True)
class RoutingRows:
    """A call's routing, handed to `CallWriter.write`: `rows` (T, L, K) of expert indices (a
    numpy array of the store's dtype) for tokens ``start ..``; the writer fills `ref` with
    the `routing` object it recorded."""

    rows: Any
    experts: int
    start: int = 0
    ref: dict | None = None


def _int(r: dict, name: str, where: str, low: int) -> int:
    v = r.get(name)
    if type(v) is not int or v < low:
        raise RecordError(f"{where}: field 'routing.{name}' must be an integer >= {low}, got {v!r}")
    return v


def check_ref(r: Any, where: str) -> dict:
    """Validate a `routing` reference's own fields (file, offset, shape, dtype, experts)."""
    if not isinstance(r, dict):
        raise RecordError(f"{where}: field 'routing' has the wrong type ({type(r).__name__})")
    for k in REF_FIELDS:
        if k not in r:
            raise RecordError(f"{where}: missing field 'routing.{k}'")
    f = r["file"]
    if not isinstance(f, str) or not f:
        raise RecordError(f"{where}: field 'routing.file' must be a non-empty string")
    if ".." in PurePosixPath(f).parts or ".." in PureWindowsPath(f).parts:
        raise RecordError(f"{where}: field 'routing.file' must not have a '..' component: {f!r}")
    _int(r, "offset", where, len(MAGIC))
    shape = r["shape"]
    if (
        not isinstance(shape, list)
        or len(shape) != 3
        or any(type(n) is not int for n in shape)
        or shape[0] < 0
        or min(shape[1:]) < 1
    ):
        raise RecordError(
            f"{where}: field 'routing.shape' must be [T, L, K] (T >= 0, L, K >= 1), got {shape!r}"
        )
    if r["dtype"] not in DTYPES:
        raise RecordError(
            f"{where}: field 'routing.dtype' must be one of {sorted(DTYPES)}, got {r['dtype']!r}"
        )
    experts = _int(r, "experts", where, 1)
    if r["dtype"] == "uint8" and experts > 255:
        raise RecordError(f"{where}: field 'routing.dtype' is uint8 for {experts} experts (> 255)")
    if shape[2] > experts:
        raise RecordError(
            f"{where}: field 'routing.shape' has K = {shape[2]} > routing.experts = {experts}"
        )
    return r


def check_call_routing(r: Any, where: str, tokens: int, prefix: dict) -> dict:
    """Validate a `claw.call/v1`'s `routing`: the reference, `start` and its parent rule, and
    T = P + C - 1 - start (`tokens` = P + C). The file is not opened (`read_routing` does)."""
    check_ref(r, where)
    start = _int(r, "start", where, 0) if "start" in r else 0
    if start > 0:
        if not prefix.get("parent_call"):
            raise RecordError(
                f"{where}: field 'routing.start' is {start} but prefix.parent_call is not set"
            )
        if start > (prefix.get("reused_tokens") or 0):
            raise RecordError(
                f"{where}: field 'routing.start' is {start}, past prefix.reused_tokens "
                f"({prefix.get('reused_tokens') or 0})"
            )
    if r["shape"][0] != tokens - 1 - start:
        raise RecordError(
            f"{where}: field 'routing.shape' has T = {r['shape'][0]}, expected "
            f"len(prompt_ids) + len(completion_ids) - 1 - start = {tokens - 1 - start}"
        )
    return r


def resolve(record_path: str | Path, ref: dict) -> Path:
    """The routing file a reference names, for a record read from `record_path`."""
    f = Path(ref["file"])
    return f if f.is_absolute() else Path(record_path).parent / f


def read_routing(record_path: str | Path, call: Any, where: str | None = None):
    """The routing array of a call (a `Call` or its dict) read from the record file
    `record_path`: shape (T, L, K), the stored dtype (uint8 or int16, native byte order).

    Checks the magic, that the file holds offset + T*L*K*itemsize bytes and that every value
    is an expert index in [0, E); errors name the record (`where`, default the record file)
    and the field."""
    import numpy as np

    ref = call.get("routing") if isinstance(call, dict) else call.routing
    where = where or str(record_path)
    if ref is None:
        raise RecordError(f"{where}: the call has no field 'routing'")
    check_ref(ref, where)
    path = resolve(record_path, ref)
    shape = tuple(ref["shape"])
    dtype = np.dtype(DTYPES[ref["dtype"]])
    n = int(np.prod(shape))
    try:
        with path.open("rb") as fh:
            magic = fh.read(len(MAGIC))
            size = os.fstat(fh.fileno()).st_size
            if magic != MAGIC:
                raise RecordError(
                    f"{where}: field 'routing.file': {path} is not a routing file "
                    f"(magic {magic!r}, expected {MAGIC!r})"
                )
            need = ref["offset"] + n * dtype.itemsize
            if size < need:
                raise RecordError(
                    f"{where}: field 'routing.offset': {path} has {size} bytes, the array "
                    f"needs {need} (offset {ref['offset']} + {n} x {dtype.itemsize})"
                )
            fh.seek(ref["offset"])
            rows = np.frombuffer(fh.read(n * dtype.itemsize), dtype=dtype).reshape(shape)
    except OSError as e:
        raise RecordError(f"{where}: field 'routing.file': cannot read {path}: {e}") from None
    if n and (int(rows.min()) < 0 or int(rows.max()) >= ref["experts"]):
        raise RecordError(
            f"{where}: field 'routing.experts': {path} holds values in "
            f"[{int(rows.min())}, {int(rows.max())}], outside [0, {ref['experts']})"
        )
    return rows.astype(dtype.newbyteorder("="), copy=False)


def routing_bytes(rows: Any, experts: int) -> tuple[bytes, list[int], str]:
    """(the bytes to append, shape, dtype name) of a (T, L, K) array of expert indices."""
    import numpy as np

    name = routing_dtype(experts)
    a = np.ascontiguousarray(rows, dtype=np.dtype(DTYPES[name]))
    if a.ndim != 3:
        raise RecordError(f"routing rows must be (T, L, K), got shape {a.shape}")
    return a.tobytes(), [int(n) for n in a.shape], name


__all__ = [
    "MAGIC",
    "RoutingRows",
    "check_call_routing",
    "check_ref",
    "read_routing",
    "routing_dtype",
    "routing_path",
]
