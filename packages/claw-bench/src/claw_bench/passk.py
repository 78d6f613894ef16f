"""Pass@k: the unbiased estimator, a brute-force reference, and bootstrap confidence intervals."""

from __future__ import annotations

import itertools
import math

import numpy as np

from claw_bench.errors import ClawError


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@k of one task with ``n`` samples of which ``c`` passed.

    pass@k = 1 - C(n-c, k) / C(n, k)  (Chen et al. 2021, "Evaluating Large Language Models
    Trained on Code", eq. 1), computed as 1 - prod_{i=n-c+1..n} (1 - k/i) for stability.
    Needs 0 <= c <= n and 1 <= k <= n.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ClawError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_at_k_brute(results: list[bool], k: int) -> float:
    """Reference Pass@k: the fraction of all k-subsets of the samples holding at least one pass."""
    subsets = list(itertools.combinations(range(len(results)), k))
    return sum(any(results[i] for i in s) for s in subsets) / len(subsets)


def pass_at_k_table(n: int, k: int) -> np.ndarray:
    """pass_at_k(n, c, k) for c = 0..n as an array of shape (n+1,)."""
    return np.array([pass_at_k(n, c, k) for c in range(n + 1)])


def bootstrap_mean_ci(
    values: np.ndarray, *, rounds: int = 2000, confidence: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of ``values`` (shape (T,)), resampling entries."""
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, values.size, size=(rounds, values.size))  # (B, T)
    means = values[idx].mean(axis=1)  # (B,)
    alpha = (1.0 - confidence) / 2
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def bootstrap_task_ci(
    results: np.ndarray, k: int, *, rounds: int = 2000, confidence: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap CI of one task's Pass@k, resampling its n samples (shape (n,) of 0/1)."""
    results = np.asarray(results, dtype=int)
    n = results.size
    table = pass_at_k_table(n, k)  # (n+1,)
    rng = np.random.default_rng(seed)
    c_b = results[rng.integers(0, n, size=(rounds, n))].sum(axis=1)  # (B,)
    alpha = (1.0 - confidence) / 2
    lo, hi = np.quantile(table[c_b], [alpha, 1.0 - alpha])
    return float(lo), float(hi)
