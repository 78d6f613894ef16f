"""claw-bench: Pass@k and bootstrap speed, each against a slow reference in the same run.

Run: .venvs/claw-bench/bin/python -m pytest bench/test_bench_passk.py --benchmark-only
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from claw_bench import pass_at_k, pass_at_k_brute, report
from claw_bench.passk import bootstrap_mean_ci

N, K = 16, 8
RESULTS = [random.Random(0).random() < 0.3 for _ in range(N)]


@pytest.mark.benchmark(group="pass@k n=16 k=8")
def test_pass_at_k_closed_form(benchmark):
    """The unbiased estimator in closed form (what reports use)."""
    v = benchmark(pass_at_k, N, sum(RESULTS), K)
    assert abs(v - pass_at_k_brute(RESULTS, K)) < 1e-12


@pytest.mark.benchmark(group="pass@k n=16 k=8")
def test_pass_at_k_brute_force_baseline(benchmark):
    """Baseline: enumerate all C(16, 8) = 12,870 subsets."""
    benchmark(pass_at_k_brute, RESULTS, K)


def _loop_bootstrap(values, rounds=2000, seed=0):
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(values) for _ in values) / len(values) for _ in range(rounds))
    return means[int(0.025 * rounds)], means[int(0.975 * rounds) - 1]


VALUES = np.random.default_rng(0).random(200)


@pytest.mark.benchmark(group="bootstrap CI, 200 tasks, 2000 rounds")
def test_bootstrap_vectorised(benchmark):
    """numpy percentile bootstrap (what reports use)."""
    benchmark(bootstrap_mean_ci, VALUES)


@pytest.mark.benchmark(group="bootstrap CI, 200 tasks, 2000 rounds")
def test_bootstrap_python_loop_baseline(benchmark):
    """Baseline: the same bootstrap as a pure-Python loop."""
    benchmark.pedantic(_loop_bootstrap, args=(list(VALUES),), rounds=3, iterations=1)


def _outcomes(harnesses=3, tasks=42, samples=8):
    rng = random.Random(1)
    return [
        {
            "schema": "claw.outcome/v1",
            "session": f"s{h}-{t}-{k}",
            "task": f"t{t}",
            "harness": f"h{h}",
            "group": f"t{t}",
            "status": "ok",
            "passed": (ok := rng.random() < 0.4),
            "reward": float(ok),
            "sample": k,
        }
        for h in range(harnesses)
        for t in range(tasks)
        for k in range(samples)
    ]


@pytest.mark.benchmark(group="report")
def test_report_claw_mini_scale(benchmark):
    """A full report (k = 1, 8; CIs per harness and per task) over 3 harnesses x 42 tasks x 8 samples."""
    outs = _outcomes()
    rep = benchmark(report, outs, ks=[1, 8])
    assert len(rep["tasks"]) == 126
