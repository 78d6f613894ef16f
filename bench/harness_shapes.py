"""Harness-shaped rollouts as claw.call/v1 records, sized from real harness requests.

Sizes come from the recorded first and second requests of each harness in
``../shared/fixtures/harness-requests/`` (next to the repository; HARNESSES.md says how they
were captured), at 4 characters per token (the usual BPE rule of thumb for English and JSON):

* ``prefix``: everything a harness sends before the model's first answer - system prompt, tool
  schemas and the first messages (Claude Code: a system-reminder, the instruction and an
  environment block). Claude Code 2.1: 7.5K + 31.6K + 10.8K characters, about 12.5K tokens.
* ``turn``: what one tool round adds to the next request (the model's tool call and the
  tool's result); the fixtures' task is trivial (an empty tool output), so this is the floor
  of a turn, and longer tool results are drawn above it.

A rollout's main thread is calibrated to ClawGym's teacher trajectories (18.7K tokens on
average, prefix included). Around it, the shapes real traffic has (HARNESSES.md, DESIGN.md):

* **compaction**: the harness asks for a summary of the whole history (a call that branches
  off the end of the main thread), then restarts from the system prompt and tools with the
  summary as the first user message (a branch at the end of the system prompt + tools);
* **sub-agent**: a new conversation with the sub-agent's own system prompt (no shared tokens
  with the main thread, but the same for every rollout of the harness) and a task description;
* **side calls**: small calls to a fast model (command-safety checks, titles) with their own
  short prompt.

Every call is trainable (the proxy maps every model name to the policy). ``scale`` shrinks
every length by the same factor so that the CPU benches stay small; token ratios depend
only weakly on it (segment lengths are rounded).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "harness-requests"
CHARS_PER_TOKEN = 4.0
CLAWGYM_TRAJECTORY_TOKENS = 18_700  # ClawGym teacher trajectories, average


@dataclass(frozen=True)
class Profile:
    """Token sizes of one harness, read from its two recorded requests."""

    harness: str
    system_tools: int  # system prompt + tool schemas
    first_messages: int  # the messages of the first request (instruction, reminders, env)
    turn: int  # what one tool round adds to the next request (the fixtures' floor)

    @property
    def prefix(self) -> int:
        return self.system_tools + self.first_messages


def _chars(value) -> int:
    return len(json.dumps(value)) if value else 0


def profile(harness: str = "claude-code") -> Profile:
    """The harness's sizes from ``<harness>-1.json`` and ``<harness>-2.json``."""
    bodies = []
    for k in (1, 2):
        path = FIXTURES / f"{harness}-{k}.json"
        if not path.exists():
            raise FileNotFoundError(f"{path}: harness request fixture missing")
        bodies.append(json.loads(path.read_text())["body"])

    def messages(b: dict):
        return b.get("messages") or b.get("input") or []

    first, second = bodies
    tok = lambda chars: max(1, round(chars / CHARS_PER_TOKEN))  # noqa: E731
    return Profile(
        harness=harness,
        system_tools=tok(
            _chars(first.get("system"))
            + _chars(first.get("instructions"))
            + _chars(first.get("tools"))
        ),
        first_messages=tok(_chars(messages(first))),
        turn=tok(_chars(messages(second)) - _chars(messages(first))),
    )


class _Ids:
    def __init__(self, rng: random.Random, vocab: int) -> None:
        self.rng, self.vocab = rng, vocab

    def __call__(self, n: int) -> list[int]:
        return [self.rng.randrange(3, self.vocab) for _ in range(max(1, n))]


def _call(session: str, seq: int, prompt: list[int], completion: list[int], model: str) -> dict:
    return {
        "schema": "claw.call/v1",
        "call_id": f"{session}-c{seq}",
        "session": session,
        "seq": seq,
        "api": "anthropic.messages",
        "model": model,
        "policy": {"name": "bench", "version": 0},
        "trainable": True,
        "prompt_ids": prompt,
        "completion_ids": completion,
        "completion_logprobs": [-1.0] * len(completion),
        "finish_reason": "tool_calls",
        "started_at": float(seq),
        "ended_at": float(seq) + 0.5,
        "tags": {},
    }


def _shared(prof: Profile, scale: float, vocab: int) -> dict[str, list[int]]:
    """What every rollout of the harness sends alike (the same ids for every call here)."""
    size = lambda n: max(1, round(n * scale))  # noqa: E731
    common = _Ids(random.Random(f"shared-{prof.harness}-{vocab}"), vocab)
    return {
        "system_tools": common(size(prof.system_tools)),
        "first_messages": common(size(prof.first_messages)),
        "subagent_system": common(size(0.4 * prof.system_tools)),
        "side_system": common(size(250)),
    }


def rollout(
    session: str,
    prof: Profile,
    *,
    seed: int,
    shared: dict[str, list[int]],
    scale: float = 1.0,
    compaction: bool = True,
    subagent: bool = True,
    side_calls: int = 2,
    trajectory_tokens: int = CLAWGYM_TRAJECTORY_TOKENS,
    vocab: int = 4000,
) -> list[dict]:
    """The calls of one rollout. ``shared`` holds the token ids every rollout of the group has
    in common (system + tools, first messages, sub-agent and side-call prompts); missing keys
    are filled (pass the same dict to every rollout of a group). ``trajectory_tokens``: length
    of the main thread, prefix included, before ``scale`` (at least the prefix + 2 turns)."""
    rng = random.Random(seed)
    ids = _Ids(rng, vocab)
    size = lambda n: max(1, round(n * scale))  # noqa: E731
    if "system_tools" not in shared:
        shared.update(_shared(prof, scale, vocab))
    main_budget = max(trajectory_tokens - prof.prefix, 2 * prof.turn)
    calls: list[dict] = []

    def thread(prompt: list[int], budget: float, model: str) -> list[int]:
        """Tool rounds until ``budget`` tokens: a completion (tool call, some text), then the
        tool's result, each at least the fixtures' floor."""
        spent = 0.0
        while spent < budget:
            completion = ids(size(rng.randint(max(prof.turn // 3, 20), 250)))
            calls.append(_call(session, len(calls), prompt, completion, model))
            result = ids(size(rng.randint(prof.turn, 800)))
            prompt = prompt + completion + result
            spent += (len(completion) + len(result)) / scale
        return prompt

    start = shared["system_tools"] + shared["first_messages"]
    if compaction:
        history = thread(start, 0.7 * main_budget, "main")
        summary = ids(size(800))
        calls.append(_call(session, len(calls), history + ids(size(200)), summary, "main"))
        restart = shared["system_tools"] + ids(size(200)) + summary  # summary as the first message
        thread(restart, 0.3 * main_budget, "main")
    else:
        thread(start, main_budget, "main")
    if subagent:
        thread(shared["subagent_system"] + ids(size(150)), 0.3 * main_budget, "haiku")
    for _ in range(side_calls):
        prompt = shared["side_system"] + ids(size(rng.randint(50, 300)))
        calls.append(_call(session, len(calls), prompt, ids(size(20)), "haiku"))
    return calls


def group(
    task: str,
    n: int,
    prof: Profile,
    *,
    scale: float = 1.0,
    seed: int = 0,
    shared: dict[str, list[int]] | None = None,
    **shape,
) -> tuple[list[dict], list[dict]]:
    """(calls, outcomes) of ``n`` rollouts of one task (one GRPO group), rewards 0/1;
    ``shared`` as for :func:`rollout` (default: the harness's, first messages included)."""
    shared = {} if shared is None else shared
    calls, outcomes = [], []
    for r in range(n):
        name = f"{task}-r{r}"
        calls += rollout(name, prof, seed=seed * 1000 + r, shared=shared, scale=scale, **shape)
        outcomes.append(
            {
                "schema": "claw.outcome/v1",
                "session": name,
                "task": task,
                "harness": prof.harness,
                "group": task,
                "reward": float(r % 2),
                "passed": bool(r % 2),
                "status": "ok",
            }
        )
    return calls, outcomes


def batch(
    tasks: int, n: int, prof: Profile, *, scale: float = 1.0, vocab: int = 4000, **shape
) -> tuple[list[dict], list[dict]]:
    """(calls, outcomes) of one optimizer batch: ``tasks`` groups of ``n`` rollouts of one
    harness. The system prompt, tools, sub-agent and side-call prompts are the harness's, the
    same in every group; the first messages (instruction, reminders, environment) are each
    task's own, so only the system prompt and tools are shared across groups."""
    base = _shared(prof, scale, vocab)
    calls, outcomes = [], []
    for t in range(tasks):
        own = _Ids(random.Random(f"task-{t}-{vocab}"), vocab)(len(base["first_messages"]))
        shared = {**base, "first_messages": own}
        c, o = group(f"task{t}", n, prof, scale=scale, seed=t, shared=shared, vocab=vocab, **shape)
        calls += c
        outcomes += o
    return calls, outcomes
