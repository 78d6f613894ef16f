"""claw-tree sample packing and tree GAE on the build benchmark's corpus.

Run: .venvs/claw-tree/bin/python -m pytest bench/test_tree_samples.py --benchmark-only

Reports packed tokens per second for GRPO (advantages broadcast + loss weights) and PPO (tree
GAE over the whole forest), next to the flat alternative's token count (one row per call).
"""

from __future__ import annotations

import numpy as np
import pytest
from claw_tree import build_forest, build_samples, gae_on_tree
from test_tree_build import (  # bench/ is on pytest's pythonpath (root pyproject.toml)
    corpus,
    flat_tokens,
)

N_SESSIONS = 8


@pytest.fixture(scope="module")
def forest_and_outcomes():
    calls = corpus(N_SESSIONS)
    forest = build_forest(calls)
    outcomes = [
        {
            "schema": "claw.outcome/v1",
            "session": t.name,
            "task": "t",
            "harness": "h",
            "group": "t",
            "reward": float(i % 2),
            "passed": bool(i % 2),
            "status": "ok",
        }
        for i, t in enumerate(forest.sessions)
    ]
    return forest, outcomes, flat_tokens(calls)


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_samples_throughput(benchmark, forest_and_outcomes, algo):
    """build_samples: tree tokens packed per second (one sample per session)."""
    forest, outcomes, flat = forest_and_outcomes
    batch = benchmark.pedantic(
        build_samples, args=(forest, outcomes), kwargs={"algo": algo}, rounds=3, iterations=1
    )
    packed = sum(len(s["input_ids"]) for s in batch.samples)
    benchmark.extra_info.update(
        packed_tokens=packed, flat_tokens=flat, mtok_per_s=packed / benchmark.stats.stats.min / 1e6
    )


def test_gae_on_tree_throughput(benchmark, forest_and_outcomes):
    """gae_on_tree alone over every node of the forest."""
    forest, _, _ = forest_and_outcomes
    rng = np.random.default_rng(0)
    V = rng.normal(size=forest.n_nodes)
    r = np.zeros(forest.n_nodes)
    r[[t.leaf for t in forest.trajectories]] = 1.0
    benchmark.pedantic(
        gae_on_tree, args=(forest.parent, forest.trainable, V, r), rounds=3, iterations=1
    )
    benchmark.extra_info.update(
        nodes=forest.n_nodes, mtok_per_s=forest.n_nodes / benchmark.stats.stats.min / 1e6
    )
