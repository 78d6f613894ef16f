"""claw-rl: tree vs chain merge vs per call, on harness-shaped sessions with branches.

Sessions are Claude Code-shaped (bench/harness_shapes.py: sizes from the real requests in
../shared/fixtures/harness-requests/, main thread calibrated to ClawGym's 18.7K-token
trajectories) with a compaction (summary call off the end of the history + restart from the
system prompt and tools), a sub-agent and two side calls. Built into trees by claw-tree
(`build_samples`), then trained three ways with the same Learner.step (old-logprob pass + one
update, micro-batch 1, so no padding):

- tree: one tree-packed sample per session (every token once);
- chain merge: every root-to-leaf path as its own sequence (rLLM, Agent Lightning, ART);
- per call: every call's prompt + completion as its own sequence.

The token ratios are printed at full size for three harness profiles (no training); the timed
updates run at ``SCALE`` of every length (2 cores, tiny model). Goal vs chain merge on these
branching sessions: speedup >= 0.7 x token ratio.

Run: .venvs/workspace/bin/python -m pytest bench/test_rl_tree_vs_chain.py --benchmark-only -s
"""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("claw_tree")
claw_rl = pytest.importorskip("claw_rl")
import harness_shapes as shapes  # noqa: E402  (bench/ is on pytest's pythonpath)
from claw_tree import build_forest, build_samples  # noqa: E402
from rl_tree_shapes import chain_merge, per_call  # noqa: E402

SCALE = 1 / 8
SESSIONS = 2


def _tokens(samples: list[dict]) -> int:
    return sum(len(s["input_ids"]) for s in samples)


def _three_ways(harness: str, n: int, scale: float, seed: int = 0, vocab: int = 4000):
    """(trees, chains, calls) samples of ``n`` branching sessions of ``harness``."""
    try:
        prof = shapes.profile(harness)
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    calls, outcomes = [], []
    for k in range(n):  # different tasks: nothing shared between sessions
        c, o = shapes.group(f"task{k}", 1, prof, scale=scale, seed=seed + k, vocab=vocab)
        calls += c
        outcomes += o
    trees = build_samples(build_forest(calls), outcomes).samples
    chains = [c for t in trees for c in chain_merge(t)]
    per = [c for t in trees for c in per_call(t)]
    return trees, chains, per


def test_token_ratios_at_full_size(benchmark):
    """Trained tokens of chain merge and per call over the tree's, at full size, three harnesses
    (timed: building the trees with claw-tree)."""
    for harness in ("claude-code", "codex", "openclaw-chat"):
        trees, chains, per = (
            benchmark.pedantic(_three_ways, (harness, 2, 1.0), rounds=1, iterations=1)
            if harness == "claude-code"
            else _three_ways(harness, 2, 1.0)
        )
        t, c, p = _tokens(trees), _tokens(chains), _tokens(per)
        print(
            f"\n{harness:14} tree {t} | chain merge {c} ({c / t:.2f}x) | per call {p} ({p / t:.2f}x)"
        )
        assert t < c < p


# the default tiny model (width 128) spends most of its time in attention; "wide" (width 512,
# 4 layers) has a share of matmul work per token closer to a real model's at these lengths
MODELS = {
    "tiny": {},
    "wide": dict(
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
    ),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def setup(request, tmp_path_factory):
    from claw_rl.tiny import TinySpec

    model = claw_rl.init_tiny(
        tmp_path_factory.mktemp("m") / request.param, TinySpec(**MODELS[request.param])
    )
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    return model, *_three_ways("claude-code", SESSIONS, SCALE, vocab=vocab)


def _timed(learner, samples, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        learner.step(samples)
        times.append(time.perf_counter() - t0)
    return min(times)


def test_tree_vs_chain_merge_vs_per_call_update(benchmark, setup):
    """Wall time of one update: tree vs chain merge vs per call; speedups vs token ratios."""
    model, trees, chains, per = setup
    cfg = claw_rl.GRPOConfig(lr=1e-5, micro_batch_size=1)
    learners = {k: claw_rl.Learner.grpo(cfg, model) for k in ("tree", "chain", "call")}
    learners["tree"].step(trees)  # warm up every path
    learners["chain"].step(chains[:2])
    learners["call"].step(per[:2])
    chain_s = _timed(learners["chain"], chains, 2)
    call_s = _timed(learners["call"], per, 1)  # the slowest by far; once is enough
    tree_times: list[float] = []

    def tree_update():
        t0 = time.perf_counter()
        learners["tree"].step(trees)
        tree_times.append(time.perf_counter() - t0)

    benchmark.pedantic(tree_update, rounds=3, iterations=1)
    tree_s = min(tree_times)
    t, c, p = _tokens(trees), _tokens(chains), _tokens(per)
    info = {
        "tree_tokens": t,
        "chain_tokens": c,
        "per_call_tokens": p,
        "chain_token_ratio": c / t,
        "per_call_token_ratio": p / t,
        "tree_s": tree_s,
        "chain_s": chain_s,
        "per_call_s": call_s,
        "chain_speedup": chain_s / tree_s,
        "per_call_speedup": call_s / tree_s,
    }
    benchmark.extra_info.update(info)
    print(
        f"\n[{model.name}] {SESSIONS} Claude Code-shaped sessions at scale {SCALE:g}: tokens tree {t}, chain merge "
        f"{c} ({c / t:.2f}x), per call {p} ({p / t:.2f}x)\n"
        f"update wall: tree {tree_s:.2f}s, chain merge {chain_s:.2f}s (speedup "
        f"{chain_s / tree_s:.2f}, {chain_s / tree_s / (c / t):.2f} x token ratio; goal >= 0.7), "
        f"per call {call_s:.2f}s (speedup {call_s / tree_s:.2f}, "
        f"{call_s / tree_s / (p / t):.2f} x token ratio)"
    )
    info["chain_goal_met"] = chain_s / tree_s >= 0.7 * (c / t)
    benchmark.extra_info.update(info)
    assert t < c < p
    assert call_s > tree_s
