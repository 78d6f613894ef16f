"""Host paths the programs a command names need, so an allow-list sandbox can show them.

A harness installed in a venv or an npm prefix outside the system directories (e.g. under the
checkout: ``.tools/bin/mini -> .venvs/mini-swe-agent/bin/mini``) is found on the runner's PATH,
but inside bwrap's allow-list view of the host it would not exist. `command_paths` finds the
programs a command runs (each simple command's first word, and the name in ``command -v NAME``)
on the sandbox's PATH (only its directories that are on the runner's PATH too), and for each
returns what it needs to run: the directories of the links on
the way to it, its venv (with the base Python and editable sources) or its ``node_modules`` tree,
and the same for the interpreter its ``#!`` line names. Only programs are followed, never data
files; what already lies in the sandbox's system view is filtered by the caller.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import os
import re
import shlex
import shutil
from pathlib import Path

from claw_sandbox.records import Command

# tokens after which the next word is a command again
_SEPARATORS = {";", "&&", "||", "|", "&", "|&", ";;", "(", ")", "{", "}", "!"}
_PREFIXES = {"if", "then", "else", "elif", "do", "while", "until", "exec", "command", "env",
             "nohup", "time", "xargs"}  # fmt: skip
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_MAX_DEPTH = 4  # interpreter of an interpreter of ...: enough for env -> node, venv python


def command_words(command: Command) -> list[str]:
    """The programs a command runs: argv[0] of a list; for a shell string the first word of
    each simple command (after assignments and prefixes such as ``exec``, ``env``, ``command
    -v``). A string the shell would refuse to parse names nothing."""
    if not isinstance(command, str):
        return [command[0]] if command else []
    lex = shlex.shlex(command.replace("\n", " ; "), posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    try:
        tokens = list(lex)
    except ValueError:
        return []
    names, expect = [], True
    for tok in tokens:
        if tok in _SEPARATORS or (expect and tok in _PREFIXES):
            expect = True
        elif expect and (tok.startswith("-") or _ASSIGNMENT.match(tok)):
            continue  # an option of a prefix (command -v, env -i) or VAR=value
        elif expect:
            names.append(tok)
            expect = False
    return names


def command_paths(command: Command, search_path: str) -> list[str]:
    """Host paths the programs of `command` need (see the module docstring), found on
    `search_path` (the sandbox's PATH) where it agrees with the runner's own PATH: a job's
    command or env cannot make the sandbox show a host directory the runner does not run
    programs from (a path given as a program, e.g. ``/root/.ssh/x``, is not followed)."""
    runner = set(os.environ.get("PATH", "").split(os.pathsep))
    search = os.pathsep.join(d for d in search_path.split(os.pathsep) if d and d in runner)
    out: list[str] = []
    for name in dict.fromkeys(command_words(command)):
        exe = shutil.which(name, path=search) if search and "/" not in name else None
        if exe and os.path.isabs(exe) and os.path.isfile(exe):
            out += program_paths(exe, search)
    return list(dict.fromkeys(out))


def program_paths(exe: str, search_path: str, depth: int = 0) -> list[str]:
    """What one program file needs: each link's directory on the way to it, the installation
    holding its real file, and (from its ``#!`` line) its interpreter's paths."""
    out: list[str] = []
    p, hops = exe, 0
    while os.path.islink(p) and hops < 40:
        out.append(os.path.dirname(p))  # the link itself must be there to be followed
        p = os.path.normpath(os.path.join(os.path.dirname(p), os.readlink(p)))
        hops += 1
    real = os.path.realpath(p)
    interpreter = _shebang(real)
    if depth == 0 and _is_shell_wrapper(real, interpreter):
        return []
    out += installation_of(real)
    if interpreter and depth < _MAX_DEPTH:
        words = interpreter.split()
        if os.path.basename(words[0]) == "env":  # #!/usr/bin/env [-S] node ...
            rest = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
            found = shutil.which(rest[0], path=search_path) if rest else None
            words = [found] if found else []
        if words and os.path.isabs(words[0]) and os.path.isfile(words[0]):
            out += program_paths(words[0], search_path, depth + 1)
    return out


@functools.lru_cache(maxsize=64)
def venv_closure(prefix: str) -> tuple[str, ...]:
    """A venv, its base Python (`home` in pyvenv.cfg) and its editable sources (.pth, finders)."""
    root = Path(prefix)
    out = [str(root)]
    cfg = root / "pyvenv.cfg"
    if cfg.is_file():
        for line in cfg.read_text(errors="replace").splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                out.append(str(Path(value.strip()).parent))
    for site in root.glob("lib/python*/site-packages"):
        for pth in site.glob("*.pth"):
            for line in pth.read_text(errors="replace").splitlines():
                line = line.strip()
                if line.startswith("/") and os.path.isdir(line):
                    out.append(line)
        for finder in site.glob("__editable__*finder.py"):
            match = re.search(
                r"^MAPPING\s*(?::[^=]*)?=\s*(\{.*?\})\s*$",
                finder.read_text(errors="replace"),
                re.M | re.S,
            )
            if match:
                with contextlib.suppress(ValueError, SyntaxError):
                    out += [
                        v for v in ast.literal_eval(match.group(1)).values() if isinstance(v, str)
                    ]
    return tuple(out)


def installation_of(real: str) -> list[str]:
    """The directories a program's real file belongs with: its venv (and what the venv needs),
    the outermost ``node_modules`` above it (the package and its dependencies), else its own
    directory."""
    path = Path(real)
    for parent in path.parents:
        if (parent / "pyvenv.cfg").is_file():
            return list(venv_closure(str(parent)))
    modules = [p for p in path.parents if p.name == "node_modules"]
    if modules:
        return [str(modules[-1])]
    return [str(path.parent)]


_SHELLS = {"sh", "bash", "dash", "zsh", "ksh"}


def _is_shell_wrapper(real: str, interpreter: str | None) -> bool:
    """A shell script outside a venv or ``node_modules`` (a pyenv or asdf shim, say): it runs
    paths it does not name, so nothing here could make it work inside, and showing its directory
    would put its siblings (``python3``, ``pip``) in front of the system's on the sandbox's PATH,
    where they fail. Such a program, named by a command, is not shown (`claw-sandbox doctor`
    says whether it runs inside); one named by another program's ``#!`` line still is."""
    if not interpreter:
        return False
    words = interpreter.split()
    name = os.path.basename(words[0])
    if name == "env":
        rest = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        name = os.path.basename(rest[0]) if rest else ""
    if name not in _SHELLS:
        return False
    parents = Path(real).parents
    return not any((d / "pyvenv.cfg").is_file() or d.name == "node_modules" for d in parents)


def _shebang(path: str) -> str | None:
    """The interpreter line of a script (without ``#!``), None for anything else."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0].decode(errors="replace").strip()
    return line or None
