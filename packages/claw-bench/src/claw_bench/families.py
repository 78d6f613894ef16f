"""Task families: tasks generated from a seed instead of written one directory each.

A family directory holds ``family.toml`` and the family's verifier (``verify.py``)::

    family = "toy-steps"      # the generator (FAMILIES)
    seed = 0                  # fixes every instance
    [splits]                  # instances per split: ids <family>-<split>-NNNN, tagged <split>
    train = 128
    heldout = 32

Splits are kept apart: each split (in file order) words its instructions with phrasings of its
own (toy-steps' ``PHRASINGS``), and uses no number that an earlier split used anywhere, answer or
decoy, so nothing of a held-out instance occurs in training.

Each instance is an ordinary `Task` (workspace, hidden files, reference solution), and carries
its expert solution in ``task.meta["expert"]``: the steps a perfect agent takes, each
``{"tool": name, "arguments": {...}}`` (a call of claw-agent's tools) or ``{"text": "..."}``
(the final answer). `expert_script` turns them into answers for claw-proxy's scripted engine,
so a teacher plays them through a real harness (``claw-bench expert``).
"""

from __future__ import annotations

import json
import random
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from claw_bench.errors import TaskError
from claw_bench.tasks import Script, Task, interpreter_for

FAMILY_FILE = "family.toml"
_KEYS = {"family", "seed", "splits"}
_SPLIT = r"[a-z][a-z0-9]{0,15}"

# --- toy-steps: read a number from the named file, write it to the named file ----------------

_SOURCES = ("value.txt", "input.txt", "data.txt", "key.txt", "config.txt", "report.txt")
_TARGETS = ("result.txt", "output.txt", "total.txt", "count.txt")
_DISTRACTORS = 2  # other files of _SOURCES in the workspace, each with another number
_LOW, _HIGH = 100, 999  # every number is 3 digits
#: instruction phrasings per split, in family.toml's order: the first split (train) draws from
#: the first group, the second (heldout) from the second, ...; no phrasing is in two groups, so
#: a held-out instruction is never worded as a training one. Source and target names are the
#: shared vocabulary (six sources, four targets), in both orders in each group.
PHRASINGS: tuple[tuple[str, ...], ...] = (
    (
        "Read {src} and write the number in it to {dst}.",
        "Write the number that {src} holds to {dst}.",
        "{dst} must hold the number from {src}; write it there.",
    ),
    (
        "Copy the number stored in {src} into {dst}.",
        "Put the number found in {src} into {dst}.",
        "Into {dst}, put the number you find in {src}.",
    ),
    (
        "Take the number out of {src} and save it as {dst}.",
        "Save the number of {src} in {dst}.",
        "The number in {src} belongs in {dst}: save it there.",
    ),
)


@attrs.define
class _Numbers:
    """The numbers a family's instances use. Each instance gets an answer and decoys; no two
    instances share an answer, no decoy is an earlier answer, and a split uses no number that an
    earlier split used anywhere (answer or decoy): a held-out answer is in no training file."""

    earlier: set[int] = attrs.field(factory=set)  # every number of the splits before this one
    current: set[int] = attrs.field(factory=set)  # every number of this split so far
    answers: set[int] = attrs.field(factory=set)  # every answer so far

    def next_split(self) -> None:
        self.earlier |= self.current
        self.current = set()

    def draw(self, rng: random.Random, avoid: set[int], what: str) -> int:
        """A number outside `avoid` and the earlier splits' (TaskError when none is left)."""
        n = rng.randint(_LOW, _HIGH)
        tries = 0
        while n in avoid or n in self.earlier:
            tries += 1
            if tries > 64:  # crowded: pick among what is left, or say there is nothing
                free = [k for k in range(_LOW, _HIGH + 1) if k not in avoid | self.earlier]
                if not free:
                    raise TaskError(
                        f"toy-steps: no {_LOW}-{_HIGH} number is left for {what} (every one is "
                        "used by an earlier instance or split); ask for fewer instances"
                    )
                n = rng.choice(free)
                break
            n = rng.randint(_LOW, _HIGH)
        self.current.add(n)
        return n


def _toy_steps(
    split_no: int, rng: random.Random, numbers: _Numbers
) -> tuple[str, dict, dict, list[dict]]:
    """One toy-steps instance: (instruction, workspace, expected {path, content}, expert steps).

    Two tool calls are needed: the number is only in the workspace file, and the answer goes to
    another file. The instruction is one of the split's own PHRASINGS; the numbers follow
    `_Numbers`, so a held-out instance cannot be answered from anything seen in training.
    """
    src, *others = rng.sample(_SOURCES, 1 + _DISTRACTORS)
    dst = rng.choice(_TARGETS)
    template = rng.choice(PHRASINGS[split_no])
    answer = numbers.draw(rng, numbers.answers, "an answer")
    numbers.answers.add(answer)
    decoys: list[int] = []
    for _ in range(_DISTRACTORS):
        decoys.append(numbers.draw(rng, numbers.answers | set(decoys), "a decoy"))
    value = str(answer)
    workspace = {
        src: f"{value}\n",
        **{p: f"{n}\n" for p, n in zip(others, decoys, strict=True)},
    }
    instruction = template.format(src=src, dst=dst)
    expert: list[dict[str, Any]] = [
        {"tool": "read_file", "arguments": {"path": src}},
        {"tool": "write_file", "arguments": {"path": dst, "content": value}},
        {"text": "done"},
    ]
    return instruction, workspace, {"path": dst, "content": value}, expert


#: generator name -> (instance maker, tags, difficulty, most splits it can keep apart)
FAMILIES: dict[
    str, tuple[Callable[..., tuple[str, dict, dict, list[dict]]], tuple[str, ...], str, int]
] = {
    "toy-steps": (
        _toy_steps,
        ("toy", "tools", "multi-step", "toy-steps"),
        "easy",
        len(PHRASINGS),
    ),
}


def is_family_dir(path: Path) -> bool:
    """A task-family directory: it holds ``family.toml``."""
    return path.is_dir() and (path / FAMILY_FILE).is_file()


def load_family(path: str | Path) -> list[Task]:
    """Every instance of the family in ``path`` (errors name family.toml and the field)."""
    path = Path(path)
    where = str(path / FAMILY_FILE)
    try:
        meta = tomllib.loads((path / FAMILY_FILE).read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise TaskError(f"{where}: invalid TOML: {exc}") from exc
    unknown = set(meta) - _KEYS
    if unknown:
        raise TaskError(f"{where}: unknown field(s) {sorted(unknown)}; allowed: {sorted(_KEYS)}")
    name = meta.get("family")
    if name not in FAMILIES:
        raise TaskError(f"{where}: field 'family' must be one of {sorted(FAMILIES)}, got {name!r}")
    seed = meta.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TaskError(f"{where}: field 'seed' must be an integer, got {seed!r}")
    splits = meta.get("splits")
    if not isinstance(splits, dict) or not splits:
        raise TaskError(f"{where}: table [splits] must map split names to instance counts")
    for split, n in splits.items():
        if not re.fullmatch(_SPLIT, split):
            raise TaskError(f"{where} [splits]: split name {split!r} must match {_SPLIT}")
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 9999:
            raise TaskError(f"{where} [splits]: {split} must be a count in [0, 9999], got {n!r}")
    verify_path = path / "verify.py"
    if not verify_path.is_file():
        raise TaskError(f"{where}: the family's verifier {verify_path} is missing")
    vtext = verify_path.read_text(encoding="utf-8")
    verify = Script(name="verify.py", text=vtext, interpreter=interpreter_for("verify.py", vtext))
    make, tags, difficulty, most = FAMILIES[name]
    if len(splits) > most:
        raise TaskError(
            f"{where} [splits]: {name} keeps at most {most} splits apart (each has its own "
            f"instruction phrasings), got {len(splits)}"
        )
    numbers = _Numbers()  # no number of a split occurs in an earlier split
    tasks = []
    for split_no, (split, n) in enumerate(splits.items()):  # in file order: a later split
        rng = random.Random(f"{name}:{seed}:{split}")  # never moves an earlier one's instances
        numbers.next_split()
        for i in range(n):
            try:
                instruction, workspace, expected, expert = make(split_no, rng, numbers)
            except TaskError as exc:
                raise TaskError(f"{where} [splits]: {split} instance {i}: {exc}") from None
            tid = f"{name}-{split}-{i:04d}"
            solution = "".join(
                f"printf '%s' {json.dumps(s['arguments']['content'])} > {s['arguments']['path']}\n"
                for s in expert
                if s.get("tool") == "write_file"
            )
            tasks.append(
                Task(
                    id=tid,
                    instruction=instruction + "\n",
                    timeout_s=120.0,
                    tags=(*tags, split),
                    difficulty=difficulty,
                    workspace=workspace,
                    verify=verify,
                    hidden={"expected.json": json.dumps(expected)},
                    verify_timeout_s=30.0,
                    pass_threshold=1.0,
                    solution=Script(
                        name="solution.sh",
                        text="#!/usr/bin/env bash\nset -euo pipefail\n" + solution,
                        interpreter="bash",
                    ),
                    source="claw",
                    path=str(path),
                    meta={"family": name, "split": split, "index": i, "expert": expert},
                )
            )
    return tasks


def _claude_code_tool(name: str, a: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    if name == "read_file":
        return "Read", {"file_path": a["path"]}
    return "Write", {"file_path": a["path"], "content": a["content"]}


def _openclaw_tool(name: str, a: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    if name == "read_file":
        return "read", {"path": a["path"]}
    return "write", {"path": a["path"], "content": a["content"]}


#: harness -> the expert's tool calls (claw-agent's read_file / write_file) in that harness's
#: own tool names and arguments: Claude Code's Read / Write, OpenClaw's read / write. Harnesses
#: not listed here (claw-agent's) take claw-agent's names as they are.
TOOL_DIALECTS: dict[str, Callable[[str, dict[str, Any]], tuple[str, dict[str, Any]]]] = {
    "claude-code": _claude_code_tool,
    "openclaw-chat": _openclaw_tool,
    "openclaw-anthropic": _openclaw_tool,
    "openclaw-responses": _openclaw_tool,
}


def _tool_line(tool: str, arguments: dict[str, Any], harness: str | None) -> dict[str, Any]:
    """A tool step as a script line's tool call, in `harness`'s dialect (None: claw-agent's)."""
    dialect = TOOL_DIALECTS.get(harness) if harness else None
    if harness and dialect is None and not harness.startswith("claw-agent"):
        known = ", ".join(["claw-agent-*", *sorted(TOOL_DIALECTS)])
        raise TaskError(f"the expert cannot play through harness {harness!r}: known are {known}")
    name, args = dialect(tool, arguments) if dialect else (tool, arguments)
    return {"name": name, "arguments": args}


def expert_script(
    tasks: list[Task],
    *,
    slip: float = 0.0,
    seed: int = 0,
    samples: int = 1,
    harness: str | None = None,
) -> list[dict[str, Any]]:
    """claw-proxy scripted-engine lines that play each task's expert steps as model answers.

    One line per step, in order, each keyed to the task's sessions by the session tag
    ``task`` (``{"tags": {"task": id}, ...}``): a tool step becomes ``{"tool_calls": [{"name",
    "arguments"}]}`` (the proxy renders it in the policy's own tool-call format), a text step
    ``{"text": ...}``. Tasks without ``meta["expert"]`` raise TaskError naming them.

    ``slip`` makes a weaker teacher: on round(slip x len(tasks) x samples) of its rollouts,
    drawn from ``seed``, the expert skips its last tool call and goes straight to its final
    answer, as an agent does that stops one step early. Its rollouts then fail the verifier; a
    student imitating every rollout learns the habit. With ``samples`` = 1 a slip belongs to a
    task, so a student can also learn *which* tasks to give up on from their wording. With
    ``samples`` = S > 1 the teacher plays each task S times (claw-bench's session tag
    ``sample``, 0..S-1) and the slips are spread evenly over each task's rollouts: a task's
    rollouts slip floor(slip x S) or one more times, so the same prompt is seen both finished
    and abandoned, and the habit cannot be tied to the task (slip 0.5, S = 2: exactly one
    rollout of every task slips).

    ``harness`` names the harness the script is played through: its tool calls then use that
    harness's own tools (`TOOL_DIALECTS`: Claude Code's Read / Write, OpenClaw's read /
    write) and its lines are keyed to that harness's sessions too (session tag ``harness``), so
    the scripts of several harnesses concatenate into one; None or a claw-agent harness keeps
    claw-agent's read_file / write_file. Any other harness raises TaskError.
    """
    if not 0.0 <= slip <= 1.0:
        raise TaskError(f"expert slip must be a fraction in [0, 1], got {slip!r}")
    if samples < 1:
        raise TaskError(f"expert samples must be >= 1, got {samples!r}")
    _tool_line("read_file", {"path": ""}, harness)  # an unknown harness fails before any task
    ids = sorted(t.id for t in tasks)
    rng = random.Random(f"slip:{seed}")
    per_task = int(slip * samples)  # every task slips this often; some once more
    extra = round(slip * len(ids) * samples) - per_task * len(ids)
    more = set(rng.sample(ids, extra))
    slipped = {  # task id -> indices of its rollouts that slip
        i: set(rng.sample(range(samples), per_task + (i in more))) for i in ids
    }
    lines: list[dict[str, Any]] = []
    for t in tasks:
        steps = t.meta.get("expert")
        if not isinstance(steps, list) or not steps:
            raise TaskError(f"task {t.id}: no expert solution (only generated families have one)")
        for k in range(samples):
            played = steps
            if k in slipped[t.id]:
                tools = [i for i, step in enumerate(steps) if "tool" in step]
                if tools:
                    played = steps[: tools[-1]] + steps[tools[-1] + 1 :]
            tags = {"task": t.id} if samples == 1 else {"task": t.id, "sample": str(k)}
            if harness:  # one script may then hold the lines of several harnesses
                tags["harness"] = harness
            for step in played:
                line: dict[str, Any] = {"tags": dict(tags)}
                if "tool" in step:
                    line["tool_calls"] = [_tool_line(step["tool"], step["arguments"], harness)]
                else:
                    line["text"] = step["text"]
                lines.append(line)
    return lines
