"""A Harbor task's compose file as claw.job/v1 ``services`` (sidecars the docker backend starts).

What the docker backend can give a sidecar: its image, environment, command, healthcheck, the
order its ``depends_on`` implies, and a network shared with the task's container where it is
reached by its name (so ``expose`` needs nothing more). Anything else (volumes, ports, networks,
profiles, a build with a Dockerfile elsewhere or arguments, settings of the ``main`` service but
``depends_on``...) is a reason naming the key: such a task is not planned on docker either, never run with the key silently dropped.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: a sidecar's keys the docker backend carries out (``build``: by ``claw-bench images --build``)
SERVICE_KEYS = {"image", "build", "environment", "command", "healthcheck", "depends_on", "expose"}
#: top-level keys that change nothing the job runs (``x-*`` extension fields too)
TOP_KEYS = {"services", "version", "name"}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
_UNIT_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class ComposeUnsupported(Exception):
    """A compose feature the docker backend cannot carry out; the message names the key."""


_VARIABLE = re.compile(r"\$(?:\{|[A-Za-z_])")


def _unescaped(value: Any, where: str) -> Any:
    """``value`` with compose's ``$$`` as ``$``; ComposeUnsupported at a ``${VAR}`` / ``$VAR``
    interpolation (its value would come from the host's environment or a .env file)."""
    if isinstance(value, dict):
        return {k: _unescaped(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_unescaped(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value
    parts = value.split("$$")
    for part in parts:
        if _VARIABLE.search(part):
            raise ComposeUnsupported(f"{where}: variable interpolation ({part!r}) is not supported")
    return "$".join(parts)


def duration_s(value: Any, where: str) -> float:
    """A compose duration (``1m30s``, ``500ms``, or a number of seconds) in seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ComposeUnsupported(f"{where}: {value!r} is not a duration such as 5s or 1m30s")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def _environment(value: Any, where: str) -> dict[str, str]:
    if isinstance(value, dict):
        return {str(k): "" if v is None else str(v) for k, v in value.items()}
    if isinstance(value, list) and all(isinstance(x, str) for x in value):
        bare = [x for x in value if "=" not in x]
        if bare:  # compose passes the host's value through: a job takes nothing from the host
            raise ComposeUnsupported(
                f"{where}: {bare[0]} without a value (the host's) is not supported"
            )
        return dict(x.split("=", 1) for x in value)
    raise ComposeUnsupported(f"{where}: expected a mapping or a list of KEY=VALUE")


def _command(value: Any, where: str) -> list[str]:
    """A compose command: a list is an argv; a string is split as compose splits it (no shell)."""
    if isinstance(value, str):
        return shlex.split(value)
    if isinstance(value, list) and value and all(isinstance(x, str) for x in value):
        return list(value)
    raise ComposeUnsupported(f"{where}: expected a string or a list of strings")


def _healthcheck(value: Any, where: str) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        raise ComposeUnsupported(f"{where}: expected a mapping")
    if value.get("disable") is True:
        return None
    extra = set(value) - {"test", "interval", "timeout", "retries", "start_period", "disable"}
    if extra:
        raise ComposeUnsupported(f"{where}.{sorted(extra)[0]} is not supported")
    test = value.get("test")
    if isinstance(test, list) and test and test[0] == "NONE":
        return None
    if isinstance(test, str):
        command: str | list[str] = test
    elif isinstance(test, list) and len(test) == 2 and test[0] == "CMD-SHELL":
        command = str(test[1])
    elif isinstance(test, list) and len(test) > 1 and test[0] == "CMD":
        command = [str(x) for x in test[1:]]
    else:
        raise ComposeUnsupported(f"{where}.test: expected a string, [CMD, ...] or [CMD-SHELL, s]")
    out: dict[str, Any] = {"command": command}
    for key, field in (("interval", "interval_s"), ("timeout", "timeout_s")):
        if key in value:
            out[field] = duration_s(value[key], f"{where}.{key}")
    if "start_period" in value:
        out["start_period_s"] = duration_s(value["start_period"], f"{where}.start_period")
    if "retries" in value:
        out["retries"] = int(value["retries"])
    return out


def _depends_on(value: Any, where: str) -> list[str]:
    if isinstance(value, list):
        return [str(x) for x in value]
    if not isinstance(value, dict):
        raise ComposeUnsupported(f"{where}: expected a list or a mapping")
    for dep, spec in value.items():
        cond = spec.get("condition", "service_started") if isinstance(spec, dict) else None
        if cond not in ("service_started", "service_healthy"):
            raise ComposeUnsupported(f"{where}.{dep}.condition {cond!r} is not supported")
    return [str(x) for x in value]


def build_context(spec: Any, env_dir: Path, where: str) -> Path:
    """The folder a service's ``build`` (a path, or ``{context}``) builds from, with the default
    Dockerfile, inside the task's ``environment/``."""
    if isinstance(spec, dict):
        extra = sorted(set(spec) - {"context"})
        if extra:
            raise ComposeUnsupported(f"{where}.{extra[0]} is not supported")
        spec = spec.get("context", ".")
    if not isinstance(spec, str):
        raise ComposeUnsupported(f"{where}: expected a path or {{context: path}}")
    ctx = (env_dir / spec).resolve()
    if not ctx.is_relative_to(env_dir.resolve()) or not (ctx / "Dockerfile").is_file():
        raise ComposeUnsupported(
            f"{where}: {spec!r} is not a folder with a Dockerfile in environment/"
        )
    return ctx


def _service(
    name: str, spec: Any, where: str, tag: Callable[[str, Any, str], str] | None
) -> tuple[dict[str, Any], list[str]]:
    """(the job's service, the services it depends on); ``tag`` names the image a ``build`` makes."""
    if not isinstance(spec, dict):
        raise ComposeUnsupported(f"{where}: expected a mapping")
    if not _NAME.match(name):
        raise ComposeUnsupported(f"{where}: the name is not a host name ([a-z0-9_.-])")
    extra = sorted(set(spec) - SERVICE_KEYS)
    if extra:
        raise ComposeUnsupported(f"{where}.{extra[0]} is not supported")
    image = spec.get("image")
    if "build" in spec:
        if image is not None or tag is None:
            raise ComposeUnsupported(f"{where}.build is not supported (with an image, or here)")
        image = tag(name, spec["build"], f"{where}.build")
    if not isinstance(image, str) or not image:
        raise ComposeUnsupported(f"{where}: needs an image")
    out: dict[str, Any] = {"name": name, "image": image}
    if "environment" in spec:
        out["env"] = _environment(spec["environment"], f"{where}.environment")
    if spec.get("command") is not None:
        out["command"] = _command(spec["command"], f"{where}.command")
    if "healthcheck" in spec:
        hc = _healthcheck(spec["healthcheck"], f"{where}.healthcheck")
        if hc is not None:
            out["healthcheck"] = hc
    return out, _depends_on(spec.get("depends_on", []), f"{where}.depends_on")


def _ordered(services: dict[str, tuple[dict, list[str]]], rel: str) -> list[dict[str, Any]]:
    """The services in an order where each comes after those it depends on."""
    done: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in done:
            return
        if name in path:
            raise ComposeUnsupported(f"{rel}: depends_on cycle {' -> '.join((*path, name))}")
        if name not in services:
            raise ComposeUnsupported(f"{rel}: depends_on names {name!r}, not a sidecar service")
        for dep in services[name][1]:
            visit(dep, (*path, name))
        done.append(name)

    for name in services:
        visit(name, ())
    return [services[n][0] for n in done]


def compose_services(
    data: dict[str, Any], rel: str, tag: Callable[[str, Any, str], str] | None = None
) -> list[dict[str, Any]]:
    """The sidecars of a compose mapping as claw.job/v1 ``services``, in start order;
    ComposeUnsupported naming the first key the docker backend cannot carry out. ``tag(name,
    build, where)`` gives the image of a service with a ``build`` (none: builds are refused)."""
    extra = sorted(k for k in set(data) - TOP_KEYS if not str(k).startswith("x-"))
    if extra:
        raise ComposeUnsupported(f"{rel}: top-level key {extra[0]!r} is not supported")
    services = _unescaped(data["services"], f"{rel}: services")
    main = services.get("main") or {}
    if not isinstance(main, dict) or set(main) - {"depends_on"}:
        keys = sorted(set(main) - {"depends_on"}) if isinstance(main, dict) else ["(not a mapping)"]
        raise ComposeUnsupported(f"{rel}: services.main.{keys[0]} is not supported")
    _depends_on(main.get("depends_on", []), f"{rel}: services.main.depends_on")
    side = {
        str(n): _service(str(n), spec, f"{rel}: services.{n}", tag)
        for n, spec in services.items()
        if n != "main"
    }
    return _ordered(side, rel)
