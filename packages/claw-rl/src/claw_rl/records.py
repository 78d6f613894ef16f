"""The records claw-rl reads and writes: ``claw.sample/v1`` (in), ``claw.policy/v1`` (out).

Readers reject malformed lines naming file and line; nothing is dropped silently. The samples
are validated deeply (lengths, parent order, positions = depth) because a wrong tree gives a
silently wrong loss, not a crash.

Reader kinds (docs/formats.md, Readers; held to formats/conformance by tests/test_conformance.py):
``Sample.from_dict`` / ``read_samples`` and ``Policy.from_dict`` are *strict* (every field the
record defines is validated; unknown fields are accepted). Blank lines are skipped; ``NaN`` and
``Infinity`` are not JSON and are rejected.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePath
from typing import IO, Any, TextIO

import attrs
import numpy as np

from claw_rl.errors import RecordError

SAMPLE_SCHEMA = "claw.sample/v1"
POLICY_SCHEMA = "claw.policy/v1"
CALL_SCHEMA = "claw.call/v1"

_PER_TOKEN_INT = ("input_ids", "position_ids", "parent", "trainable")
_PER_TOKEN_FLOAT = ("logprobs", "advantages", "loss_weights")

ROUTING_MAGIC = b"CLAWRT1\n"  # first bytes of a routing file (docs/formats.md, Routing store)
_ROUTING_DTYPES: dict[str, np.dtype] = {"uint8": np.dtype("<u1"), "int16": np.dtype("<i2")}


def _check_schema(row: dict, want: str, where: str) -> None:
    got = row.get("schema")
    if not isinstance(got, str):
        raise RecordError(f"{where}: missing 'schema' (want {want!r})")
    name, _, major = got.partition("/")
    wname, _, wmajor = want.partition("/")
    if name != wname:
        raise RecordError(f"{where}: record type {got!r}, expected {want!r}")
    if major != wmajor:
        raise RecordError(f"{where}: unsupported version {got!r}; this reader knows {want!r}")


def _num_list(row: dict, key: str, where: str, *, ints: bool, n: int | None) -> tuple:
    val = row[key]
    if not isinstance(val, list):
        raise RecordError(f"{where}: field {key!r} must be a list, got {type(val).__name__}")
    for j, x in enumerate(val):
        ok = isinstance(x, int) if ints else isinstance(x, int | float) and math.isfinite(x)
        if not ok or isinstance(x, bool):
            kind = "integer" if ints else "finite number"
            raise RecordError(f"{where}: field {key!r}[{j}] must be a {kind}, got {x!r}")
    if n is not None and len(val) != n:
        raise RecordError(f"{where}: field {key!r} has {len(val)} entries, input_ids has {n}")
    return tuple(val)


def _int_field(ref: dict, key: str, where: str, low: int) -> int:
    val = ref.get(key)
    if not isinstance(val, int) or isinstance(val, bool) or val < low:
        raise RecordError(
            f"{where}: field 'routing.{key}' must be an integer >= {low}, got {val!r}"
        )
    return val


@attrs.frozen(kw_only=True)
class Routing:
    """The experts the engine chose for every token of a sample: a reference into a routing file
    (docs/formats.md, Routing store), or, for a sample cut by ``keep_sessions``, the rows in
    memory (``array``). ``shape`` (N, L, K): per token, per MoE layer, the K experts in the
    engine's order; -1 (the whole row) = not recorded. The array is read only by :meth:`load`."""

    file: str = attrs.field(eq=False)  # as written in the record; "" for rows held in memory
    path: Path | None  # the file, resolved
    offset: int
    shape: tuple[int, int, int]
    dtype: str
    experts: int
    where: str = attrs.field(default="routing", eq=False)  # file:line (sample id) for errors
    array: np.ndarray | None = attrs.field(default=None, eq=False, repr=False)

    @property
    def layers(self) -> int:
        return self.shape[1]

    @property
    def top_k(self) -> int:
        return self.shape[2]

    @classmethod
    def from_dict(cls, ref: Any, where: str, n_tokens: int, base: Path) -> Routing:
        """Validate a sample's ``routing`` reference against its ``n_tokens``; the file (relative
        to ``base``, or absolute) must hold the magic and the array's bytes."""
        if not isinstance(ref, dict):
            raise RecordError(f"{where}: field 'routing' must be an object")
        file = ref.get("file")
        if not isinstance(file, str) or not file:
            raise RecordError(f"{where}: field 'routing.file' must be a non-empty string")
        if ".." in PurePath(file).parts:
            raise RecordError(f"{where}: field 'routing.file' = {file!r} has a '..' component")
        offset = _int_field(ref, "offset", where, len(ROUTING_MAGIC))
        experts = _int_field(ref, "experts", where, 1)
        shape: Any = ref.get("shape")
        ok = isinstance(shape, list) and len(shape) == 3
        ok = ok and all(isinstance(x, int) and not isinstance(x, bool) for x in shape)
        if not ok or shape[0] < 0 or shape[1] < 1 or shape[2] < 1:
            raise RecordError(
                f"{where}: field 'routing.shape' must be [N, L, K] (ints, L and K >= 1), got "
                f"{shape!r}"
            )
        if shape[0] != n_tokens:
            raise RecordError(
                f"{where}: field 'routing.shape' = {shape}: {shape[0]} rows for {n_tokens} tokens"
            )
        if ref.get("dtype") != "int16":  # a sample's rows may be -1 (not recorded)
            raise RecordError(
                f"{where}: field 'routing.dtype' is {ref.get('dtype')!r}; a sample's is 'int16'"
            )
        if experts > 32767:
            raise RecordError(f"{where}: field 'routing.experts' = {experts} does not fit int16")
        path = Path(file) if os.path.isabs(file) else base / file
        out = cls(file=file, path=path, offset=offset, shape=tuple(shape), dtype="int16",
                  experts=experts, where=where)  # fmt: skip
        out._check_file()
        return out

    def _nbytes(self) -> int:
        return int(np.prod(self.shape)) * _ROUTING_DTYPES[self.dtype].itemsize

    def _check_file(self) -> None:
        try:
            with open(self.path, "rb") as fh:  # type: ignore[arg-type]
                magic = fh.read(len(ROUTING_MAGIC))
                size = os.fstat(fh.fileno()).st_size
        except OSError as exc:
            raise RecordError(
                f"{self.where}: field 'routing.file': cannot open {self.path} ({exc.strerror})"
            ) from exc
        if magic != ROUTING_MAGIC:
            raise RecordError(
                f"{self.where}: field 'routing.file': {self.path} is not a routing file (magic "
                f"{magic!r}, want {ROUTING_MAGIC!r})"
            )
        if size < self.offset + self._nbytes():
            raise RecordError(
                f"{self.where}: field 'routing.offset': {self.offset} + {self._nbytes()} bytes "
                f"of shape {list(self.shape)} run past the end of {self.path} ({size} bytes)"
            )

    def load(self) -> np.ndarray:
        """The rows (N, L, K) int16, values checked: experts in [0, E), or a whole row -1."""
        if self.array is not None:
            return self.array
        self._check_file()
        assert self.path is not None  # a reference (rows in memory returned above)
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            raw = fh.read(self._nbytes())
        a = np.frombuffer(raw, dtype=_ROUTING_DTYPES[self.dtype]).astype(np.int16)
        a = a.reshape(self.shape)
        bad = (a < -1) | (a >= self.experts)
        unset = a == -1
        bad |= unset.any(-1, keepdims=True) & ~unset.all(-1, keepdims=True)
        if bad.any():
            t, layer, k = (int(x) for x in np.argwhere(bad)[0])
            raise RecordError(
                f"{self.where}: field 'routing': token {t}, MoE layer {layer}, slot {k} holds "
                f"{int(a[t, layer, k])}: experts are in [0, {self.experts}) and an unrecorded row "
                f"is -1 in all {self.top_k} slots ({self.path} at offset {self.offset})"
            )
        return a

    def take(self, index: np.ndarray) -> Routing:
        """The rows ``index`` (token indices or a boolean mask), held in memory."""
        rows = self.load()[index]
        return attrs.evolve(self, file="", path=None, offset=0, shape=rows.shape, array=rows)

    def to_dict(self, base: str | Path | None = None) -> dict:
        """The reference; ``file`` relative to ``base`` (the directory of the JSONL file it goes
        into: the file must lie under it), else the resolved absolute path (in-memory use)."""
        if self.path is None:
            raise RecordError(
                f"{self.where}: routing rows held in memory (a sample cut by keep_sessions) have "
                "no file to reference; write them with append_routing first"
            )
        file = str(Path(self.path).resolve())
        if base is not None:
            rel = os.path.relpath(file, Path(base).resolve())
            if ".." in PurePath(rel).parts:
                raise RecordError(f"{self.where}: routing file {file} is not under {base}")
            file = rel
        return {"file": file, "offset": self.offset, "shape": list(self.shape),
                "dtype": self.dtype, "experts": self.experts}  # fmt: skip


def append_routing(path: str | Path, rows: np.ndarray, experts: int) -> dict:
    """Append ``rows`` (N, L, K) to the routing file ``path`` (created with its magic) as int16;
    the ``routing`` reference of a sample written next to it (``file`` is the bare name)."""
    a = np.ascontiguousarray(rows, dtype=_ROUTING_DTYPES["int16"])
    if a.ndim != 3:
        raise ValueError(f"routing rows must be (N, L, K), got shape {a.shape}")
    with open(path, "ab") as fh:
        if fh.tell() == 0:
            fh.write(ROUTING_MAGIC)
        offset = fh.tell()
        fh.write(a.tobytes())
        fh.flush()
    return {"file": Path(path).name, "offset": offset, "shape": list(a.shape),
            "dtype": "int16", "experts": experts}  # fmt: skip


@attrs.frozen(kw_only=True)
class Sample:
    """One tree-packed training sample (``claw.sample/v1``); see docs/formats.md, Tree packing."""

    sample_id: str
    algo: str
    input_ids: tuple[int, ...]
    position_ids: tuple[int, ...]
    parent: tuple[int, ...]
    trainable: tuple[int, ...]
    logprobs: tuple[float, ...]
    advantages: tuple[float, ...]
    loss_weights: tuple[float, ...]
    returns: tuple[float, ...] | None = None
    policy_versions: tuple[int, ...] | None = None
    # sampling settings of the call that generated each token (None: all 1.0 / 1.0 / 0)
    temperatures: tuple[float, ...] | None = None
    top_ps: tuple[float, ...] | None = None
    top_ks: tuple[int, ...] | None = None
    # the engine's kept-set size of each token less itself (-1: none recorded; None: all -1)
    kept: tuple[int, ...] | None = None
    sessions: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    n_paths: int | None = None
    tags: dict = attrs.field(factory=dict)
    routing: Routing | None = None  # the engine's expert choices per token (MoE policies)

    def __len__(self) -> int:
        return len(self.input_ids)

    @classmethod
    def from_dict(cls, row: Any, where: str = "sample", base: str | Path | None = None) -> Sample:
        """Validate a ``claw.sample/v1`` dict; errors name ``where`` (file:line or sample id).
        A relative ``routing.file`` is resolved against ``base`` (the samples file's directory;
        default: the working directory)."""
        if not isinstance(row, dict):
            raise RecordError(f"{where}: expected a JSON object, got {type(row).__name__}")
        _check_schema(row, SAMPLE_SCHEMA, where)
        for key in ("sample_id", "algo", *_PER_TOKEN_INT, *_PER_TOKEN_FLOAT):
            if key not in row:
                raise RecordError(f"{where}: missing required field {key!r}")
        if not isinstance(row["sample_id"], str) or not row["sample_id"]:
            raise RecordError(f"{where}: field 'sample_id' must be a non-empty string")
        where = f"{where} (sample {row['sample_id']!r})"
        if row["algo"] not in ("grpo", "ppo", "rloo", "reinforce", "sft"):
            raise RecordError(
                f"{where}: field 'algo' is {row['algo']!r}, not grpo|ppo|rloo|reinforce|sft"
            )
        n = len(row["input_ids"]) if isinstance(row["input_ids"], list) else None
        ints: dict[str, Any] = {k: _num_list(row, k, where, ints=True, n=n) for k in _PER_TOKEN_INT}
        floats: dict[str, Any] = {
            k: _num_list(row, k, where, ints=False, n=n) for k in _PER_TOKEN_FLOAT
        }
        opt: dict[str, Any] = {}
        if row.get("returns") is not None:
            opt["returns"] = _num_list(row, "returns", where, ints=False, n=n)
        if row.get("policy_versions") is not None:
            opt["policy_versions"] = _num_list(row, "policy_versions", where, ints=True, n=n)
            if any(v < -1 for v in opt["policy_versions"]):
                raise RecordError(
                    f"{where}: field 'policy_versions' must hold versions >= 0 (-1: context)"
                )
        opt.update(_sampling_lists(row, where, n))
        if row.get("kept") is not None:
            opt["kept"] = _num_list(row, "kept", where, ints=True, n=n)
            if any(k < -1 for k in opt["kept"]):
                j = next(j for j, k in enumerate(opt["kept"]) if k < -1)
                raise RecordError(f"{where}: field 'kept'[{j}] = {opt['kept'][j]} must be >= -1")
        opt.update(_packing_fields(row, where))
        if not isinstance(row.get("tags", {}), dict):
            raise RecordError(f"{where}: field 'tags' must be an object")
        if any(t < 0 for t in ints["input_ids"]):
            raise RecordError(f"{where}: field 'input_ids' must hold token ids >= 0")
        _check_tree(ints, floats, where)
        if row.get("routing") is not None:
            opt["routing"] = Routing.from_dict(
                row["routing"], where, len(ints["input_ids"]), Path(base or os.getcwd())
            )
        return cls(
            sample_id=row["sample_id"],
            algo=row["algo"],
            **ints,
            **floats,
            tags=dict(row.get("tags", {})),
            **opt,
        )

    def to_dict(self, base: str | Path | None = None) -> dict:
        """The record; a ``routing`` file relative to ``base`` (the directory of the JSONL file
        it goes into), else absolute (for records handed around in memory)."""
        out: dict[str, Any] = {
            "schema": SAMPLE_SCHEMA,
            "sample_id": self.sample_id,
            "algo": self.algo,
        }
        for key in (*_PER_TOKEN_INT, "logprobs", "advantages"):
            out[key] = list(getattr(self, key))
        if self.returns is not None:
            out["returns"] = list(self.returns)
        out["loss_weights"] = list(self.loss_weights)
        if self.policy_versions is not None:
            out["policy_versions"] = list(self.policy_versions)
        for key in ("temperatures", "top_ps", "top_ks", "kept"):
            if getattr(self, key) is not None:
                out[key] = list(getattr(self, key))
        out["sessions"], out["groups"] = list(self.sessions), list(self.groups)
        if self.n_paths is not None:
            out["n_paths"] = self.n_paths
        out["tags"] = dict(self.tags)
        if self.routing is not None:
            out["routing"] = self.routing.to_dict(base)
        return out


def _packing_fields(row: dict, where: str) -> dict:
    """The optional ``sessions``, ``groups`` (lists of strings) and ``n_paths`` (int >= 0)."""
    opt: dict[str, Any] = {}
    for key in ("sessions", "groups"):
        val = row.get(key, [])
        if not isinstance(val, list) or not all(isinstance(s, str) for s in val):
            raise RecordError(f"{where}: field {key!r} must be a list of strings")
        opt[key] = tuple(val)
    if "n_paths" in row and row["n_paths"] is not None:
        n = row["n_paths"]
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise RecordError(f"{where}: field 'n_paths' must be an integer >= 0")
        opt["n_paths"] = n
    return opt


def _sampling_lists(row: dict, where: str, n: int | None) -> dict:
    """The optional per-token ``temperatures`` (>= 0, 0 = greedy), ``top_ps`` (in (0, 1]) and
    ``top_ks`` (>= 0, 0 = off); absent or null = every token at 1.0 / 1.0 / 0."""
    out: dict[str, tuple] = {}
    for key, ints in (("temperatures", False), ("top_ps", False), ("top_ks", True)):
        if row.get(key) is None:
            continue
        vals = _num_list(row, key, where, ints=ints, n=n)
        for j, x in enumerate(vals):
            bad = (
                (not math.isfinite(x) or x < 0)
                if key == "temperatures"
                else (not (0 < x <= 1) if key == "top_ps" else x < 0)
            )
            if bad:
                rule = {
                    "temperatures": "a finite number >= 0",
                    "top_ps": "in (0, 1]",
                    "top_ks": ">= 0",
                }[key]
                raise RecordError(f"{where}: field {key!r}[{j}] = {x!r} must be {rule}")
        out[key] = tuple(float(x) for x in vals) if not ints else vals
    return out


def _check_tree(ints: dict, floats: dict, where: str) -> None:
    parent, pos, trainable = ints["parent"], ints["position_ids"], ints["trainable"]
    for i, p in enumerate(parent):
        if p < -1 or p >= i:
            raise RecordError(
                f"{where}: parent[{i}] = {p}; parents must precede children (-1 <= parent[i] < i)"
            )
        depth = 0 if p == -1 else pos[p] + 1
        if pos[i] != depth:
            raise RecordError(
                f"{where}: position_ids[{i}] = {pos[i]}, but its depth in the tree is {depth}"
            )
        if trainable[i] not in (0, 1):
            raise RecordError(f"{where}: trainable[{i}] = {trainable[i]}, must be 0 or 1")
        if p == -1 and trainable[i]:
            raise RecordError(f"{where}: token {i} is a root (parent -1) and cannot be trainable")
        if floats["loss_weights"][i] < 0:
            raise RecordError(
                f"{where}: loss_weights[{i}] = {floats['loss_weights'][i]} is negative"
            )


@attrs.frozen(kw_only=True)
class Policy:
    """A new policy for the proxy (``claw.policy/v1``)."""

    name: str
    version: int
    path: str
    created_at: float | None = None
    step: int | None = None
    metrics: dict = attrs.field(factory=dict)
    transfer: dict | None = None  # the weights come over a process group (claw_rl.transfer)

    @classmethod
    def from_dict(cls, row: Any, where: str = "policy") -> Policy:
        if not isinstance(row, dict):
            raise RecordError(f"{where}: expected a JSON object")
        _check_schema(row, POLICY_SCHEMA, where)
        for key, typ in (("name", str), ("version", int), ("path", str)):
            val = row.get(key)
            if not isinstance(val, typ) or isinstance(val, bool) or val == "":
                raise RecordError(
                    f"{where}: field {key!r} missing or not a non-empty {typ.__name__}"
                )
        if row["version"] < 0:
            raise RecordError(f"{where}: field 'version' must be >= 0, got {row['version']}")
        created, step = row.get("created_at"), row.get("step")
        if created is not None and (
            isinstance(created, bool)
            or not isinstance(created, int | float)
            or not math.isfinite(created)
            or created < 0
        ):
            raise RecordError(
                f"{where}: field 'created_at' must be a Unix time >= 0, got {created!r}"
            )
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            raise RecordError(f"{where}: field 'step' must be an integer >= 0, got {step!r}")
        if not isinstance(row.get("metrics", {}), dict):
            raise RecordError(f"{where}: field 'metrics' must be an object")
        if "transfer" in row:
            _check_transfer(row["transfer"], f"{where}: transfer")
        return cls(
            name=row["name"],
            version=row["version"],
            path=row["path"],
            created_at=row.get("created_at"),
            step=row.get("step"),
            metrics=dict(row.get("metrics", {})),
            transfer=row.get("transfer"),
        )

    @classmethod
    def now(cls, **kw: Any) -> Policy:
        return cls(created_at=round(time.time(), 3), **kw)

    def to_dict(self) -> dict:
        out: dict[str, Any] = {
            "schema": POLICY_SCHEMA,
            "name": self.name,
            "version": self.version,
            "path": self.path,
        }
        if self.created_at is not None:
            out["created_at"] = self.created_at
        if self.step is not None:
            out["step"] = self.step
        out["metrics"] = dict(self.metrics)
        if self.transfer is not None:
            out["transfer"] = self.transfer
        return out


TRANSFER_ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8}
TRANSFER_ITEMSIZE.update({"int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1})


def _transfer_bucket(b: Any, where: str) -> None:
    """One bucket of a policy's ``transfer`` (docs/formats.md, Weight transfer)."""
    if not isinstance(b, dict):
        raise RecordError(f"{where}: each bucket must be an object")
    for key in ("names", "dtypes", "shapes"):
        if not isinstance(b.get(key), list) or not b[key]:
            raise RecordError(f"{where}: field {key!r} must be a non-empty list")
    names: list = b["names"]
    dtypes: list = b["dtypes"]
    shapes: list = b["shapes"]
    if not all(isinstance(n, str) and n for n in names):
        raise RecordError(f"{where}: field 'names' must hold non-empty strings")
    if len(dtypes) != len(names) or len(shapes) != len(names):
        raise RecordError(f"{where}: field 'dtypes' / 'shapes' must have one entry per name")
    if bad := [d for d in dtypes if d not in TRANSFER_ITEMSIZE]:
        raise RecordError(f"{where}: field 'dtypes': {bad[0]!r} is not a known dtype")
    if not all(isinstance(s, list) and all(type(x) is int and x >= 0 for x in s) for s in shapes):
        raise RecordError(f"{where}: field 'shapes' must hold lists of integers >= 0")
    want = sum(
        -(-math.prod(s) * TRANSFER_ITEMSIZE[d] // 16) * 16
        for d, s in zip(dtypes, shapes, strict=True)
    )
    if type(b.get("bytes")) is not int or b["bytes"] != want:
        raise RecordError(f"{where}: field 'bytes' must be {want}, got {b.get('bytes')!r}")


def _check_transfer(t: Any, where: str) -> None:
    """A policy's ``transfer`` object: method, address HOST:PORT, backend, buckets."""
    if not isinstance(t, dict):
        raise RecordError(f"{where}: must be an object")
    if t.get("method") != "broadcast":
        raise RecordError(f"{where}: field 'method' must be 'broadcast'")
    address = t.get("address")
    host, _, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535 or " " in host:
        raise RecordError(f"{where}: field 'address' must be 'HOST:PORT', got {address!r}")
    if t.get("backend") not in ("gloo", "nccl"):
        raise RecordError(f"{where}: field 'backend' must be 'gloo' or 'nccl'")
    buckets = t.get("buckets")
    if not isinstance(buckets, list) or not buckets:
        raise RecordError(f"{where}: field 'buckets' must be a non-empty list")
    for i, b in enumerate(buckets):
        _transfer_bucket(b, f"{where}.buckets[{i}]")
    scaling = t.get("lora_scaling")
    if scaling is not None and (
        type(scaling) not in (int, float) or not math.isfinite(scaling) or scaling <= 0
    ):
        raise RecordError(f"{where}: field 'lora_scaling' must be a number > 0")


def _open(path: str | Path) -> tuple[TextIO, str, bool]:
    if str(path) == "-":
        return sys.stdin, "<stdin>", False
    try:
        return open(path, encoding="utf-8"), str(path), True  # noqa: SIM115 (closed by iter_jsonl)
    except OSError as exc:
        raise RecordError(f"{path}: cannot open ({exc.strerror})") from exc


def _not_json(word: str) -> Any:
    raise ValueError(f"{word} is not a JSON number")


def iter_jsonl(path: str | Path) -> Iterator[tuple[str, dict]]:
    """Yield ``(where, obj)`` for each line; ``where`` is ``file:line``. Rejects non-objects and
    ``NaN`` / ``Infinity`` (not JSON); skips blank lines (they still count in line numbers)."""
    fh, name, close = _open(path)
    try:
        for lineno, line in enumerate(fh, 1):
            where = f"{name}:{lineno}"
            if not line.strip():
                continue
            try:
                obj = json.loads(line, parse_constant=_not_json)
            except json.JSONDecodeError as exc:
                raise RecordError(
                    f"{where}: not valid JSON ({exc.msg} at column {exc.colno})"
                ) from exc
            except ValueError as exc:
                raise RecordError(f"{where}: not valid JSON ({exc})") from exc
            if not isinstance(obj, dict):
                raise RecordError(f"{where}: expected a JSON object, got {type(obj).__name__}")
            yield where, obj
    finally:
        if close:
            fh.close()


def read_samples(path: str | Path) -> list[Sample]:
    """Read and validate a ``claw.sample/v1`` JSONL file; sample ids must be unique."""
    out: list[Sample] = []
    seen: dict[str, str] = {}
    base = Path(os.getcwd()) if str(path) == "-" else Path(path).parent
    for where, obj in iter_jsonl(path):
        s = Sample.from_dict(obj, where, base)
        if s.sample_id in seen:
            raise RecordError(f"{where}: sample_id {s.sample_id!r} repeats {seen[s.sample_id]}")
        seen[s.sample_id] = where
        out.append(s)
    return out


def as_samples(rows: Iterable[Sample | dict], base: str | Path | None = None) -> list[Sample]:
    """Accept in-memory dicts (as the examples pass them) or Sample objects; relative routing
    files resolve against ``base`` (default: the working directory)."""
    return [
        r if isinstance(r, Sample) else Sample.from_dict(r, f"samples[{k}]", base)
        for k, r in enumerate(rows)
    ]


def write_jsonl(rows: Iterable[dict], fh: IO[str]) -> None:
    for row in rows:
        fh.write(json.dumps(row, separators=(",", ":")) + "\n")
        fh.flush()
