"""The Dockerfile subset `claw-sandbox build` carries out, read into steps.

One stage: ``FROM`` (``scratch`` or an image given as a local OCI layout or `docker save`
archive), ``ARG``, ``ENV``, ``WORKDIR``, ``USER``, ``COPY``/``ADD`` of files of the build
context (``--chown``, ``--chmod``), ``RUN`` (shell or JSON form), ``CMD``, ``ENTRYPOINT``,
``LABEL``, ``EXPOSE``. ``$V``, ``${V}``, ``${V:-default}`` and ``${V:+alt}`` expand from the
ARGs and ENVs set so far. Anything else (a second ``FROM``, ``COPY --from``, ``ADD URL``,
heredocs, ``SHELL``, ``ONBUILD``, ``HEALTHCHECK``, ``VOLUME``, ``STOPSIGNAL``) is a
`BuildError` naming the line, never silently skipped.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping

import attrs

from claw_sandbox.errors import BuildError

_VAR = re.compile(
    r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-+])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))"
)
KINDS = ("FROM", "ARG", "ENV", "WORKDIR", "USER", "COPY", "ADD", "RUN", "CMD", "ENTRYPOINT",
         "LABEL", "EXPOSE")  # fmt: skip


@attrs.frozen(kw_only=True)
class Step:
    """One instruction: its kind, its argument text (continuations joined) and its line."""

    kind: str
    text: str
    line: int

    def where(self, path: str) -> str:
        return f"{path}:{self.line}: {self.kind}"


def steps(text: str, path: str) -> list[Step]:
    """The instructions of a Dockerfile in order; BuildError names the line of one outside the
    subset (or a second FROM)."""
    out: list[Step] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        start, joined = i + 1, lines[i].strip()
        i += 1
        if not joined or joined.startswith("#"):
            continue
        while joined.endswith("\\") and i < len(lines):
            nxt = lines[i].strip()
            i += 1
            if not nxt.startswith("#"):
                joined = joined[:-1] + " " + nxt
        kind, _, rest = joined.partition(" ")
        kind = kind.upper()
        if kind not in KINDS:
            raise BuildError(f"{path}:{start}: {kind} is not supported by claw-sandbox build")
        if "<<" in rest and kind in ("RUN", "COPY", "ADD"):
            raise BuildError(f"{path}:{start}: heredocs are not supported by claw-sandbox build")
        if kind == "FROM" and any(s.kind == "FROM" for s in out):
            raise BuildError(f"{path}:{start}: a second FROM: multi-stage builds are not supported")
        out.append(Step(kind=kind, text=rest.strip(), line=start))
    if not out or out[0].kind not in ("FROM", "ARG") or not any(s.kind == "FROM" for s in out):
        raise BuildError(f"{path}: the first instruction must be FROM (or ARG before it)")
    return out


def expand(word: str, scope: Mapping[str, str]) -> str:
    """``$V``, ``${V}``, ``${V:-d}``, ``${V-d}``, ``${V:+x}``, ``${V+x}`` from ``scope``."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(4)
        op, arg = m.group(2), m.group(3) or ""
        value = scope.get(name)
        if op in (":-", "-"):
            unset = value is None or (op == ":-" and value == "")
            return arg if unset else str(value)
        if op in (":+", "+"):
            isset = value is not None and (op == "+" or value != "")
            return arg if isset else ""
        return value or ""

    return _VAR.sub(sub, word.replace("\\$", "\0")).replace("\0", "$")


def words(text: str, where: str) -> list[str]:
    """Shell-like words of an argument (quotes removed), or its JSON list form."""
    if text.startswith("["):
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise BuildError(f"{where}: bad JSON form: {exc}") from None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise BuildError(f"{where}: the JSON form must be a list of strings")
        return value
    try:
        return shlex.split(text, posix=True)
    except ValueError as exc:
        raise BuildError(f"{where}: {exc}") from None


def pairs(text: str, where: str, scope: Mapping[str, str]) -> list[tuple[str, str]]:
    """``K=V ...`` (or the legacy ``K V``) of ENV / LABEL, expanded."""
    parts = words(expand(text, scope), where)
    if parts and "=" not in parts[0] and len(parts) >= 2:
        return [(parts[0], " ".join(parts[1:]))]
    out = []
    for part in parts:
        key, eq, value = part.partition("=")
        if not key or not eq:
            raise BuildError(f"{where}: expected KEY=VALUE pairs, got {text!r}")
        out.append((key, value))
    return out
