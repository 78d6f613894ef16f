"""The flags of `claw-proxy serve`, made from `ProxyConfig`'s fields: one flag per field, with
the field's help and default, so the two cannot drift apart. The field metadata (see
`config._f`) says how a flag's value becomes the field."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import attrs
import click

from claw_proxy.config import ProxyConfig, parse_route
from claw_proxy.errors import ConfigError


def flag_name(f: attrs.Attribute) -> str:
    """The flag that sets field `f`: its `flag` metadata, else --<name with dashes>."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _param(f: attrs.Attribute) -> str:
    return flag_name(f)[2:].replace("-", "_")


def _type(f: attrs.Attribute) -> Any:
    """The click type of a plain field's flag: its choices, its bounded range, or its type."""
    meta = f.metadata
    if meta.get("choices"):
        return click.Choice(meta["choices"])
    typ = meta.get("type") or type(f.default)
    if meta.get("min") is not None and typ in (int, float):
        ranged = click.IntRange if typ is int else click.FloatRange
        return ranged(min=meta["min"], min_open=bool(meta.get("min_open")))
    return typ


def _option(f: attrs.Attribute):
    """The click option of one field."""
    kind, flag, help_ = f.metadata.get("kind"), flag_name(f), f.metadata["help"]
    required = f.default is attrs.NOTHING
    if kind == "engines":
        return click.option(flag, "engines", multiple=True, help=help_)
    if kind in ("lines", "file"):
        path = click.Path(exists=True, dir_okay=False)
        return click.option(flag, _param(f), type=path, required=required, help=help_)
    if kind == "route":
        return click.option(
            flag, "routes", multiple=True, metavar=f.metadata["metavar"], help=help_
        )
    if kind == "env":
        return click.option(flag, _param(f), default=None, metavar="VAR", help=help_)
    if isinstance(f.default, bool):
        no = "--no-" + flag[2:]
        return click.option(
            f"{flag}/{no}", _param(f), default=f.default, show_default=True, help=help_
        )
    show = f.default is not None
    return click.option(
        flag, _param(f), type=_type(f), default=f.default, show_default=show, help=help_
    )


def config_options(fn):
    """A decorator adding one flag per `ProxyConfig` field, in the config's order."""
    for f in reversed(attrs.fields(ProxyConfig)):
        fn = _option(f)(fn)
    return fn


def _replica_lines(path: str | None) -> list[str]:
    """The engine specs of a replicas file: one per line, `#` comments and blank lines skipped."""
    if not path:
        return []
    lines = (line.split("#", 1)[0].strip() for line in Path(path).read_text("utf-8").splitlines())
    return [line for line in lines if line]


def engine_specs(options: dict[str, Any]) -> list[str]:
    """The engine specs of `serve`'s flags: --engine's, then the --replicas-file's lines."""
    return [*options["engines"], *_replica_lines(options.get("replicas_file"))]


def config_from_options(options: dict[str, Any]) -> ProxyConfig:
    """The `ProxyConfig` of `serve`'s parsed flags (keyed by parameter name): the first engine
    spec serves the policy, the rest are its replicas."""
    from claw_proxy.tokens import read_secret

    specs = engine_specs(options)
    if not specs:
        raise ConfigError("give the policy's engine: --engine SPEC (repeatable) or --replicas-file")
    values: dict[str, Any] = {"engine": specs[0], "replicas": tuple(specs[1:])}
    for f in attrs.fields(ProxyConfig):
        kind = f.metadata.get("kind")
        raw = options.get("routes" if kind == "route" else _param(f))
        if kind == "file":
            values[f.name] = read_secret(raw) if raw else None
        elif kind == "env":
            values[f.name] = os.environ.get(raw) if raw else None
        elif kind == "route":
            values[f.name] = tuple(parse_route(r) for r in raw or ())
        elif kind is None:
            values[f.name] = raw
    return ProxyConfig(**values)
