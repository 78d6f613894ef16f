"""Harness adapters as data: one TOML file per harness says how to run it against the proxy.

Fields of an adapter (all strings may use the ``{{placeholders}}`` listed in PLACEHOLDERS)::

    name = "claude-code"                 # defaults to the file name
    description = "..."
    api = "anthropic"                    # chat | anthropic | responses (what it speaks); none: no model
    requires = ["claude"]                # executables that must be on PATH ("installed")
    install = ["npm install -g ..."]     # commands that install it (job setup with --install)
    instruction = "arg"                  # arg: {{instruction}} (shell-quoted) in `command`;
                                         # file: {{instruction_file}} in `command`;
                                         # stdin: the instruction file is fed on stdin
    model = "claw-policy"                # model name the harness asks the proxy for
    command = "claude -p {{instruction}} ..."
    continue_command = "claude -c -p ..."  # optional: a prompt that continues the last session
                                         # (multi-session tasks); same placeholders as command
    [env]                                # environment of the harness
    ANTHROPIC_BASE_URL = "{{base_url}}"
    [files]                              # config files written into the workspace first
    ".claw_harness/cfg.json" = "..."
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import attrs

from claw_bench.errors import HarnessError

APIS = ("chat", "anthropic", "responses", "none")
#: harnesses built into claw-bench, not adapters: they call no model and need no proxy
BUILTINS = ("oracle", "nothing")
INSTRUCTION_MODES = ("arg", "file", "stdin")
HARNESS_DIR = ".claw_harness"
INSTRUCTION_FILE = f"{HARNESS_DIR}/instruction.md"
PLACEHOLDERS = {
    "base_url": "proxy base URL inside the sandbox, no /v1 (http://127.0.0.1:PORT)",
    "port": "loopback port of the proxy inside the sandbox",
    "token": "the session token (API key)",
    "model": "the adapter's model name (or plan --model)",
    "instruction": "the task instruction (shell-quoted inside `command`)",
    "instruction_file": f"workspace-relative file holding the instruction ({INSTRUCTION_FILE})",
    "python": "the planning machine's Python interpreter (sys.executable)",
    "session": "the session id",
    "task": "the task id",
    "harness": "the harness name",
}
_PH = re.compile(r"\{\{\s*([A-Za-z_]+)\s*\}\}")
_KEYS = {
    "name",
    "description",
    "api",
    "requires",
    "install",
    "instruction",
    "model",
    "command",
    "continue_command",
    "env",
    "files",
}
HARNESS_PATH_ENV = "CLAW_BENCH_HARNESSES"


@attrs.frozen(kw_only=True)
class Harness:
    """A harness adapter loaded from TOML."""

    name: str
    api: str
    command: str
    description: str = ""
    requires: tuple[str, ...] = ()
    install: tuple[str, ...] = ()
    instruction: str = "arg"
    model: str = "claw-policy"
    env: dict[str, str] = attrs.field(factory=dict)
    files: dict[str, str] = attrs.field(factory=dict)
    path: str | None = None
    #: "oracle" / "nothing" for the built-in harnesses (see BUILTINS), None for an adapter
    builtin: str | None = None
    #: the command for a prompt that continues the harness's previous session in the workspace
    #: (multi-session tasks); None: every prompt starts a new session
    continue_command: str | None = None

    @property
    def needs_model(self) -> bool:
        """Whether the harness talks to a model (through the proxy)."""
        return self.api != "none"

    def installed(self) -> bool:
        """Whether every required executable is on PATH (always True when none is required)."""
        return all(shutil.which(r) for r in self.requires)

    def render(
        self, values: dict[str, str], *, cont: bool = False
    ) -> tuple[str, dict[str, str], dict[str, str]]:
        """(command, env, files) with placeholders filled; ``values`` holds every placeholder.
        ``cont``: the ``continue_command`` (continue the previous session), when there is one."""
        plain = dict(values)
        quoted = {**plain, "instruction": shlex.quote(plain["instruction"])}
        template = self.continue_command if cont and self.continue_command else self.command
        command = _fill(template, quoted)
        if self.instruction == "stdin":
            command = f"{command} < {INSTRUCTION_FILE}"
        env = {k: _fill(v, plain) for k, v in self.env.items()}
        files = {_fill(k, plain): _fill(v, plain) for k, v in self.files.items()}
        files[INSTRUCTION_FILE] = plain["instruction"]
        return command, env, files

    def to_dict(self) -> dict[str, Any]:
        """Summary for `claw-bench harnesses --json`."""
        return {
            "name": self.name,
            "api": self.api,
            "installed": self.installed(),
            "requires": list(self.requires),
            "install": list(self.install),
            "instruction": self.instruction,
            "model": self.model,
            "description": self.description,
            "path": self.path,
            "builtin": self.builtin,
            "continue_command": self.continue_command,
        }


def builtin_harness(name: str) -> Harness:
    """A built-in harness: ``oracle`` runs the task's own reference solution (Harbor
    ``solution/solve.sh`` with its sibling files, a claw task's ``solution.sh`` / ``.py``);
    ``nothing`` does nothing (the floor: a task it passes is unsound). Neither calls a model."""
    if name == "oracle":
        return Harness(
            name="oracle",
            api="none",
            command="true",
            instruction="file",
            builtin="oracle",
            description="runs the task's reference solution (not scorable when it has none)",
        )
    if name == "nothing":
        return Harness(
            name="nothing",
            api="none",
            command="true",
            instruction="file",
            builtin="nothing",
            description="does nothing: the floor every task must fail",
        )
    raise HarnessError(f"unknown built-in harness {name!r}; built-ins: {', '.join(BUILTINS)}")


def _fill(text: str, values: dict[str, str]) -> str:
    return _PH.sub(lambda m: values[m.group(1)], text)


def _check_placeholders(text: str, where: str) -> None:
    for m in _PH.finditer(text):
        if m.group(1) not in PLACEHOLDERS:
            raise HarnessError(
                f"{where}: unknown placeholder {{{{{m.group(1)}}}}}; known: {sorted(PLACEHOLDERS)}"
            )


def _str_list(meta: dict, key: str, where: str) -> tuple[str, ...]:
    v = meta.get(key, [])
    if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
        raise HarnessError(f"{where}: field {key!r} must be a list of non-empty strings, got {v!r}")
    return tuple(v)


def _str_table(meta: dict, key: str, where: str) -> dict[str, str]:
    v = meta.get(key, {})
    if not isinstance(v, dict) or not all(isinstance(x, str) for x in v.values()):
        raise HarnessError(f"{where}: table [{key}] must map names to strings")
    for k, x in v.items():
        _check_placeholders(k, f"{where} [{key}]")
        _check_placeholders(x, f"{where} [{key}].{k}")
    return dict(v)


def load_harness_file(path: str | Path) -> Harness:
    """Load and validate one adapter TOML; errors name the file and the field."""
    path = Path(path)
    where = str(path)
    try:
        meta = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise HarnessError(f"{where}: cannot read: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise HarnessError(f"{where}: invalid TOML: {exc}") from exc
    unknown = set(meta) - _KEYS
    if unknown:
        raise HarnessError(f"{where}: unknown field(s) {sorted(unknown)}; allowed: {sorted(_KEYS)}")
    name = meta.get("name", path.stem)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", name):
        raise HarnessError(
            f"{where}: field 'name' must be letters, digits, '-' or '_', got {name!r}"
        )
    api = meta.get("api")
    if api not in APIS:
        raise HarnessError(
            f"{where}: field 'api': unknown API {api!r}; expected one of {', '.join(APIS)}"
        )
    command = meta.get("command")
    if not isinstance(command, str) or not command.strip():
        raise HarnessError(f"{where}: field 'command' must be a non-empty string")
    _check_placeholders(command, f"{where}: field 'command'")
    mode = meta.get("instruction", "arg")
    if mode not in INSTRUCTION_MODES:
        raise HarnessError(
            f"{where}: field 'instruction' must be one of {INSTRUCTION_MODES}, got {mode!r}"
        )
    if mode == "arg" and "instruction" not in _PH.findall(command):
        raise HarnessError(
            f"{where}: field 'command' must contain {{{{instruction}}}} when instruction = \"arg\""
        )
    if mode == "file" and "instruction_file" not in _PH.findall(command):
        raise HarnessError(
            f"{where}: field 'command' must contain {{{{instruction_file}}}} when instruction = \"file\""
        )
    for key in ("description", "model", "continue_command"):
        if key in meta and not isinstance(meta[key], str):
            raise HarnessError(f"{where}: field {key!r} must be a string")
    cont = meta.get("continue_command")
    if cont is not None:
        _check_placeholders(cont, f"{where}: field 'continue_command'")
        need = {"arg": "instruction", "file": "instruction_file"}.get(mode)
        if need and need not in _PH.findall(cont):
            raise HarnessError(
                f"{where}: field 'continue_command' must contain {{{{{need}}}}} like 'command'"
            )
    return Harness(
        name=name,
        api=api,
        command=command.strip(),
        description=meta.get("description", ""),
        requires=_str_list(meta, "requires", where),
        install=_str_list(meta, "install", where),
        instruction=mode,
        model=meta.get("model", "claw-policy"),
        env=_str_table(meta, "env", where),
        files=_str_table(meta, "files", where),
        path=str(path),
        continue_command=cont.strip() if cont else None,
    )


def harness_dirs() -> list[Path]:
    """Where adapters are looked up: $CLAW_BENCH_HARNESSES (os.pathsep-separated), then built-ins."""
    extra = [Path(p) for p in os.environ.get(HARNESS_PATH_ENV, "").split(os.pathsep) if p]
    return [*extra, Path(str(resources.files("claw_bench") / "harnesses"))]


def load_harness(name_or_path: str | Path) -> Harness:
    """Load an adapter by name (searched in harness_dirs()) or by the path of its TOML file."""
    s = str(name_or_path)
    if s in BUILTINS:
        return builtin_harness(s)
    if s.endswith(".toml") or os.sep in s:
        return load_harness_file(s)
    for d in harness_dirs():
        p = d / f"{s}.toml"
        if p.is_file():
            return load_harness_file(p)
    raise HarnessError(
        f"unknown harness {s!r}; known: {', '.join(h.name for h in list_harnesses())}"
    )


def list_harnesses() -> list[Harness]:
    """Every adapter found in harness_dirs(); a name found twice is taken from the first dir."""
    seen: dict[str, Harness] = {n: builtin_harness(n) for n in BUILTINS}
    for d in harness_dirs():
        if not d.is_dir():
            continue
        for p in sorted(d.glob("*.toml")):
            if p.stem not in seen:
                seen[p.stem] = load_harness_file(p)
    return sorted(seen.values(), key=lambda h: h.name)


def sandbox_check(harnesses: list[Harness], backend: str = "auto") -> dict[str, dict[str, Any]]:
    """Whether each installed harness's executables run inside claw-sandbox, as its jobs will
    find them (``claw-sandbox doctor --backend B PROGRAM...``): harness name -> {"checked",
    "works", "why"}. Found on PATH here is not enough: an allow-list sandbox may not show where
    it is installed. Without the claw-sandbox command nothing is checked (checked False)."""
    import subprocess
    import sys

    wanted = sorted({r for h in harnesses if h.requires and h.installed() for r in h.requires})
    if not wanted:
        return {}
    exe = shutil.which("claw-sandbox") or str(Path(sys.executable).parent / "claw-sandbox")
    if not os.access(exe, os.X_OK):
        why = "claw-sandbox is not installed here"
        rows: dict[str, dict[str, Any]] = {r: {"works": None, "why": why} for r in wanted}
    else:
        try:
            p = subprocess.run(
                [exe, "doctor", "--json", "--backend", backend, *wanted],
                capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            found = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
            err = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
        except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
            found, err = [], str(exc)
        rows = {r["name"]: r for r in found if r.get("kind") == "program"}
        for r in wanted:
            rows.setdefault(r, {"works": None, "why": f"claw-sandbox doctor failed: {err}"})
    out = {}
    for h in harnesses:
        if not (h.requires and h.installed()):
            continue
        bad = [rows[r] for r in h.requires if rows[r]["works"] is not True]
        out[h.name] = {
            "checked": all(rows[r]["works"] is not None for r in h.requires),
            "works": not bad,
            "why": bad[0]["why"] if bad else "; ".join(rows[r]["why"] for r in h.requires),
        }
    return out
