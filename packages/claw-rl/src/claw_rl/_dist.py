"""Data parallelism under ``torchrun``: ranks own samples k % world == rank, gradients are
summed (the loss is a weighted sum over the global batch, so a sum is exact, not a mean)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) outside torchrun."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_from_env(backend: str | None = None) -> tuple[int, int]:
    """Initialise the process group when launched by torchrun (WORLD_SIZE > 1)."""
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group(backend or ("nccl" if torch.cuda.is_available() else "gloo"))
    return world()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if world()[1] > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_max(t: torch.Tensor) -> torch.Tensor:
    if world()[1] > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t


def sum_grads(params: list[torch.nn.Parameter]) -> None:
    """Give every parameter a gradient (zeros if unused) and sum them over ranks."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if world()[1] > 1:
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
                dist.broadcast(p.data, src=0)
