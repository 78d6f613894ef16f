"""The copy stage: teach a small policy to copy a number from a tool result into its tool call.

toy-steps is passed only by writing the number the named file holds. A tiny student fine-tuned
on a few hundred teacher sessions learns the tool formats and the file names long before it
learns the copy, and the copy, when it comes, comes as a sudden transition after a long plateau
(as induction does). Through Claude Code and OpenClaw, whose prompts are long and full of other
numbers (dates, versions, Claude Code's line-numbered ``Read``), the plain SFT of the quickstart
ends on that plateau. This stage runs before it:

* its data are the teacher's passed sessions (claw-tree ``pack="session"`` SFT samples) that
  copy a number; every step draws ``batch`` of them and swaps each copied number for fresh
  digits (:func:`claw_tree.swap_copied_numbers`, never a number of ``avoid``), so the only
  way to predict the number is to copy it;
* a curriculum: stage k trains on the first k harnesses' sessions (cumulative, so an earlier
  harness is not forgotten), for its own number of steps, at a constant learning rate;
* :func:`probe` measures the copy: on the teacher's write calls with a fresh number swapped in,
  the share whose number the policy's greedy continuation writes exactly.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Collection, Sequence

import claw_tree
import torch

__all__ = ["copy_sessions", "parse_curriculum", "probe", "probe_calls", "train"]


def parse_curriculum(spec: str, harnesses: Sequence[str]) -> list[tuple[str, int]]:
    """``"claw-agent-steps:1500,openclaw-chat:1000"`` -> [(harness, steps)], each harness one of
    `harnesses`, once, with steps >= 1."""
    out: list[tuple[str, int]] = []
    for part in spec.split(","):
        name, sep, steps = part.strip().rpartition(":")
        if not sep or not name or not steps.isdigit() or int(steps) < 1:
            raise ValueError(f"--copy-curriculum: {part!r} is not HARNESS:STEPS (STEPS >= 1)")
        if name not in harnesses:
            raise ValueError(
                f"--copy-curriculum: {name!r} is not a run harness ({list(harnesses)})"
            )
        if name in (h for h, _ in out):
            raise ValueError(f"--copy-curriculum: {name!r} is named twice")
        out.append((name, int(steps)))
    return out


def _number_runs(ids: Sequence[int], digits: set[int], lo: int, hi: int) -> list[tuple[int, int]]:
    """(start, end) of each maximal digit run inside ids[lo:hi]."""
    runs, i = [], lo
    while i < hi:
        if ids[i] in digits:
            j = i
            while j < hi and ids[j] in digits:
                j += 1
            runs.append((i, j))
            i = j
        else:
            i += 1
    return runs


def probe_calls(calls: Sequence, digit_ids: Sequence[int], min_digits: int = 2) -> list[dict]:
    """The calls (claw.call/v1 records) whose completion writes a number their prompt holds, as
    linear claw.sample/v1-shaped dicts (prompt context, completion trainable) for :func:`probe`."""
    digits = set(digit_ids)
    out = []
    for c in calls:
        ids = [*c.prompt_ids, *c.completion_ids]
        n = len(c.prompt_ids)
        seen = {tuple(ids[a:b]) for a, b in _number_runs(ids, digits, 0, n)}
        made = [r for r in _number_runs(ids, digits, n, len(ids)) if r[1] - r[0] >= min_digits]
        if any(tuple(ids[a:b]) in seen for a, b in made):
            out.append(
                {
                    "sample_id": c.call_id, "input_ids": ids, "parent": list(range(-1, len(ids) - 1)),
                    "trainable": [False] * n + [True] * (len(ids) - n),
                    "tags": {"harness": c.tags.get("harness", "")},
                }
            )  # fmt: skip
    return out


@torch.no_grad()
def probe(
    model: torch.nn.Module,
    calls: Sequence[dict],
    digit_ids: Sequence[int],
    rng: random.Random,
    *,
    avoid: Collection[str] = (),
) -> dict[str, list[int]]:
    """Per harness [copied, probed]: each call (from :func:`probe_calls`) with its copied number
    swapped for fresh digits, the policy fed the prompt and the completion up to the number; it
    copies when its greedy continuation is the number's digits exactly. The rest of the
    completion is teacher-forced, so this measures the copy alone."""
    digits = set(digit_ids)
    was = model.training
    model.eval()
    out: dict[str, list[int]] = {}
    for call in calls:
        swapped, n = claw_tree.swap_copied_numbers(call, digit_ids, rng, avoid=avoid)
        if not n:
            continue
        ids = swapped["input_ids"]
        cut = call["trainable"].index(True)
        seen = {tuple(ids[a:b]) for a, b in _number_runs(ids, digits, 0, cut)}
        a, b = next(
            (a, b) for a, b in _number_runs(ids, digits, cut, len(ids)) if tuple(ids[a:b]) in seen
        )
        logits = model(torch.tensor([ids[: b - 1]])).logits[0]
        ok = logits[a - 1 : b - 1].argmax(-1).tolist() == ids[a:b]
        row = out.setdefault(call["tags"]["harness"], [0, 0])
        row[0] += int(ok)
        row[1] += 1
    model.train(was)
    return out


def copy_sessions(samples: Sequence[dict], digit_ids: Sequence[int]) -> dict[str, list[dict]]:
    """Per harness, the one-session SFT samples that copy a number (swappable ones)."""
    out: dict[str, list[dict]] = {}
    rng = random.Random(0)
    for s in samples:
        (harness,) = s["tags"]["harnesses"]
        if claw_tree.swap_copied_numbers(s, digit_ids, rng)[1]:
            out.setdefault(harness, []).append(s)
    return out


def train(
    learner,
    sessions: dict[str, list[dict]],
    curriculum: Sequence[tuple[str, int]],
    *,
    batch: int,
    digit_ids: Sequence[int],
    rng: random.Random,
    avoid: Collection[str] = (),
    every: int = 0,
    on_probe: Callable[[int, str], dict] | None = None,
) -> list[dict]:
    """Run the curriculum on `learner` (an SFT learner: one optimizer step per call of
    ``learner.step``): stage k draws `batch` sessions a step from the first k harnesses, each
    with fresh numbers. Every `every` steps (and at each stage's end) ``on_probe(step, stage)``
    adds its result to the log row. Returns the log rows (step, stage, loss, seconds, ...)."""
    pool: list[dict] = []
    log, step, t0 = [], 0, time.monotonic()
    for harness, steps in curriculum:
        if not sessions.get(harness):
            raise ValueError(f"copy stage: the teacher left no {harness} session that copies")
        pool += sessions[harness]
        for k in range(steps):
            picked = [rng.choice(pool) for _ in range(batch)]
            loss = learner.step(
                [claw_tree.swap_copied_numbers(s, digit_ids, rng, avoid=avoid)[0] for s in picked]
            )["loss"]
            step += 1
            if on_probe and ((every and step % every == 0) or k == steps - 1):
                row = {"step": step, "stage": harness, "loss": loss}
                row["seconds"] = round(time.monotonic() - t0, 1)
                row.update(on_probe(step, harness))
                log.append(row)
    return log
