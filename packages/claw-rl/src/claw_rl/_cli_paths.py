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


# claw-rl's own additions (the lines above are claw-tree's copy, byte for byte): input files and
# run directories, checked before a model loads, so a mistyped path is reported in a second.


def input_path(
    ctx: click.Context | None, param: click.Parameter | None, value: str | None
) -> str | None:
    """Click callback: ``-`` (stdin), or a readable file that exists.

    A mistake is a one-line ``click.BadParameter`` naming the path (exit code 2).
    """
    if value is None or value == "-":
        return value
    path = Path(value)
    if not path.exists():
        why = "does not exist"
    elif path.is_dir():
        why = "is a directory; give a JSONL file"
    elif not os.access(path, os.R_OK):
        why = "is not readable"
    else:
        return value
    raise click.BadParameter(f"{value}: {why}", ctx=ctx, param=param)


def run_dir(
    ctx: click.Context | None, param: click.Parameter | None, value: Path | None
) -> Path | None:
    """Click callback: a run directory that exists or can be made, and can be written to.

    A regular file in its place or on its way, or a directory that is not writable, is a
    one-line ``click.BadParameter`` naming the path (exit code 2), before any model loads.
    """
    if value is None:
        return value
    if value.exists() and not value.is_dir():
        raise click.BadParameter(f"{value}: is a file, not a directory", ctx=ctx, param=param)
    there = value.absolute()
    while not there.exists():  # the nearest existing ancestor: where mkdir -p starts
        there = there.parent
    if not there.is_dir():
        raise click.BadParameter(
            f"{value}: cannot be made: {there} is a file, not a directory", ctx=ctx, param=param
        )
    if not os.access(there, os.W_OK | os.X_OK):
        what = (
            "is not writable"
            if there == value.absolute()
            else f"cannot be made: {there} is not writable"
        )
        raise click.BadParameter(f"{value}: {what}", ctx=ctx, param=param)
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
