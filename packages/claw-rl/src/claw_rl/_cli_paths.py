"""Output paths checked while the command line is parsed, before any work is done."""

from __future__ import annotations

import os
from pathlib import Path

import click


def output_path(
    ctx: click.Context | None, param: click.Parameter | None, value: str | None
) -> str | None:
    """Click callback: ``-`` (stdout), or a file path whose directory exists and that is no directory.

    A mistake is a one-line ``click.BadParameter`` naming the path (exit code 2), raised before
    the command runs, so nothing is read, computed or written first.
    """
    if value is None or value == "-":
        return value
    path = Path(value)
    if path.is_dir() or value.endswith(("/", os.sep)):
        raise click.BadParameter(f"{value}: is a directory; give a file path", ctx=ctx, param=param)
    parent = path.parent
    if not parent.is_dir():
        why = "is not a directory" if parent.exists() else "does not exist"
        raise click.BadParameter(f"{value}: its directory {parent} {why}", ctx=ctx, param=param)
    return value


def refuse_taken_policies(out_dir: Path, version: int, n_steps: int, rank: int = 0) -> None:
    """Refuse a run whose steps would save over ``OUT/policy/v{version+1..version+n_steps}``.

    Called before the run writes anything, so a refused run leaves ``OUT`` as it was. Under
    torchrun rank 0 looks and tells the others (every rank must raise, or a rank would hang).
    """
    wanted = (out_dir / "policy" / f"v{version + k}" for k in range(1, n_steps + 1))
    taken = [next((str(d) for d in wanted if rank == 0 and d.is_dir() and any(d.iterdir())), None)]
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(taken, src=0)
    if taken[0] is not None:
        raise click.BadParameter(
            f"{out_dir}: {taken[0]} exists and is not empty; choose a new --output, --resume this "
            f"run's checkpoint, or --start-version past it",
            param_hint="'--output'",
        )
