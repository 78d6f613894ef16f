"""Shared helpers for the claw-rl tests: hand-built tree samples and random trees."""

from __future__ import annotations

import random

from claw_rl.records import Sample


def tree_sample(
    parent: list[int],
    trainable: list[int],
    *,
    seed: int = 0,
    sample_id: str = "s",
    vocab: int = 2000,
    returns: bool = False,
    weights: list[float] | None = None,
    versions: list[int] | None = None,
    logprobs: list[float] | None = None,
) -> dict:
    """A claw.sample/v1 dict for a given forest; random tokens and advantages (seeded)."""
    rng = random.Random(seed)
    n = len(parent)
    pos = []
    for p in parent:
        pos.append(0 if p < 0 else pos[p] + 1)
    adv = [round(rng.uniform(-1, 1), 3) if t else 0.0 for t in trainable]
    row = {
        "schema": "claw.sample/v1",
        "sample_id": sample_id,
        "algo": "ppo" if returns else "grpo",
        "input_ids": [rng.randrange(3, vocab) for _ in range(n)],
        "position_ids": pos,
        "parent": parent,
        "trainable": trainable,
        "logprobs": logprobs
        if logprobs is not None
        else [round(-rng.uniform(0, 8), 3) if t else 0.0 for t in trainable],
        "advantages": adv,
        "loss_weights": weights
        if weights is not None
        else [1.0 / max(sum(trainable), 1) * t for t in trainable],
    }
    if returns:
        row["returns"] = [round(rng.uniform(-1, 1), 3) if t else 0.0 for t in trainable]
    if versions is not None:
        row["policy_versions"] = versions
    Sample.from_dict(row)  # the helper only builds valid samples
    return row


def random_tree(n: int, seed: int, branch: float = 0.3) -> list[int]:
    """A random forest in topological order: mostly chains with occasional branches."""
    rng = random.Random(seed)
    parent = [-1]
    for i in range(1, n):
        if rng.random() < branch:
            parent.append(rng.randrange(-1, i) if rng.random() < 0.1 else rng.randrange(0, i))
        else:
            parent.append(i - 1)
    return parent
