"""The task model: one directory per task, loaded and validated into a frozen Task.

Layout of a claw task directory (see the package README for a complete example)::

    my-task/
      task.toml          id, instruction (or instruction_file), timeout_s, tags, difficulty,
                         optional [verify] timeout_s / pass_threshold
      workspace/         initial files (text or binary), copied into the agent's workspace
      verify.py          the verifier (or verify.sh, or `verify` with a shebang)
      hidden/            optional files only the verifier sees (expected outputs, tests)
      rubric.json        optional rubric chain judged by a model, criterion by criterion
                         (claw_bench.loaders.rubric)
      setup.sh           optional, runs in the workspace before the agent
      solution.sh        optional reference solution (or solution.py), never shown to the agent

The verifier runs with the final workspace as its working directory after the agent finished;
its files lie under ``.claw_verify/``. It exits 0 on pass and may write a reward in [0,1], or a
JSON object of named sub-scores in [0,1], to ``$CLAW_REWARD_FILE``.
"""

from __future__ import annotations

import base64
import re
import tomllib
from pathlib import Path
from typing import Any

import attrs

from claw_bench._rubric_spec import RubricError, load_rubric_file
from claw_bench.errors import TaskError

#: a task file's content: UTF-8 text, or exact bytes for anything else (binary files)
FileContent = str | bytes
VERIFY_DIR = ".claw_verify"
REWARD_FILE = f"{VERIFY_DIR}/reward.json"
TASK_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
DIFFICULTIES = ("easy", "medium", "hard")
_SCRIPT_NAMES = {
    "verify": ("verify.py", "verify.sh", "verify"),
    "setup": ("setup.py", "setup.sh", "setup"),
    "solution": ("solution.py", "solution.sh", "solution"),
}
_TOP_KEYS = {
    "id",
    "instruction",
    "instruction_file",
    "timeout_s",
    "tags",
    "difficulty",
    "verify",
    "image",
    "meta",
}
_VERIFY_KEYS = {"timeout_s", "pass_threshold"}


@attrs.frozen(kw_only=True)
class Script:
    """A script shipped with a task: its file name, text and the interpreter that runs it."""

    name: str
    text: str
    interpreter: str

    def command(self, where: str) -> str:
        """The bash command line that runs this script stored at ``where`` (workspace-relative)."""
        return f"{self.interpreter} {where}"


@attrs.frozen(kw_only=True)
class Task:
    """One benchmark task: instruction, initial workspace, verifier and hidden files."""

    id: str
    instruction: str
    timeout_s: float = 600.0
    tags: tuple[str, ...] = ()
    difficulty: str | None = None
    workspace: dict[str, FileContent] = attrs.field(factory=dict)
    verify: Script
    hidden: dict[str, FileContent] = attrs.field(factory=dict)
    verify_timeout_s: float = 120.0
    pass_threshold: float | None = None
    reward_file: str = REWARD_FILE
    setup: Script | None = None
    solution: Script | None = None
    #: files next to the solution (Harbor's whole ``solution/`` folder, ``solve.sh`` among them)
    solution_files: dict[str, FileContent] = attrs.field(factory=dict)
    image: str | None = None
    source: str = "claw"
    path: str | None = None
    meta: dict[str, Any] = attrs.field(factory=dict)

    def verify_files(self) -> dict[str, FileContent]:
        """Hidden files placed in the workspace only after the agent finished."""
        files: dict[str, FileContent] = {f"{VERIFY_DIR}/{self.verify.name}": self.verify.text}
        files.update({f"{VERIFY_DIR}/{k}": v for k, v in self.hidden.items()})
        return files

    def verify_command(self) -> str:
        """The bash command the sandbox runs (in the workspace) to verify the final state.

        A reward file the agent may have planted is removed first, and Python verifiers run
        isolated (``-I``: neither the script's directory nor PYTHON* variables reach sys.path),
        so modules planted next to the verifier cannot replace the ones it imports.
        """
        script = f"{VERIFY_DIR}/{self.verify.name}"
        run = (
            f"python3 -I {script}"
            if self.verify.interpreter == "python3"
            else self.verify.command(script)
        )
        return f"rm -f {self.reward_file} && CLAW_VERIFY_DIR={VERIFY_DIR} CLAW_REWARD_FILE={self.reward_file} {run}"

    def to_dict(self) -> dict[str, Any]:
        """A summary dict (what `claw-bench tasks --json` prints); file contents are left out."""
        return {
            "id": self.id,
            "source": self.source,
            "difficulty": self.difficulty,
            "tags": list(self.tags),
            "timeout_s": self.timeout_s,
            "files": sorted(self.workspace),
            "verify": self.verify.name,
            "hidden": sorted(self.hidden),
            "has_solution": self.solution is not None,
            "pass_threshold": self.pass_threshold,
            "image": self.image,
            "path": self.path,
            "instruction": self.instruction,
        }


def interpreter_for(name: str, text: str) -> str:
    """python3 for ``*.py`` or a python shebang, bash for everything else."""
    first = text.splitlines()[0] if text else ""
    if name.endswith(".py") or (first.startswith("#!") and "python" in first):
        return "python3"
    if first.startswith("#!") and first.split("/")[-1].split()[-1] == "sh":
        return "sh"
    return "bash"


def read_text_tree(root: Path, *, what: str) -> dict[str, FileContent]:
    """All files under ``root`` as {relative posix path: content}: UTF-8 text as ``str``, any other
    file as its exact ``bytes`` (binary inputs, test data, tarballs travel byte-exact as
    ``{"content_b64": ...}`` in the job). ``what`` names the task in errors (unreadable file)."""
    files: dict[str, FileContent] = {}
    if not root.is_dir():
        return files
    for p in sorted(root.rglob("*")):
        if p.is_dir() or "__pycache__" in p.parts:
            continue
        rel = p.relative_to(root).as_posix()
        try:
            data = p.read_bytes()
        except OSError as exc:
            raise TaskError(f"{what}: {p}: cannot read: {exc.strerror}") from exc
        try:
            files[rel] = data.decode("utf-8")
        except UnicodeDecodeError:
            files[rel] = data
    return files


def job_files(files: dict[str, FileContent]) -> dict[str, Any]:
    """claw.job/v1 ``files`` entries: text as strings, bytes as ``{"content_b64": base64}``."""
    return {
        k: v if isinstance(v, str) else {"content_b64": base64.b64encode(v).decode("ascii")}
        for k, v in files.items()
    }


def _script(task_dir: Path, kind: str, *, required: bool) -> Script | None:
    found = [task_dir / n for n in _SCRIPT_NAMES[kind] if (task_dir / n).is_file()]
    if len(found) > 1:
        raise TaskError(
            f"{task_dir}: more than one {kind} script: {', '.join(p.name for p in found)}"
        )
    if not found:
        if required:
            raise TaskError(
                f"{task_dir}: missing verifier: expected one of {', '.join(_SCRIPT_NAMES[kind])}"
            )
        return None
    p = found[0]
    text = p.read_text(encoding="utf-8")
    if not text.strip():
        raise TaskError(f"{p}: {kind} script is empty")
    return Script(name=p.name, text=text, interpreter=interpreter_for(p.name, text))


def _number(
    table: dict[str, Any], key: str, where: str, default: float | None, *, lo: float, hi: float
) -> float | None:
    if key not in table:
        return default
    v = table[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
        raise TaskError(f"{where}: field {key!r} must be a number in [{lo}, {hi}], got {v!r}")
    return float(v)


def _rubric_chain(task_dir: Path, instruction: str, meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` with the task's rubric chain (``rubric.json``), if any: its judge spec, and its
    evidence globs added to what the run collects."""
    path = task_dir / "rubric.json"
    if not path.is_file():
        return dict(meta)
    try:
        spec = load_rubric_file(path, instruction)
    except RubricError as exc:
        raise TaskError(str(exc)) from exc
    return {**meta, "judge": spec, "collect": [*meta.get("collect", []), *spec["evidence"]]}


def load_task(task_dir: str | Path) -> Task:
    """Load and validate one claw task directory; errors name the task, file and field."""
    task_dir = Path(task_dir)
    toml_path = task_dir / "task.toml"
    if not toml_path.is_file():
        raise TaskError(f"{task_dir}: not a task directory (no task.toml)")
    try:
        meta = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise TaskError(f"{toml_path}: invalid TOML: {exc}") from exc
    where = str(toml_path)
    unknown = set(meta) - _TOP_KEYS
    if unknown:
        raise TaskError(
            f"{where}: unknown field(s) {sorted(unknown)}; allowed: {sorted(_TOP_KEYS)}"
        )
    tid = meta.get("id")
    if not isinstance(tid, str) or not TASK_ID.match(tid):
        raise TaskError(f"{where}: field 'id' must match {TASK_ID.pattern}, got {tid!r}")
    where = f"task {tid} ({toml_path})"
    instruction = meta.get("instruction")
    if "instruction_file" in meta:
        if instruction is not None:
            raise TaskError(f"{where}: give 'instruction' or 'instruction_file', not both")
        ipath = task_dir / str(meta["instruction_file"])
        if not ipath.is_file():
            raise TaskError(f"{where}: field 'instruction_file': {ipath} does not exist")
        instruction = ipath.read_text(encoding="utf-8")
    if not isinstance(instruction, str) or not instruction.strip():
        raise TaskError(f"{where}: field 'instruction' must be a non-empty string")
    tags = meta.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) and t for t in tags):
        raise TaskError(f"{where}: field 'tags' must be a list of non-empty strings, got {tags!r}")
    difficulty = meta.get("difficulty")
    if difficulty is not None and difficulty not in DIFFICULTIES:
        raise TaskError(
            f"{where}: field 'difficulty' must be one of {DIFFICULTIES}, got {difficulty!r}"
        )
    vtable = meta.get("verify", {})
    if not isinstance(vtable, dict) or set(vtable) - _VERIFY_KEYS:
        raise TaskError(
            f"{where}: table [verify] allows only {sorted(_VERIFY_KEYS)}, got {vtable!r}"
        )
    image = meta.get("image")
    if image is not None and not isinstance(image, str):
        raise TaskError(f"{where}: field 'image' must be a string")
    extra = meta.get("meta", {})
    if not isinstance(extra, dict):
        raise TaskError(f"{where}: field 'meta' must be a table")
    extra = _rubric_chain(task_dir, instruction, extra)
    try:
        verify = _script(task_dir, "verify", required=True)
        assert verify is not None
        setup = _script(task_dir, "setup", required=False)
        solution = _script(task_dir, "solution", required=False)
        workspace = read_text_tree(task_dir / "workspace", what=f"task {tid}")
        hidden = read_text_tree(task_dir / "hidden", what=f"task {tid}")
    except TaskError as exc:
        raise TaskError(f"task {tid}: {exc}") from exc
    return Task(
        id=tid,
        instruction=instruction.strip() + "\n",
        timeout_s=_number(meta, "timeout_s", where, 600.0, lo=1e-3, hi=1e6),  # type: ignore[arg-type]
        tags=tuple(tags),
        difficulty=difficulty,
        workspace=workspace,
        verify=verify,
        hidden=hidden,
        verify_timeout_s=_number(vtable, "timeout_s", f"{where} [verify]", 120.0, lo=1e-3, hi=1e6),  # type: ignore[arg-type]
        pass_threshold=_number(vtable, "pass_threshold", f"{where} [verify]", None, lo=0.0, hi=1.0),
        setup=setup,
        solution=solution,
        image=image,
        source="claw",
        path=str(task_dir),
        meta=dict(extra),
    )
