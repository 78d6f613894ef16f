"""Data parallelism under ``torchrun``: ranks own samples balanced by token count
(:func:`assign`), gradients are summed (the loss is a weighted sum over the global batch, so a
sum is exact, not a mean, whichever rank forwards a sample).

Two ways to hold the model (``parallelism`` in the configs):

* ``ddp`` - every rank holds the whole model and optimizer; gradients are all-reduced here.
* ``fsdp`` - FSDP2 (``torch.distributed.fsdp.fully_shard``): each decoder layer and the rest
  of the model are sharded across ranks, so parameters, gradients and AdamW state take 1/world
  of the memory each; gradients are reduce-scattered (summed, not averaged) by FSDP itself.
  Every FSDP forward pass is a collective, so ranks must run the same number of them (the
  learner pads with zero-weight passes). Small replicated modules (the value head) are
  all-reduced as in ``ddp``.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) outside torchrun."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_from_env(backend: str | None = None) -> tuple[int, int]:
    """Initialise the process group when launched by torchrun (WORLD_SIZE > 1)."""
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        # on GPUs: NCCL for CUDA tensors (gradients, weights), gloo for the CPU ones (metrics)
        dist.init_process_group(
            backend or ("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
        )
    return world()


def shutdown() -> None:
    """End the process group cleanly (every rank); leaving it to interpreter exit can abort a
    rank ("terminate called without an active exception") while gloo's threads still run."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if world()[1] > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_max(t: torch.Tensor) -> torch.Tensor:
    if world()[1] > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t


def reduce_sums(values: dict[str, float]) -> dict[str, float]:
    """Sum each named float over ranks (one float64 all-reduce)."""
    t = all_reduce_sum(torch.tensor(list(values.values()), dtype=torch.float64))
    return dict(zip(values, t.tolist(), strict=True))


def reduce_max(value: float) -> float:
    """The largest ``value`` over ranks."""
    return float(all_reduce_max(torch.tensor([value], dtype=torch.float64))[0])


def assign(sizes: Sequence[int], ranks: int) -> list[list[int]]:
    """Each rank's sample indices (ascending), balanced by token count: largest sample first,
    each to the rank with the fewest tokens so far (then fewest samples, then lowest rank).

    A pure function of ``sizes`` and ``ranks``, so every rank computes the same split without a
    collective. Greedy by size (LPT) keeps the busiest rank within one sample of the idlest:
    max tokens <= min tokens + the largest sample. A rank owns nothing only when there are
    fewer samples than ranks.
    """
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    load = [(0, 0, r) for r in range(ranks)]  # (tokens, samples, rank): a min-heap
    out: list[list[int]] = [[] for _ in range(ranks)]
    for k in sorted(range(len(sizes)), key=lambda k: (-sizes[k], k)):
        tokens, count, r = heapq.heappop(load)
        out[r].append(k)
        heapq.heappush(load, (tokens + sizes[k], count + 1, r))
    return [sorted(ks) for ks in out]


def own(sizes: Sequence[int]) -> list[int]:
    """The indices of a global batch of samples of ``sizes`` tokens this rank forwards
    (:func:`assign`)."""
    rank, size = world()
    return assign(sizes, size)[rank]


def gather_dicts(d: dict) -> dict:
    """The union of every rank's ``d`` (disjoint keys; picklable values, CPU tensors)."""
    if world()[1] == 1:
        return d
    parts: list = [None] * world()[1]
    dist.all_gather_object(parts, d)
    return {k: v for part in parts for k, v in part.items()}


def passes(n: int, sharded: bool) -> int:
    """Forward passes this rank runs for its ``n`` micro-batches: under FSDP each pass gathers
    parameters from every rank, so all ranks run as many as the busiest one."""
    if not sharded:
        return n
    return int(all_reduce_max(torch.tensor([n], dtype=torch.int64))[0])


def rank0_decides(flag: bool) -> bool:
    """Rank 0's ``flag`` on every rank (a rank left waiting in a collective would hang)."""
    box = [flag]
    if world()[1] > 1:
        dist.broadcast_object_list(box, src=0)
    return bool(box[0])


def from_rank0(value: T) -> T:
    """Rank 0's ``value`` (picklable) on every rank."""
    box = [value]
    if world()[1] > 1:
        dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if world()[1] > 1:
        dist.barrier()


def reshard(modules: list[torch.nn.Module]) -> None:
    """Free the gathered parameters an FSDP forward without backward leaves behind (the root
    keeps its own gathered after forward, expecting a backward)."""
    for module in modules:
        module.reshard()


def full_options() -> object:
    """State-dict options: whole tensors, gathered to CPU (rank 0)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_state_dicts(
    modules: dict[str, torch.nn.Module], sharded: list[torch.nn.Module]
) -> dict[str, dict]:
    """Whole state dicts of the FSDP-sharded ones among ``modules`` (a collective; on rank 0).

    A tied weight (the LM head sharing the embeddings) is gathered once per name; it is kept
    under the name ``named_parameters`` gives it, as ``save_pretrained`` expects.
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    out = {}
    for name, m in modules.items():
        if any(m is s for s in sharded):
            full = get_model_state_dict(m, options=full_options())
            names = {n for n, _ in m.named_parameters()} | {n for n, _ in m.named_buffers()}
            out[name] = {k: v for k, v in full.items() if k in names}
    return out


def is_sharded(t: torch.Tensor) -> bool:
    """Whether a tensor is an FSDP shard (a DTensor)."""
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def fully_shard_model(model: torch.nn.Module) -> torch.nn.Module:
    """Shard an HF model with FSDP2: one unit per decoder layer, the root holds the rest.

    The layers are found through the model's ``_no_split_modules`` (HF's list of blocks that
    must stay whole); tied embeddings stay in the root unit, so the tie survives. Gradients are
    summed over ranks (divide factor 1), matching the learner's global-batch loss.
    """
    from torch.distributed.fsdp import fully_shard

    blocks = set(getattr(model, "_no_split_modules", None) or ())
    for module in list(model.modules()):
        if module is not model and type(module).__name__ in blocks:
            fully_shard(module)
    fully_shard(model)
    for module in model.modules():
        if hasattr(module, "set_gradient_divide_factor"):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # plain SUM: gloo has no PREMUL_SUM
    return model


_NORM_CHUNK = 1 << 24  # elements per float64 norm: at most 128 MiB of float64 upcast at a time


def _sq_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Sum of squared L2 norms, as a CPU float64 scalar (one device-to-host copy).

    The norms are taken in float64 because the clip coefficient must not depend on how the
    gradients are split: FSDP sums per-shard squares, one process per-tensor squares, and in
    float32 the two groupings differ by ~1e-7 relative. AdamW then turns a 2e-7 relative change
    of the coefficient into ~1.4e-6 of weight change after the test_ddp worker's PPO steps
    (measured); in float64 the grouping error is ~1e-16, far below float32 resolution. Chunks
    bound the float64 copy of a large tensor.
    """
    if not tensors:
        return torch.zeros((), dtype=torch.float64)
    norms = torch.stack(
        [
            torch.linalg.vector_norm(c, dtype=torch.float64)
            for t in tensors
            for c in t.reshape(-1).split(_NORM_CHUNK)
        ]
    )
    return norms.pow(2).sum().cpu()


def clip_grads(params: list[torch.nn.Parameter], max_norm: float) -> float:
    """Clip the global gradient norm to ``max_norm`` and return the norm before clipping.

    Works on a mix of FSDP shards (their squared norms are summed over ranks) and whole tensors
    (identical on every rank after :func:`sum_grads`).
    """
    grads = [p.grad for p in params if p.grad is not None]
    shards = [g.to_local() for g in grads if is_sharded(g)]
    sq = _sq_norm(shards)
    if shards:
        all_reduce_sum(sq)
    total = float((sq + _sq_norm([g for g in grads if not is_sharded(g)])).sqrt())
    coef = max_norm / (total + 1e-6)
    if coef < 1.0:
        for g in grads:
            g.mul_(coef)
    return total


def sum_grads(params: list[torch.nn.Parameter]) -> None:
    """Give every parameter a gradient (zeros if unused) and sum the whole (not FSDP-sharded)
    ones over ranks; FSDP has already reduce-scattered the shards."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    params = [p for p in params if not is_sharded(p)]
    if world()[1] > 1 and params:
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        off = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[off : off + n].view_as(p.grad))
            off += n


def broadcast_params(params: list[torch.nn.Parameter]) -> None:
    """Make every rank start from rank 0's weights."""
    if world()[1] > 1:
        with torch.no_grad():
            for p in params:
                if not is_sharded(p):  # FSDP shards come from the same weights on every rank
                    dist.broadcast(p.data, src=0)
