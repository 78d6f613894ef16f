"""Reading a Dockerfile as Docker does, for what a backend that builds no image can still use.

- :func:`instructions`: the instructions, continuation lines joined as Docker joins them (the
  escape character and the newline go, nothing else), comment and empty lines inside them
  dropped, heredoc bodies (``RUN <<EOF ... EOF``) kept with their instruction.
- :func:`expand`: one word through Docker's shell lexer: single quotes are literal, double
  quotes expand ``$``, a backslash escapes the next character (in double quotes only ``"``,
  ``$`` and ``\\``), and ``$V``, ``${V}``, ``${V:-d}``, ``${V-d}``, ``${V:+x}``, ``${V+x}``,
  ``${V:?msg}`` and ``${V?msg}`` are substituted from a mapping.
- :func:`env_pairs` / :func:`arg_pairs`: the ``ENV`` (``k=v ...`` and legacy ``k v``) and ``ARG``
  (``name[=default] ...``) forms.

BuildKit's glob prefix / suffix removal (``${V#p}``, ``${V##p}``, ``${V%p}``, ``${V%%p}``) is
substituted too. Deviations from Docker: the ``# escape=`` parser directive is not read (the
escape character is always ``\\``), and the replacement operator (``${V/a/b}``) is not
substituted: a word that uses it is an error naming it, never a silently wrong value.
"""

from __future__ import annotations

import fnmatch
import json
import platform
import posixpath
import re
from collections.abc import Mapping

import attrs

#: what Docker gives a container whose image sets no PATH (and BuildKit a base image without one)
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DOLLAR_NAME = re.compile(r"[0-9]+|[A-Za-z_][A-Za-z0-9_]*")  # `$1x` is $1, then x (as Docker)
_HEREDOC = re.compile(r"<<(-?)(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2")
_HEREDOC_AT = re.compile(r"(?i)(RUN|COPY|ADD)\s")  # the instructions BuildKit reads heredocs in


class DockerfileError(ValueError):
    """A Dockerfile word Docker would reject, or one this reader cannot expand."""


def instructions(text: str) -> list[tuple[int, str]]:
    """``(line number, instruction text)`` in order; a continued instruction is one entry."""
    out: list[tuple[int, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        start, first = i + 1, lines[i].lstrip()
        i += 1
        if not first or first.startswith("#"):
            continue
        joined, more = _trim_continuation(first)
        while more and i < len(lines):
            line = lines[i]
            i += 1
            if line.lstrip().startswith("#") or not line.strip():
                continue  # comments and empty lines inside a continued instruction
            part, more = _trim_continuation(line)
            joined += part
        heredocs = _HEREDOC.finditer(joined) if _HEREDOC_AT.match(joined) else ()
        for match in heredocs:  # a heredoc's body belongs to its instruction
            end, strip = match.group(3), match.group(1) == "-"
            while i < len(lines):
                line = lines[i]
                i += 1
                joined += "\n" + line
                if (line.lstrip("\t") if strip else line) == end:
                    break
        out.append((start, joined))
    return out


def _trim_continuation(line: str) -> tuple[str, bool]:
    """(the line without a trailing escape character, whether the instruction continues)."""
    stripped = line.rstrip(" \t")
    if stripped.endswith("\\"):
        return stripped[:-1], True
    return line, False


def expand(word: str, env: Mapping[str, str]) -> str:
    """``word`` with quotes removed and variables substituted from ``env`` (Docker's rules)."""
    value, _ = _Lexer(word, env).word(stop="")
    return value


def split_words(text: str) -> list[str]:
    """Whitespace-separated words, quotes and escapes kept (Docker's parseWords for ENV/ARG)."""
    words, cur, quote, i = [], "", "", 0
    while i < len(text):
        ch = text[i]
        if not quote and ch in " \t\n":
            if cur:
                words.append(cur)
            cur, i = "", i + 1
            continue
        if ch == "\\" and i + 1 < len(text) and quote != "'":
            cur, i = cur + text[i : i + 2], i + 2
            continue
        if ch in "'\"" and (not quote or quote == ch):
            quote = "" if quote else ch
        cur, i = cur + ch, i + 1
    if quote:
        raise DockerfileError(f"unterminated {quote} quote in {text!r}")
    if cur:
        words.append(cur)
    return words


def env_pairs(rest: str, env: Mapping[str, str]) -> list[tuple[str, str]]:
    """The (name, value) pairs of an ``ENV`` instruction's arguments, expanded against ``env``
    (the environment before the instruction, as Docker expands every pair of one ENV)."""
    words = split_words(rest)
    if not words:
        raise DockerfileError("ENV needs at least one name=value")
    if "=" not in words[0]:  # legacy `ENV NAME value with spaces`
        name, value = [*re.split(r"[ \t]+", rest.strip(), maxsplit=1), ""][:2]
        if not value:
            raise DockerfileError(f"ENV {name} has no value (expected ENV {name}=value)")
        return [(expand(name, env), expand(value, env))]
    pairs = []
    for w in words:
        name, eq, value = w.partition("=")
        if not eq or not name:
            raise DockerfileError(f"ENV: {w!r} is not name=value")
        pairs.append((expand(name, env), expand(value, env)))
    return pairs


def arg_pairs(rest: str, env: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """The (name, default or None) pairs of an ``ARG`` instruction, defaults expanded."""
    pairs: list[tuple[str, str | None]] = []
    for w in split_words(rest):
        name, eq, value = w.partition("=")
        if not _NAME.fullmatch(name):
            raise DockerfileError(f"ARG: {name!r} is not a valid name")
        pairs.append((name, expand(value, env) if eq else None))
    if not pairs:
        raise DockerfileError("ARG needs a name")
    return pairs


class _Lexer:
    """Docker's shell-word lexer over one word (moby/buildkit frontend/dockerfile/shell)."""

    def __init__(self, text: str, env: Mapping[str, str]) -> None:
        self.text, self.env, self.i = text, env, 0

    def _peek(self) -> str:
        return self.text[self.i] if self.i < len(self.text) else ""

    def word(self, stop: str) -> tuple[str, bool]:
        """Read up to ``stop`` (or the end); (the value, whether ``stop`` was met)."""
        out: list[str] = []
        while self.i < len(self.text):
            ch = self.text[self.i]
            if stop and ch == stop:
                self.i += 1
                return "".join(out), True
            self.i += 1
            if ch == "'":
                end = self.text.find("'", self.i)
                if end < 0:
                    raise DockerfileError(f"unterminated ' quote in {self.text!r}")
                out.append(self.text[self.i : end])
                self.i = end + 1
            elif ch == '"':
                out.append(self._double())
            elif ch == "$":
                out.append(self._dollar())
            elif ch == "\\":
                if self.i < len(self.text):  # a lone trailing backslash is dropped
                    out.append(self.text[self.i])
                    self.i += 1
            else:
                out.append(ch)
        return "".join(out), False

    def _double(self) -> str:
        out: list[str] = []
        while self.i < len(self.text):
            ch = self.text[self.i]
            self.i += 1
            if ch == '"':
                return "".join(out)
            if ch == "$":
                out.append(self._dollar())
            elif ch == "\\" and self._peek() in ('"', "$", "\\"):
                out.append(self.text[self.i])
                self.i += 1
            elif ch == "\\" and not self._peek():
                continue
            else:
                out.append(ch)
        raise DockerfileError(f'unterminated " quote in {self.text!r}')

    def _dollar(self) -> str:
        if self._peek() != "{":
            m = _DOLLAR_NAME.match(self.text, self.i)
            if not m:
                return "$"  # a `$` not followed by a name stays
            self.i = m.end()
            return self.env.get(m.group(0), "")
        self.i += 1
        m = _NAME.match(self.text, self.i) or re.compile(r"[0-9]+").match(self.text, self.i)
        if not m:
            raise DockerfileError(f"bad substitution in {self.text!r}: no name after '${{'")
        name = m.group(0)
        self.i = m.end()
        if self._peek() == "}":
            self.i += 1
            return self.env.get(name, "")
        op = self._peek()
        if op == ":":
            self.i += 1
            op += self._peek()
        elif op in ("#", "%") and self.text[self.i + 1 : self.i + 2] == op:
            op += op  # ## / %%: the longest match
            self.i += 1
        if op.lstrip(":") not in ("-", "+", "?", "#", "%", "##", "%%") or op in (":#", ":%"):
            raise DockerfileError(f"unsupported substitution in {self.text!r} at ${{{name}{op}")
        self.i += 1
        arg, closed = self.word(stop="}")
        if not closed:
            raise DockerfileError(f"missing '}}' in {self.text!r}")
        return _modify(name, self.env.get(name), op, arg)


def _modify(name: str, value: str | None, op: str, arg: str) -> str:
    """``${name<op>arg}``: the defaults and alternatives (``:-`` ``-`` ``:+`` ``+`` ``:?``
    ``?``; with the colon an empty value counts as unset) and BuildKit's glob prefix / suffix
    removal (``#`` ``##`` ``%`` ``%%``, shortest / longest match)."""
    if op[-1] in "#%":
        v = value or ""
        cuts = range(len(v) + 1) if len(op) == 1 else range(len(v), -1, -1)
        for n in cuts:
            if op[-1] == "#" and fnmatch.fnmatchcase(v[:n], arg):
                return v[n:]
            if op[-1] == "%" and fnmatch.fnmatchcase(v[len(v) - n :], arg):
                return v[: len(v) - n]
        return v
    present = value is not None and (value != "" or not op.startswith(":"))
    if op[-1] == "-":
        return value if present and value is not None else arg
    if op[-1] == "+":
        return arg if present else ""
    if not present:
        raise DockerfileError(f"{name}: {arg or 'is not set'}")
    return value or ""


#: BuildKit's automatic platform ARGs (a stage sees them once it declares them with ARG)
_MACHINE = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def _platform_args() -> dict[str, str]:
    arch = _MACHINE.get(platform.machine().lower(), platform.machine().lower())
    plat = {"PLATFORM": f"linux/{arch}", "OS": "linux", "ARCH": arch, "VARIANT": ""}
    return {f"{kind}{k}": v for kind in ("TARGET", "BUILD") for k, v in plat.items()}


@attrs.define
class Stage:
    """One build stage as far as it has been read: its environment and what it copies."""

    name: str | None
    workdir: str
    env: dict[str, str]  # the image's environment (the base's PATH and every ENV)
    set_env: dict[str, str]  # what the Dockerfile's ENV lines set (inherited from a stage too)
    args: dict[str, str] = attrs.field(factory=dict)  # this stage's ARGs with a value
    copies: list[tuple[list[str], str, str]] = attrs.field(factory=list)  # (srcs, dest, line)

    def scope(self) -> dict[str, str]:
        """What ``$V`` sees on a line of the stage: its ARGs, with ENV winning over them."""
        return {**self.args, **self.env}


@attrs.frozen
class Image:
    """The final stage of a Dockerfile: workdir, the ENV it sets (expanded), its local copies
    ``(sources, absolute destination, line)`` and the lines a host without the image cannot
    carry out (RUN, copies from stages or URLs, copies in other stages)."""

    workdir: str
    env: dict[str, str]
    copies: list[tuple[list[str], str, str]]
    not_run: list[str]


def _display(line: str) -> str:
    """An instruction as one line for messages: whitespace runs (continuations) as one space."""
    return " ".join(line.split())


def read_image(
    text: str, *, default_workdir: str, build_args: Mapping[str, str] | None = None
) -> Image:
    """Walk a Dockerfile's instructions as ``docker build`` would and return its final stage.

    ``FROM`` an earlier stage starts from that stage's environment and workdir; ``FROM`` any
    other image starts from Docker's default PATH and ``default_workdir`` (the image itself is
    not inspected). ``ARG`` defaults, ``build_args`` overrides and global ARGs (before the first
    FROM, seen by FROM lines and by a stage that re-declares them) expand as Docker expands
    them, as do ``ENV``, ``WORKDIR`` and the ``COPY``/``ADD`` arguments. DockerfileError names
    the line of a word that cannot be expanded.
    """
    overrides = dict(build_args or {})
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    not_run: list[str] = []
    for lineno, line in instructions(text):
        word, rest = [*line.split(None, 1), ""][:2]
        word, rest = word.upper(), rest.strip()
        try:
            stage = stages[-1] if stages else None
            if word == "FROM":
                stages.append(_from(rest, global_args, stages, default_workdir))
            elif word == "ARG":
                _arg(rest, stage, global_args, overrides)
            elif stage is None:
                continue  # only ARG (and parser directives) may come before the first FROM
            elif word == "ENV":
                pairs = env_pairs(rest, stage.scope())
                stage.env.update(pairs)
                stage.set_env.update(pairs)
            elif word == "WORKDIR" and rest:
                path = expand(rest, stage.scope())
                stage.workdir = posixpath.normpath(posixpath.join(stage.workdir, path))
            elif word in ("COPY", "ADD"):
                copy = _copy(rest, stage)
                if copy is None:
                    not_run.append(_display(line))
                else:
                    stage.copies.append((*copy, _display(line)))
            elif word == "RUN":
                not_run.append(_display(line))
        except DockerfileError as exc:
            raise DockerfileError(f"line {lineno}: {exc}") from None
    if not stages:
        raise DockerfileError("no FROM instruction")
    final = stages[-1]
    for st in stages[:-1]:  # an earlier stage's copies reach the image only through COPY --from
        not_run[:0] = [line for *_, line in st.copies]
    return Image(
        workdir=final.workdir, env=dict(final.set_env), copies=final.copies, not_run=not_run
    )


def _from(rest: str, global_args: dict[str, str], stages: list[Stage], default_wd: str) -> Stage:
    words = [w for w in split_words(rest) if not w.startswith("--")]  # --platform=...
    if not words:
        raise DockerfileError("FROM needs an image")
    image = expand(words[0], global_args)
    name = words[2].lower() if len(words) >= 3 and words[1].upper() == "AS" else None
    parent = next((s for s in reversed(stages) if s.name and s.name == image.lower()), None)
    if parent is not None:
        return Stage(
            name=name, workdir=parent.workdir, env=dict(parent.env), set_env=dict(parent.set_env)
        )
    return Stage(name=name, workdir=default_wd, env={"PATH": DEFAULT_PATH}, set_env={})


def _arg(
    rest: str, stage: Stage | None, global_args: dict[str, str], overrides: Mapping[str, str]
) -> None:
    scope = stage.scope() if stage else global_args
    for name, default in arg_pairs(rest, scope):
        if name in overrides:
            value: str | None = overrides[name]
        elif default is not None:
            value = default
        elif stage is not None and name in global_args:
            value = global_args[name]  # a global ARG re-declared in the stage
        else:
            value = _platform_args().get(name)
        if value is None:
            continue  # declared without a value: expands to ""
        (stage.args if stage else global_args)[name] = value


def _copy(rest: str, stage: Stage) -> tuple[list[str], str] | None:
    """(sources, absolute destination) of a local COPY/ADD; None when it is not one."""
    if rest.startswith("["):
        try:
            args = json.loads(rest)
        except json.JSONDecodeError as exc:
            raise DockerfileError(f"COPY/ADD: bad JSON form: {exc}") from None
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise DockerfileError("COPY/ADD: the JSON form must be a list of strings")
    else:
        args = split_words(rest)
    flags = [a for a in args if a.startswith("--")]
    args = [expand(a, stage.scope()) for a in args if not a.startswith("--")]
    kept = ("--chown", "--chmod", "--link")
    if any(not f.startswith(kept) for f in flags) or len(args) < 2 or "<<" in rest:
        return None  # --from, --exclude, ..., a heredoc, or no destination
    if any("://" in a for a in args[:-1]):
        return None
    dest = args[-1]
    dest_abs = posixpath.normpath(posixpath.join(stage.workdir, dest))
    if dest.endswith("/") or dest in (".", "./") or len(args) > 2:
        dest_abs += "/"  # a directory: the sources go into it
    return args[:-1], dest_abs
