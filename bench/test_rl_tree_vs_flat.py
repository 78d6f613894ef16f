"""claw-rl: one learner update on tree-packed sessions vs the same calls as flat sequences.

Sessions are shaped like harness traffic: a system prompt + tool definitions, then 20-40 calls
whose prompts grow by the previous completion and a tool result (prefix reuse), and one
session with a branch (a compacted history restarting from the system prompt). The tree
trains each token once; the flat baseline (a per-call trainer) forwards each call's
prompt + completion. Both run the same Learner.step (old-logprob pass + one update) on
the same tiny model, micro-batch 1 (no padding).

Run: .venvs/claw-rl/bin/python -m pytest bench/test_rl_tree_vs_flat.py --benchmark-only -s
"""

from __future__ import annotations

import random
import time

import pytest
from claw_rl import GRPOConfig, Learner, chain_sample, init_tiny

SESSIONS = 2


def _session(rng: random.Random, vocab: int, sid: str, branch: bool):
    """(tree sample dict, flat call samples) for one session of 20-40 calls."""
    tok = lambda n: [rng.randrange(3, vocab) for _ in range(n)]  # noqa: E731
    system = tok(300)
    calls = []  # (prompt, completion)
    prompt = system + tok(40)
    for _ in range(rng.randint(20, 40)):
        completion = tok(rng.randint(15, 60))
        calls.append((prompt, completion))
        prompt = prompt + completion + tok(rng.randint(20, 80))  # + tool result
    if branch:  # compaction: history replaced by a summary, continuing from the system prompt
        prompt = system + tok(120)
        for _ in range(5):
            completion = tok(rng.randint(15, 60))
            calls.append((prompt, completion))
            prompt = prompt + completion + tok(rng.randint(20, 80))
    # merge calls into a prefix tree (trie over token ids)
    ids, parent, trainable, children = [], [], [], {}
    for prompt, completion in calls:
        node = -1
        for j, t in enumerate(prompt + completion):
            key = (node, t)
            if key not in children:
                ids.append(t)
                parent.append(node)
                trainable.append(int(j >= len(prompt)))
                children[key] = len(ids) - 1
            node = children[key]
            if j >= len(prompt):
                trainable[node] = 1
    pos = []
    for p in parent:
        pos.append(0 if p < 0 else pos[p] + 1)
    n_comp = sum(trainable)
    tree = {
        "schema": "claw.sample/v1",
        "sample_id": sid,
        "algo": "grpo",
        "input_ids": ids,
        "position_ids": pos,
        "parent": parent,
        "trainable": trainable,
        "logprobs": [-1.0 * t for t in trainable],
        "advantages": [0.5 * t for t in trainable],
        "loss_weights": [t / n_comp for t in trainable],
    }
    flat = [
        chain_sample(
            f"{sid}-{k}", p, c, [-1.0] * len(c), advantages=(0.0,) * len(p) + (0.5,) * len(c)
        )
        for k, (p, c) in enumerate(calls)
    ]
    return tree, flat


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    model = init_tiny(tmp_path_factory.mktemp("m") / "tiny")
    rng = random.Random(0)
    trees, flats = [], []
    for s in range(SESSIONS):
        t, f = _session(rng, 2000, f"s{s}", branch=(s == 0))
        trees.append(t)
        flats += f
    return model, trees, flats


def test_tree_vs_flat_update(benchmark, setup):
    """Wall time of one update on tree-packed vs flat data; speedup vs token ratio."""
    model, trees, flats = setup
    cfg = GRPOConfig(lr=1e-5, micro_batch_size=1)
    tree_learner, flat_learner = Learner.grpo(cfg, model), Learner.grpo(cfg, model)
    tree_learner.step(trees)  # warm up both paths
    flat_learner.step(flats[:2])

    def flat_update():
        t0 = time.perf_counter()
        flat_learner.step(flats)
        return time.perf_counter() - t0

    flat_times = [flat_update()]  # ~1 min on 2 cores; once is enough next to a 20x gap
    tree_times = []

    def tree_update():
        t0 = time.perf_counter()
        tree_learner.step(trees)
        tree_times.append(time.perf_counter() - t0)

    benchmark.pedantic(tree_update, rounds=3, iterations=1)
    tree_tokens = sum(len(t["input_ids"]) for t in trees)
    flat_tokens = sum(len(f) for f in flats)
    token_ratio = flat_tokens / tree_tokens
    speedup = min(flat_times) / min(tree_times)
    benchmark.extra_info.update(
        tree_tokens=tree_tokens,
        flat_tokens=flat_tokens,
        token_ratio=token_ratio,
        tree_s=min(tree_times),
        flat_s=min(flat_times),
        speedup=speedup,
        speedup_over_token_ratio=speedup / token_ratio,
    )
    print(
        f"\ncalls {len(flats)} | tokens tree {tree_tokens} flat {flat_tokens} (ratio {token_ratio:.2f}) | "
        f"wall tree {min(tree_times):.2f}s flat {min(flat_times):.2f}s (speedup {speedup:.2f}) | "
        f"speedup / token ratio {speedup / token_ratio:.2f} (target >= 0.7)"
    )
    assert speedup >= 0.7 * token_ratio
