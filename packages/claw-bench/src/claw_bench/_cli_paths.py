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
