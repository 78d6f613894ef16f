"""Session-shaped trees for the claw-rl benches, and the same sessions as chain merge and per call.

A session: a system prompt (+ tools), a main agent thread of alternating completions (trained)
and tool results, sub-agent threads and compaction restarts that branch from the system prompt,
and side calls that branch from an earlier thread's history. Every call's completion follows a
context segment (its prompt's own tail), as in real harness traffic.

- ``session_tree(n)``: the prefix tree, exactly n tokens, as a claw.sample/v1 dict.
- ``chain_merge(tree)``: each root-to-leaf path as one chain (rLLM, Agent Lightning, ART).
- ``per_call(tree)``: each call (prompt + completion) as one chain (a per-call trainer).

Loss weights split each tree token's weight evenly over the chains that contain it, so the
three describe the same objective. Plain Python (no torch): bench/gpu_check.py imports it too.
"""

from __future__ import annotations

import random


def session_tree(n_tokens: int, seed: int = 0, vocab: int = 2000) -> dict:
    """A claw.sample/v1 dict of exactly ``n_tokens`` tokens shaped like one harness session."""
    rng = random.Random(seed)
    ids: list[int] = []
    parent: list[int] = []
    trainable: list[int] = []

    def segment(start: int, n: int, train: int) -> int:
        for _ in range(n):
            ids.append(rng.randrange(3, vocab))
            parent.append(start)
            trainable.append(train)
            start = len(ids) - 1
        return start

    system_end = segment(-1, min(2000, n_tokens // 8), 0)  # system prompt + tools
    threads: list[list[int]] = []  # context nodes of each thread: where side calls branch off
    while len(ids) < n_tokens:
        if not threads or rng.random() < 0.45:  # main thread, sub-agent or compaction restart
            node, length = system_end, _length(rng, n_tokens, 2000, 8000, 4)
        else:  # side call / edited history: branch from an earlier thread's context
            t = rng.choice(threads)
            node, length = t[rng.randrange(len(t))], _length(rng, n_tokens, 200, 1500, 8)
        context: list[int] = []
        for turn in range(10**9):
            left = min(n_tokens - len(ids), length)
            if left <= 0:
                break
            is_context = turn % 2 == 0  # the call's own prompt tail, then its completion
            n = min(left, rng.randint(50, 400) if is_context else rng.randint(20, 200))
            start = len(ids)
            node = segment(node, n, 0 if is_context else 1)
            length -= n
            if is_context:
                context += range(start, len(ids))
        threads.append(context)
    return _sample(f"tree{n_tokens}", ids, parent, trainable)


def _length(rng: random.Random, n: int, lo: int, hi: int, part: int) -> int:
    """A thread length in [lo, hi], scaled down for small trees (at most n / part)."""
    lo = max(1, min(lo, n // 16))
    return rng.randint(lo, max(lo, min(hi, n // part)))


def _sample(sid: str, ids: list[int], parent: list[int], trainable: list[int], w=None) -> dict:
    pos: list[int] = []
    for p in parent:
        pos.append(0 if p < 0 else pos[p] + 1)
    if w is None:
        n_train = max(sum(trainable), 1)
        w = [t / n_train for t in trainable]
    return {
        "schema": "claw.sample/v1",
        "sample_id": sid,
        "algo": "grpo",
        "input_ids": ids,
        "position_ids": pos,
        "parent": parent,
        "trainable": trainable,
        "logprobs": [-1.0 * t for t in trainable],
        "advantages": [0.5 * t for t in trainable],
        "loss_weights": w,
    }


def _path(parent: list[int], i: int) -> list[int]:
    out = []
    while i >= 0:
        out.append(i)
        i = parent[i]
    return out[::-1]


def _chains(tree: dict, ends: list[int], kind: str, own: bool = False) -> list[dict]:
    """One chain sample per end node: the root-to-end path, the tree's weights split evenly
    over the chains through each token (``kind``: the chains' sample id prefix). ``own``: only
    the path's final run of trained tokens trains (a call's completion; its prompt is context)."""
    parent, trainable = tree["parent"], tree["trainable"]
    paths = [_path(parent, e) for e in ends]
    out = []
    through = [0] * len(parent)
    for p in paths:
        for j in p:
            through[j] += 1
    for k, p in enumerate(paths):
        tr = [trainable[j] for j in p]
        if own:
            start = len(tr)
            while start > 0 and tr[start - 1]:
                start -= 1
            tr = [0] * start + tr[start:]
        share = [1 if own else through[j] for j in p]
        w = [tree["loss_weights"][j] / share[t] if tr[t] else 0.0 for t, j in enumerate(p)]
        ids = [tree["input_ids"][j] for j in p]
        out.append(
            _sample(f"{tree['sample_id']}-{kind}{k}", ids, list(range(-1, len(p) - 1)), tr, w)
        )
    return out


def chain_merge(tree: dict) -> list[dict]:
    """Each root-to-leaf path of ``tree`` that trains some token as one chain sample."""
    has_child = set(tree["parent"])
    leaves = [i for i in range(len(tree["parent"])) if i not in has_child]
    return [c for c in _chains(tree, leaves, "path") if any(c["trainable"])]


def per_call(tree: dict) -> list[dict]:
    """Each call of ``tree`` (its prompt path + its completion) as one chain sample. A call ends
    at a trained token none of whose children is trained."""
    parent, trainable = tree["parent"], tree["trainable"]
    continues = {p for i, p in enumerate(parent) if p >= 0 and trainable[i]}
    ends = [i for i in range(len(parent)) if trainable[i] and i not in continues]
    return _chains(tree, ends, "call", own=True)
