"""Copied-number swaps: SFT samples in which a number the teacher copied is a fresh one.

A teacher that reads a number from a tool result and writes it back (a file's content, an
answer) shows the student the copy only on the numbers its tasks happen to hold. A small student
fine-tuned on a few hundred such sessions can learn each task's answer by heart instead of the
copy: it then writes a remembered number on a task it has not seen (measured through Claude
Code: 0 of 144 rollouts passed on unseen tasks, 29 of 112 on the taught ones). Swapping the
number for a fresh one wherever it occurs in the sample (tool result, tool call, later prompts)
removes every other way to predict it, and costs no extra teacher rollout: each epoch can see
each session with new numbers.

A *number* is a maximal run of digit tokens along one root-to-leaf path (the tokenizer must give
every digit its own token, as Qwen's does; `digit_ids` lists those ten ids). A number (of at least ``min_digits`` digits) is
*copied* when the same digits occur both as a run the policy generated (all of it trainable)
and as a run of context (none of it trainable). Every run of a copied number, wherever it is in
the sample, is replaced by one fresh number of the same length (no leading zero where the old
one had none), drawn outside ``avoid`` and distinct from every number already in the sample,
so the sample stays consistent: the value a tool returned is the value later written. Runs
that branch inside the tree (two continuations from one digit) are left as they are: no single
replacement is consistent for them.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from claw_tree.errors import ClawError

__all__ = ["swap_copied_numbers"]


def _runs(parent: np.ndarray, digit: np.ndarray) -> list[list[int]]:
    """Maximal digit runs as index lists along the tree; a run that branches is left out."""
    n = len(parent)
    child: dict[int, list[int]] = {}
    starts = []
    for i in range(n):
        if not digit[i]:
            continue
        p = int(parent[i])
        if p >= 0 and digit[p]:
            child.setdefault(p, []).append(i)
        else:
            starts.append(i)
    runs: list[list[int]] = []
    for s in starts:
        run, cur = [s], s
        while cur in child:
            if len(child[cur]) > 1:
                run = []
                break
            cur = child[cur][0]
            run.append(cur)
        if run:
            runs.append(run)
    return runs


def _fresh(length: int, leading_zero: bool, taken: set[str], rng: random.Random) -> str | None:
    """A digit string of `length` outside `taken`; None when every one is taken."""
    first = "0123456789" if leading_zero else "123456789"
    for _ in range(64):
        s = rng.choice(first) + "".join(rng.choice("0123456789") for _ in range(length - 1))
        if s not in taken:
            return s
    if length > 6:  # 64 misses among >= 9e6 strings: `taken` must hold most of them
        return None
    low = 0 if leading_zero else 10 ** (length - 1)
    free = [s for s in (str(k).zfill(length) for k in range(low, 10**length)) if s not in taken]
    return rng.choice(free) if free else None


def swap_copied_numbers(
    sample: dict[str, Any],
    digit_ids: Sequence[int],
    rng: random.Random,
    *,
    avoid: Collection[str] = (),
    min_digits: int = 2,
) -> tuple[dict[str, Any], int]:
    """``sample`` (a `claw.sample/v1` dict) with every copied number replaced by a fresh one.

    ``digit_ids``: the token ids of "0".."9", in that order. ``avoid``: digit strings never to
    draw (e.g. every number of a held-out split, so augmented training data shares none).
    ``min_digits``: shorter numbers are left alone (a single digit is more often a line number
    or a count than a copied value).
    Returns the new sample (a copy; ``input_ids`` changed, ``tags.numbers_swapped`` set to the
    count) and that count. ``logprobs`` are left as recorded: they describe the teacher's own
    tokens, which SFT uses only as a diagnostic.
    """
    if len(digit_ids) != 10 or len(set(digit_ids)) != 10:
        raise ClawError(f"digit_ids must be the 10 distinct ids of '0'..'9', got {list(digit_ids)}")
    for key in ("input_ids", "parent", "trainable"):
        if key not in sample:
            raise ClawError(f"sample {sample.get('sample_id')!r} has no {key!r}")
    ids = np.asarray(sample["input_ids"], dtype=np.int64)
    parent = np.asarray(sample["parent"], dtype=np.int64)
    trainable = np.asarray(sample["trainable"], dtype=bool)
    if not len(ids) == len(parent) == len(trainable):
        raise ClawError(
            f"sample {sample.get('sample_id')!r}: input_ids, parent and trainable differ in length "
            f"({len(ids)}, {len(parent)}, {len(trainable)})"
        )
    table = np.asarray(digit_ids, dtype=np.int64)
    digit = np.isin(ids, table)
    value = {int(t): str(k) for k, t in enumerate(digit_ids)}
    runs = _runs(parent, digit)
    text = ["".join(value[int(ids[i])] for i in run) for run in runs]
    made = {s for s, run in zip(text, runs, strict=True) if trainable[run].all()}
    seen = {s for s, run in zip(text, runs, strict=True) if not trainable[run].any()}
    copied = sorted(s for s in made & seen if len(s) >= min_digits)
    taken = set(text) | set(avoid)
    new_for: dict[str, str] = {}
    for s in copied:
        fresh = _fresh(len(s), s.startswith("0"), taken, rng)
        if fresh is not None:
            new_for[s] = fresh
            taken.add(fresh)
    out_ids = ids.copy()
    for s, run in zip(text, runs, strict=True):
        if s in new_for:
            out_ids[run] = table[[int(c) for c in new_for[s]]]
    out = dict(sample)
    out["input_ids"] = out_ids.tolist()
    out["tags"] = {**sample.get("tags", {}), "numbers_swapped": len(new_for)}
    return out, len(new_for)
