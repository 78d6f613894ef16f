"""New weights over a process group, not through files: the receiving side of a policy's
``transfer`` (docs/formats.md, claw.policy/v1, Weight transfer).

The learner (claw-rl's ``claw_rl.transfer``) runs a TCP store at ``transfer.address`` and is
rank 0. The proxy decides the group's size: 1 + the ranks of the engines that receive (a
transformers engine is one rank, a vLLM server one per worker), and writes it to the store
(`announce`); then every engine joins as its ranks (`join`) and receives the buckets in order
(`receive`). Each bucket is one flat byte tensor: its tensors one after another, each starting
at a multiple of `ALIGN` bytes, raw C-order bytes of its dtype. Over gloo rank 0 sends each
bucket to each rank on its own (tag = the bucket's index), so a receiver that dies fails only
its own sends; over NCCL the bucket is broadcast.

`check_transfer` validates the record (`Policy.from_dict`); `unpack` is the pure part (a bucket's
bytes to (name, tensor) pairs). The tensors come under the names and in the layout
``save_pretrained`` writes (per-expert MoE weights, as vLLM's loaders take them);
`checkpoint_views` maps them onto a transformers model's fused in-memory weights. examples/gpu/claw_vllm_worker.py repeats `join`, `receive` and
`unpack` inside vLLM's workers, which import nothing from claw.
"""

from __future__ import annotations

import math
import re
import weakref
from collections.abc import Iterator

from claw_proxy.errors import EngineError, RecordError

ALIGN = 16  # every tensor of a bucket starts at a multiple of this many bytes
BACKENDS = ("gloo", "nccl")
ITEMSIZE = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}
WORLD_KEY = "world_size"  # the store key (under the version's prefix) the proxy writes
_ADDRESS = re.compile(r"^\S+:(\d{1,5})$")


def prefix(version: int) -> str:
    """The store prefix of the group that carries `version` (one group per version)."""
    return f"claw/v{version}/"


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def bucket_bytes(dtypes: list[str], shapes: list[list[int]]) -> int:
    """The bytes of a bucket holding tensors of these dtypes and shapes (each aligned)."""
    return sum(aligned(math.prod(s) * ITEMSIZE[d]) for d, s in zip(dtypes, shapes, strict=True))


def _list(d: dict, key: str, where: str) -> list:
    v = d.get(key)
    if not isinstance(v, list) or not v:
        raise RecordError(f"{where}: field {key!r} must be a non-empty list")
    return v


def _bucket(b, where: str) -> dict:
    if not isinstance(b, dict):
        raise RecordError(f"{where}: each bucket must be an object")
    names, dtypes, shapes = (_list(b, k, where) for k in ("names", "dtypes", "shapes"))
    if not all(isinstance(n, str) and n for n in names):
        raise RecordError(f"{where}: field 'names' must hold non-empty strings")
    if len(dtypes) != len(names) or len(shapes) != len(names):
        raise RecordError(
            f"{where}: field 'dtypes' / 'shapes': {len(dtypes)} dtypes and {len(shapes)} shapes "
            f"for {len(names)} names"
        )
    if bad := [d for d in dtypes if d not in ITEMSIZE]:
        raise RecordError(f"{where}: field 'dtypes': {bad[0]!r} is not one of {sorted(ITEMSIZE)}")
    for s in shapes:
        if not isinstance(s, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in s
        ):
            raise RecordError(f"{where}: field 'shapes': {s!r} is not a list of integers >= 0")
    n = b.get("bytes")
    want = bucket_bytes(dtypes, shapes)
    if not isinstance(n, int) or isinstance(n, bool) or n != want:
        raise RecordError(
            f"{where}: field 'bytes' must be {want} (its tensors, each aligned to {ALIGN} "
            f"bytes), got {n!r}"
        )
    return {"names": names, "dtypes": dtypes, "shapes": shapes, "bytes": n}


def check_transfer(t, where: str) -> dict:
    """A policy's ``transfer`` object, checked; errors name ``transfer.<field>``."""
    where = f"{where}: transfer"
    if not isinstance(t, dict):
        raise RecordError(f"{where}: must be an object")
    if t.get("method") != "broadcast":
        raise RecordError(f"{where}: field 'method' must be 'broadcast', got {t.get('method')!r}")
    address = t.get("address")
    m = _ADDRESS.match(address) if isinstance(address, str) else None
    if m is None or not 1 <= int(m.group(1)) <= 65535:
        raise RecordError(f"{where}: field 'address' must be 'HOST:PORT', got {address!r}")
    if t.get("backend") not in BACKENDS:
        raise RecordError(
            f"{where}: field 'backend' must be one of {BACKENDS}, got {t.get('backend')!r}"
        )
    buckets = [
        _bucket(b, f"{where}.buckets[{i}]") for i, b in enumerate(_list(t, "buckets", where))
    ]
    scaling = t.get("lora_scaling")
    if scaling is not None and (
        isinstance(scaling, bool)
        or not isinstance(scaling, int | float)
        or not math.isfinite(scaling)
        or scaling <= 0
    ):
        raise RecordError(f"{where}: field 'lora_scaling' must be a number > 0, got {scaling!r}")
    return {**t, "buckets": buckets}


# --- the group -----------------------------------------------------------------------------------


def _store(address: str, timeout: float):
    from datetime import timedelta

    import torch.distributed as dist

    host, port = address.rsplit(":", 1)
    try:
        return dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout))
    except (RuntimeError, OSError) as e:
        raise EngineError(f"cannot reach the learner's store at {address}: {e}") from e


def announce(transfer: dict, version: int, world_size: int, timeout: float = 60.0) -> None:
    """Tell the learner (rank 0) the group's size: it creates the group with it."""
    _store(transfer["address"], timeout).set(prefix(version) + WORLD_KEY, str(world_size))


def join(transfer: dict, version: int, rank: int, world_size: int, timeout: float = 300.0):
    """This process's rank in the group that carries `version` (blocks until all joined)."""
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.PrefixStore(prefix(version), _store(transfer["address"], timeout))
    t = timedelta(seconds=timeout)
    if transfer["backend"] == "nccl":
        return dist.ProcessGroupNCCL(store, rank, world_size, dist.ProcessGroupNCCL.Options())
    return dist.ProcessGroupGloo(store, rank, world_size, t)


def unpack(buf, bucket: dict) -> Iterator[tuple[str, object]]:
    """The (name, tensor) pairs of one received bucket (views into `buf`, a flat uint8 tensor)."""
    import torch

    off = 0
    for name, dtype, shape in zip(bucket["names"], bucket["dtypes"], bucket["shapes"], strict=True):
        n = math.prod(shape) * ITEMSIZE[dtype]
        yield name, buf[off : off + n].view(getattr(torch, dtype)).view(shape)
        off += aligned(n)


def receive(transfer: dict, group, device: str = "cpu") -> Iterator[list[tuple[str, object]]]:
    """Each bucket's (name, tensor) pairs in order, as they arrive (one bucket in memory)."""
    import torch

    for i, bucket in enumerate(transfer["buckets"]):
        buf = torch.empty(bucket["bytes"], dtype=torch.uint8, device=device)
        if transfer["backend"] == "nccl":
            group.broadcast(buf, 0).wait()
        else:
            group.recv([buf], 0, i).wait()
        yield list(unpack(buf, bucket))


_VIEWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> checkpoint_views


def checkpoint_views(model) -> dict:
    """The tensors a transfer may name in `model` (a transformers model): its ``state_dict``
    names, and the names ``save_pretrained`` writes (what claw-rl sends) where transformers keeps
    a weight otherwise in memory (an MoE layer's experts fused as ``mlp.experts.gate_up_proj``,
    written per expert as ``mlp.experts.{e}.gate_proj.weight``, ...): each of those a strided
    view into the weight it is part of, so copying into it updates the served weight in place.

    Where each part lies is found by transformers' own ``revert_weight_conversion`` (what
    ``save_pretrained`` calls) applied to the weight's element indices; a part that is not a
    strided slice of its weight is refused (EngineError) before any weight changes. Made once
    per model (transient memory: two int64 copies of its largest converted weight)."""
    views = _VIEWS.get(model)
    if views is None:
        views = _VIEWS[model] = _views(model)
    return views


def _views(model) -> dict:
    import torch

    own = model.state_dict(keep_vars=True)
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # a transformers without checkpoint conversions: the names are the same
        return own
    views = dict(own)
    for name, p in own.items():
        meta = torch.empty(tuple(p.shape), dtype=p.dtype, device="meta")
        parts = revert_weight_conversion(model, {name: meta})
        if [(n, tuple(t.shape)) for n, t in parts.items()] == [(name, tuple(p.shape))]:
            continue
        index = torch.arange(p.numel(), dtype=torch.int64).view(p.shape)
        for part, where in revert_weight_conversion(model, {name: index}).items():
            views[part] = _strided(p.data, index, where, f"{type(model).__name__}: {part!r}")
    return views


def _strided(p, index, where, what: str):
    """The view of `p` holding its elements at the flat positions `where` (a tensor of indices
    into `index`, p's arange), or EngineError when they are not a strided slice of it."""
    flat = where.reshape(-1)
    offset = int(flat[0]) if flat.numel() else 0
    strides = []
    for d, n in enumerate(where.shape):
        step = [0] * where.dim()
        step[d] = min(1, n - 1)
        strides.append(int(where[tuple(step)]) - offset if n > 1 else 1)
    ok = p.is_contiguous() and min(strides, default=1) >= 0
    if ok:
        try:
            ok = bool((index.view(-1).as_strided(where.shape, strides, offset) == where).all())
        except RuntimeError:  # out of bounds: not a slice
            ok = False
    if not ok:
        raise EngineError(
            f"{what} is not a strided slice of the weight transformers keeps in memory; a "
            "transfer cannot write it in place",
            status=500,
        )
    return p.view(-1).as_strided(where.shape, strides, p.storage_offset() + offset)


def received_bytes(transfer: dict) -> int:
    return sum(b["bytes"] for b in transfer["buckets"])


async def load_single(engine, policy) -> None:
    """One engine receives `policy` over its group: the group is rank 0 and its ranks."""
    import asyncio

    world = 1 + engine.transfer_ranks
    await asyncio.to_thread(announce, policy.transfer, policy.version, world)
    await engine.receive_policy(policy, 1, world)


def assign(ranks: list[int]) -> tuple[list[int], int]:
    """The first rank of each engine taking `ranks[i]` ranks (from 1), and the world size."""
    firsts, nxt = [], 1
    for n in ranks:
        firsts.append(nxt)
        nxt += n
    return firsts, nxt
