"""New weights to the engines in memory: the sending side of a policy's ``transfer``.

    policy = next_policy(learner, path=last_checkpoint_dir)       # version + 1, no files
    stats = publish(learner, policy, proxy_url, admin_token)      # the proxy answers when served

:func:`publish` runs a TCP store on ``host`` (a free port) and is rank 0 of a process group;
it POSTs the ``claw.policy/v1`` record with its ``transfer`` object (the store's address and the
bucket plan) to the proxy's ``/admin/policy`` in a thread, waits for the proxy to write the
group's size to the store (1 + the ranks of the engines that receive), joins, and sends the
buckets one after another. The proxy answers once every live replica serves the new version.

The tensors (:func:`named_tensors`) are the policy's weights under the names and in the layout
``save_pretrained`` writes, so any engine that loads HF checkpoints takes them: a tied LM head
once (as the embedding); a weight transformers keeps fused in memory (an MoE layer's experts:
transformers 5's ``mlp.experts.gate_up_proj`` (E, 2I, H) and ``down_proj`` (E, H, I)) as the
per-expert tensors of the checkpoint (``mlp.experts.{e}.gate_proj.weight``, ``up_proj``,
``down_proj``), split by transformers' own ``revert_weight_conversion`` (what
``save_pretrained`` calls), one in-memory tensor at a time. Under FSDP each in-memory tensor
is gathered whole on every rank in turn (only rank 0 keeps it: one tensor and one bucket at a
time, never the whole model); the bucket plan comes from :func:`layout` (meta tensors, no
weights). With a LoRA adapter only the adapter's tensors under PEFT's saved names, and
``lora_scaling`` for the engine to merge them. A bucket (:func:`plan_buckets`) is one flat byte tensor of at
most ``bucket_bytes`` (a tensor larger than that goes alone): peak extra memory is one bucket on
each side. Each tensor starts at a multiple of :data:`ALIGN` bytes. Over gloo (CPU) each bucket
is sent to each rank on its own, so a receiver that dies fails only its own sends; over NCCL
it is broadcast. docs/formats.md (claw.policy/v1) has the record.
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import Any

import torch

from claw_rl import _dist
from claw_rl.errors import ClawError
from claw_rl.learner import Learner
from claw_rl.records import Policy

ALIGN = 16
BUCKET_BYTES = 256 << 20
WORLD_KEY = "world_size"


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _sources(learner: Learner) -> list[tuple[str, torch.Tensor]]:
    """The policy's in-memory (state_dict name, tensor) pairs, a tied tensor once, in a fixed
    order (every rank the same); under FSDP the sharded DTensors. With LoRA, the adapter's."""
    if learner.adapter is not None:
        from peft import get_peft_model_state_dict

        return list(get_peft_model_state_dict(learner.adapter).items())
    seen: set[int] = set()
    out = []
    skip = set(getattr(learner.policy, "_keys_to_ignore_on_save", None) or ())
    for name, t in learner.policy.state_dict(keep_vars=True).items():
        if id(t) in seen or name in skip:  # tied: sent once, under its first name
            continue
        seen.add(id(t))
        out.append((name, t))
    return out


def _on_disk(model: torch.nn.Module, name: str, t: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """`t` (the model's in-memory tensor `name`, whole) as ``save_pretrained`` writes it: one
    tensor or the parts transformers fused it from (views of `t`)."""
    from transformers.core_model_loading import revert_weight_conversion

    return list(revert_weight_conversion(model, {name: t}).items())


def _meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(tuple(t.shape), dtype=t.dtype, device="meta")  # a DTensor's global shape


def _split_sources(learner: Learner, sources: list[tuple[str, torch.Tensor]]) -> dict[str, list]:
    """{in-memory name: its on-disk (name, meta tensor) parts} for the tensors that
    ``save_pretrained`` writes otherwise (renamed or split); checked against the conversion of
    the whole state at once (a conversion that joins several in-memory tensors into one on-disk
    tensor cannot be sent one tensor at a time)."""
    if learner.adapter is not None or not _has_conversions(learner.policy):
        return {}
    model = learner.policy
    split: dict[str, list] = {}
    per: dict[str, tuple] = {}
    for name, t in sources:
        parts = _on_disk(model, name, _meta(t))
        per.update((n, tuple(p.shape)) for n, p in parts)
        if [(n, tuple(p.shape)) for n, p in parts] != [(name, tuple(t.shape))]:
            split[name] = parts
    if split:
        from transformers.core_model_loading import revert_weight_conversion

        whole = revert_weight_conversion(model, {n: _meta(t) for n, t in sources})
        if {n: tuple(p.shape) for n, p in whole.items()} != per:
            raise ClawError(
                f"{type(model).__name__}: transformers' checkpoint layout joins several in-memory "
                "tensors into one; its weights cannot be sent one tensor at a time"
            )
    return split


def _has_conversions(model: torch.nn.Module) -> bool:
    """Whether transformers writes some weight of `model` under another name or layout."""
    if getattr(model, "_weight_conversions", None):
        return True
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
    except ImportError:  # a transformers without checkpoint conversions
        return False
    return bool(get_model_conversion_mapping(model, add_legacy=False))


def layout(learner: Learner) -> list[tuple[str, torch.Tensor]]:
    """The (on-disk name, meta tensor) pairs :func:`publish` sends, in order: names, dtypes and
    shapes without any weight (the bucket plan)."""
    sources = _sources(learner)
    split = _split_sources(learner, sources)
    out: list[tuple[str, torch.Tensor]] = []
    for name, t in sources:
        out += split[name] if name in split else [(name, _meta(t))]
    return out


def _stream(learner: Learner) -> Iterator[tuple[str, torch.Tensor]]:
    """The pairs of :func:`layout` with their weights, one in-memory tensor at a time (a split
    one gathered whole first under FSDP: a collective, every rank takes part)."""
    sources = _sources(learner)
    split = _split_sources(learner, sources)
    for name, t in sources:
        if name not in split:
            yield name, t
            continue
        t = t.detach()
        if _dist.is_sharded(t):
            t = t.full_tensor()
        yield from _on_disk(learner.policy, name, t)


def named_tensors(learner: Learner) -> list[tuple[str, torch.Tensor]]:
    """The policy's (name, tensor) pairs to send, in a fixed order, under the names and in the
    layout ``save_pretrained`` writes (see the module docstring); with LoRA the adapter's.
    Under FSDP a split tensor is gathered whole here, the others stay sharded (gathered while
    sending). For the same-process shortcut and checks; :func:`publish` streams them."""
    return list(_stream(learner))


def lora_scaling(learner: Learner) -> float | None:
    """PEFT's merge scaling of the learner's adapter (alpha / r, or / sqrt(r) with rsLoRA)."""
    if learner.adapter is None:
        return None
    cfg = next(iter(learner.adapter.peft_config.values()))
    return cfg.lora_alpha / (math.sqrt(cfg.r) if cfg.use_rslora else cfg.r)


def plan_buckets(
    tensors: list[tuple[str, torch.Tensor]], bucket_bytes: int = BUCKET_BYTES
) -> list[dict]:
    """Buckets of at most `bucket_bytes` in order: ``{"names", "dtypes", "shapes", "bytes"}``;
    a tensor larger than a bucket goes alone."""
    if bucket_bytes < 1:
        raise ClawError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    buckets: list[dict] = []
    cur: dict = {"names": [], "dtypes": [], "shapes": [], "bytes": 0}
    for name, t in tensors:
        n = _aligned(t.numel() * t.element_size())
        if cur["names"] and cur["bytes"] + n > bucket_bytes:
            buckets.append(cur)
            cur = {"names": [], "dtypes": [], "shapes": [], "bytes": 0}
        cur["names"].append(name)
        cur["dtypes"].append(_dtype_name(t.dtype))
        cur["shapes"].append(list(t.shape))
        cur["bytes"] += n
    if cur["names"]:
        buckets.append(cur)
    return buckets


def packed(
    tensors: Iterable[tuple[str, torch.Tensor]], buckets: list[dict], device: str = "cpu"
) -> Iterator[torch.Tensor | None]:
    """Each bucket as one flat uint8 tensor (rank 0; other ranks get None after taking part
    in each FSDP gather)."""
    it = iter(tensors)
    for b in buckets:
        buf = (
            torch.zeros(b["bytes"], dtype=torch.uint8, device=device)
            if _dist.world()[0] == 0
            else None
        )
        off = 0
        for want in b["names"]:
            name, t = next(it)
            if name != want:
                raise ClawError(f"the bucket plan has {want!r} where the tensors have {name!r}")
            t = t.detach()
            if _dist.is_sharded(t):
                t = t.full_tensor()  # a collective: every rank takes part
            n = t.numel() * t.element_size()
            if buf is not None:
                buf[off : off + n].copy_(t.contiguous().reshape(-1).view(torch.uint8).to(device))
            off += _aligned(n)
        yield buf


def next_policy(learner: Learner, path: str) -> dict:
    """The ``claw.policy/v1`` record of the learner's weights without writing them: the
    version grows by one when they changed (as :func:`claw_rl.checkpoint.save_policy`);
    ``path`` is the directory with the config and tokenizer (and the last written weights)."""
    if learner.dirty:
        learner.version += 1
        learner.dirty = False
    return Policy.now(
        name=learner.config.name,
        version=learner.version,
        path=path,
        step=learner.step_count,
        metrics=learner.last_metrics,
    ).to_dict()


class _Post(threading.Thread):
    """POST /admin/policy in a thread: the proxy answers once every engine serves it."""

    def __init__(self, url: str, token: str, body: dict, timeout: float) -> None:
        super().__init__(daemon=True, name="claw-rl-transfer-post")
        self.req = urllib.request.Request(
            url.rstrip("/") + "/admin/policy",
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json", "authorization": f"Bearer {token}"},
        )
        self.timeout = timeout
        self.answer: dict | None = None
        self.error: str | None = None

    def run(self) -> None:
        try:
            with urllib.request.urlopen(self.req, timeout=self.timeout) as r:  # noqa: S310
                self.answer = json.loads(r.read())
        except urllib.error.HTTPError as e:
            self.error = f"{e.code}: {e.read()[:500].decode(errors='replace')}"
        except (OSError, ValueError) as e:
            self.error = f"{type(e).__name__}: {e}"


def _wait_world(store, key: str, post: _Post, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        try:
            store.wait([key], timedelta(seconds=0.2))
            return int(store.get(key))
        except RuntimeError:  # not there yet: the proxy may have refused the record
            if not post.is_alive() and post.error is not None:
                raise ClawError(f"the proxy refused the policy: {post.error}") from None
            if time.monotonic() > deadline:
                raise ClawError(f"the proxy told no group size within {timeout:g} s") from None


def _send(group, buf: torch.Tensor, index: int, world: int, backend: str, failed: set) -> None:
    if backend == "nccl":
        group.broadcast(buf, 0).wait()
        return
    for rank in range(1, world):
        if rank in failed:
            continue
        try:
            group.send([buf], rank, index).wait()
        except RuntimeError:  # that receiver died: the others still get the bucket
            failed.add(rank)


def publish(
    learner: Learner,
    policy: dict,
    proxy_url: str,
    admin_token: str,
    *,
    host: str = "127.0.0.1",
    bucket_bytes: int = BUCKET_BYTES,
    backend: str = "gloo",
    timeout: float = 600.0,
) -> dict:
    """Send the learner's weights as `policy` to every engine behind the proxy at `proxy_url`
    (see the module docstring). Every rank calls it (FSDP gathers); rank 0 sends and returns
    ``{"seconds", "bytes", "buckets", "world_size", "failed_ranks", "answer"}`` (the proxy's
    answer to the POST), other ranks ``{}``. A refusal by the proxy is a ClawError."""
    buckets = plan_buckets(layout(learner), bucket_bytes)
    device = "cuda" if backend == "nccl" else "cpu"
    if learner.rank != 0:
        for _ in packed(_stream(learner), buckets, device):
            pass
        return {}
    t0 = time.monotonic()
    import torch.distributed as dist

    store = dist.TCPStore(
        host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout)
    )
    transfer: dict[str, Any] = {
        "method": "broadcast",
        "address": f"{_host_for(host)}:{store.port}",
        "buckets": buckets,
        "backend": backend,
    }
    if (scaling := lora_scaling(learner)) is not None:
        transfer["lora_scaling"] = scaling
    post = _Post(proxy_url, admin_token, {**policy, "transfer": transfer}, timeout)
    post.start()
    prefix = f"claw/v{policy['version']}/"
    world = _wait_world(store, prefix + WORLD_KEY, post, timeout)
    group_store = dist.PrefixStore(prefix, store)
    if backend == "nccl":
        group = dist.ProcessGroupNCCL(group_store, 0, world, dist.ProcessGroupNCCL.Options())
    else:
        group = dist.ProcessGroupGloo(group_store, 0, world, timedelta(seconds=timeout))
    failed: set[int] = set()
    for i, buf in enumerate(packed(_stream(learner), buckets, device)):
        assert buf is not None
        _send(group, buf, i, world, backend, failed)
    post.join(timeout)
    if post.error is not None or post.answer is None:
        raise ClawError(f"the proxy did not take v{policy['version']}: {post.error or 'no answer'}")
    return {
        "seconds": round(time.monotonic() - t0, 3),
        "bytes": sum(b["bytes"] for b in buckets),
        "buckets": len(buckets),
        "world_size": world,
        "failed_ranks": sorted(failed),
        "answer": post.answer,
    }


def _host_for(host: str) -> str:
    """The address engines reach the store at: `host`, or this machine's name for 0.0.0.0."""
    return socket.gethostname() if host in ("0.0.0.0", "") else host


__all__ = [
    "BUCKET_BYTES",
    "layout",
    "lora_scaling",
    "named_tensors",
    "next_policy",
    "plan_buckets",
    "publish",
]
