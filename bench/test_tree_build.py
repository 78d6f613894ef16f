"""claw-tree build throughput on sessions shaped like real harness runs.

Run: .venvs/claw-tree/bin/python -m pytest bench/test_tree_build.py --benchmark-only -s

Corpus: 30-turn sessions whose context grows from 20k to 60k tokens (each turn's prompt is the
previous prompt + completion + a tool result), with a compaction at turn 20 (history cut to a
summary: a branch inside context), one re-rendered assistant turn (a branch inside earlier
output) and a side call under another model name (a new root). Throughput is flat tokens
(sum of prompt + completion over calls) per second on one core, next to a plain per-token
dict trie in the same run, at three corpus sizes to show linear growth.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from claw_tree import Call, build_forest, forest_stats

TURNS = 30
SIZES = (4, 8, 16)  # sessions


def _session(rng: np.random.Generator, name: str) -> list[Call]:
    vocab = 150_000
    calls = []
    history = rng.integers(0, vocab, 20_000)  # system prompt, tools, task
    step = (60_000 - 20_000) // TURNS

    def add(seq, prompt, completion, model="policy"):
        calls.append(
            Call(
                call_id=f"{name}-{seq}",
                session=name,
                seq=seq,
                model=model,
                policy_name="p",
                policy_version=0,
                trainable=True,
                prompt_ids=prompt,
                completion_ids=completion,
                completion_logprobs=-rng.random(len(completion)),
                finish_reason="stop",
                tags={},
            )
        )

    for turn in range(TURNS):
        completion = rng.integers(0, vocab, 200)
        add(turn, history, completion)
        tool = rng.integers(0, vocab, step - 200)
        out = completion.copy()
        if turn == 10:
            out[50] = (out[50] + 1) % vocab  # the harness re-rendered this turn differently
        history = np.concatenate((history, out, tool))
        if turn == 20:
            history = np.concatenate(
                (history[:20_300], rng.integers(0, vocab, 2_000), history[-step:])
            )  # cut inside a tool result
    add(TURNS, rng.integers(0, vocab, 3_000), rng.integers(0, vocab, 20), model="small")
    return calls


def corpus(n_sessions: int, seed: int = 0) -> list[Call]:
    rng = np.random.default_rng(seed)
    return [c for s in range(n_sessions) for c in _session(rng, f"s{s}")]


def flat_tokens(calls) -> int:
    return sum(len(c.prompt_ids) + len(c.completion_ids) for c in calls)


def naive_trie(calls: list[Call]) -> int:
    """Baseline: a per-token dict trie in pure Python (one dict per node); returns node count."""
    nodes = 0
    for session in sorted({c.session for c in calls}):
        root: dict = {}
        for c in sorted((c for c in calls if c.session == session), key=lambda c: c.seq):
            node = root
            for tok in c.prompt_ids.tolist() + c.completion_ids.tolist():
                child = node.get(tok)
                if child is None:
                    child = node[tok] = {}
                    nodes += 1
                node = child
    return nodes


@pytest.fixture(scope="module", params=SIZES, ids=lambda n: f"{n}sessions")
def sized(request):
    calls = corpus(request.param)
    return request.param, calls, flat_tokens(calls)


def test_build_throughput(benchmark, sized):
    """build_forest over the corpus (numpy path): flat tokens per second."""
    n, calls, flat = sized
    forest = benchmark.pedantic(build_forest, args=(calls,), rounds=5, iterations=1)
    stats = forest_stats(forest)
    assert stats["branch_reasons"]["root"] == n and stats["branch_reasons"]["context"] == n
    assert stats["branch_reasons"]["output"] == n
    benchmark.extra_info.update(
        flat_tokens=flat,
        tree_tokens=forest.n_nodes,
        mtok_per_s=flat / benchmark.stats.stats.min / 1e6,
    )


def test_naive_trie_baseline(benchmark):
    """The pure-Python dict trie on the smallest corpus, for the ratio."""
    calls = corpus(SIZES[0])
    nodes = benchmark.pedantic(naive_trie, args=(calls,), rounds=1, iterations=1)
    assert nodes == build_forest(calls).n_nodes
    benchmark.extra_info.update(
        flat_tokens=flat_tokens(calls),
        mtok_per_s=flat_tokens(calls) / benchmark.stats.stats.min / 1e6,
    )


def test_build_from_dicts_with_validation(benchmark):
    """End to end from claw.call/v1 dicts (as parsed from JSONL): validation + build."""
    calls = corpus(SIZES[0])
    rows = [
        {
            "schema": "claw.call/v1",
            "call_id": c.call_id,
            "session": c.session,
            "seq": c.seq,
            "api": "openai.chat",
            "model": c.model,
            "policy": {"name": "p", "version": 0},
            "prompt_ids": c.prompt_ids.tolist(),
            "completion_ids": c.completion_ids.tolist(),
            "completion_logprobs": c.completion_logprobs.tolist(),
            "finish_reason": "stop",
            "started_at": 0.0,
            "ended_at": 0.0,
            "tags": {},
        }
        for c in calls
    ]
    benchmark.pedantic(build_forest, args=(rows,), rounds=2, iterations=1)
    benchmark.extra_info.update(
        flat_tokens=flat_tokens(calls),
        mtok_per_s=flat_tokens(calls) / benchmark.stats.stats.min / 1e6,
    )


def test_scaling_report():
    """Side by side in one run: Mtok/s at three sizes and against the naive trie (printed with -s)."""
    rows = []
    for n in SIZES:
        calls = corpus(n)
        best = min(_time(build_forest, calls) for _ in range(3))
        rows.append((n, flat_tokens(calls), best))
    small = corpus(SIZES[0])
    naive = _time(naive_trie, small)
    print("\nsessions  flat_tokens  build_s  Mtok/s")
    for n, flat, t in rows:
        print(f"{n:8d}  {flat:11d}  {t:7.3f}  {flat / t / 1e6:6.1f}")
    print(
        f"naive dict trie ({SIZES[0]} sessions): {naive:.2f} s, {flat_tokens(small) / naive / 1e6:.2f} Mtok/s, "
        f"build_forest is {naive / rows[0][2]:.0f}x faster"
    )
    per_token = [t / flat for _, flat, t in rows]
    assert max(per_token) < 2 * min(per_token), "build time should grow linearly with corpus size"


def _time(fn, arg) -> float:
    t = time.perf_counter()
    fn(arg)
    return time.perf_counter() - t
